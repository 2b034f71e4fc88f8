"""Host cost of one ``cuda`` kernel launch: the thin path (``backends/cuda/thin_launch.py``)
against numba's ``kernel[grid, block, stream](*args)``, and parity of the two paths.

Two measurements, both on the raster backward's per-pixel kernel (28 arguments, 18 of them
arrays: the launch of a training step with the most arrays):

- :func:`host_packing` needs no GPU. The thin arm is the whole thin launch through
  ``runtime.launch`` (the hook, the plan lookup, the packing into the parameter buffer, the
  stream lookup) with the driver replaced by a call that returns at once, on CPU tensors.
  The numba arm is what ``runtime.launch`` and numba-cuda 0.30's ``_Kernel.launch`` do per
  argument before they reach the driver: the view-cache lookup of ``runtime.view`` and
  ``_Kernel._prepare_args`` (called unbound, on numba device arrays over fake memory). It
  leaves out numba's C typing, the context push and pop, the LaunchConfig and cuda.core's
  launch, so it is a lower bound of numba's cost.
- :func:`device_launches` needs a GPU: µs per launch of 1,000 launches of the kernel of a
  real training step's backward (a small scene, so that each kernel is shorter than a launch
  and the loop times the host), thin path against ``kernel[...]`` (host time of the loop,
  and wall time with the GPU's work), and every output and gradient of a forward + backward
  of ``rasterization()`` (on ``parity_scene``) through both paths: bitwise equal with
  ``deterministic`` on, within the cuda parity allowance (1e-4) without it.

Command (no GPU): ``PYTHONPATH=src python -m tilesplat.bench.launch_cost``; on a GPU
``scripts/gpu_check.py`` runs :func:`device_launches`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..constants import TILE_SIZE

KERNEL = "rasterize_bwd_per_pixel"


def _catalogue_args(argtypes: tuple, device: Any, seed: int = 0) -> list:
    """Arguments of the per-pixel backward's types, shaped like a 2-image 64x48 render of
    500 Gaussians with 3,000 intersections."""
    from numba.core import types as nt

    g = torch.Generator().manual_seed(seed)
    dtypes = {nt.float32: torch.float32, nt.float64: torch.float64, nt.int32: torch.int32,
              nt.int64: torch.int64, nt.boolean: torch.bool}
    shapes = {1: (3000,), 2: (500, 3), 3: (2, 3, 4), 4: (2, 48, 64, 3)}
    out: list = []
    for ty in argtypes:
        if isinstance(ty, nt.Array):
            out.append(torch.zeros(shapes[ty.ndim], dtype=dtypes[ty.dtype], device=device))
        elif ty == nt.boolean:
            out.append(bool(torch.randint(0, 2, (1,), generator=g)))
        elif ty == nt.int64:
            out.append(int(torch.randint(0, 1000, (1,), generator=g)))
        else:
            out.append(float(torch.rand(1, generator=g)))
    return out


def _spec(name: str = KERNEL):
    from ..backends.cuda import kernels

    return next(s for s in kernels.KERNELS if s.name == name)


def _median_us(fn: Callable[[], None], n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


class _NullDriver:
    """A driver whose cuLaunchKernel returns success at once (the host benchmark)."""

    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_CONTEXT=201)

    @staticmethod
    def CUstream(raw: int) -> int:  # noqa: N802 - the driver's name
        return raw

    @staticmethod
    def cuLaunchKernel(*args: Any) -> tuple[int]:  # noqa: N802
        return (0,)


def _entry_text(params: tuple) -> str:
    """A PTX ``.entry`` declaring ``params`` (what the null backend's "compiler" returns)."""
    kinds = {"f": "f32", "d": "f64", "?": "u8"}
    decls = ",".join(f".param .{kinds.get(p.code, f'u{p.size * 8}')} k_param_{i}"
                     for i, p in enumerate(params))
    return f".visible .entry k({decls})"


def host_packing(n: int = 2000, repeats: int = 5) -> dict[str, Any]:
    """µs per launch on the host, thin path vs numba's argument preparation (see the
    module docstring); runs without a GPU."""
    from numba import cuda
    from numba.core import types as nt
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.dispatcher import _Kernel

    from ..backends.cuda import ptx_abi, runtime, thin_launch

    spec = _spec()
    argtypes = spec.args(nt.float32)
    args = _catalogue_args(argtypes, "cpu")
    kernel = cuda.jit(spec.body(np.float32))
    fake_device = types.SimpleNamespace(type="cuda", index=-1)  # CPU tensors: get_device -1

    def compile_(k: Any, sig: tuple, index: int) -> Any:
        return thin_launch.Compiled(None, _entry_text(ptx_abi.layout(sig)))

    backend = thin_launch.Backend(_NullDriver(), lambda: -1, lambda index: 0, compile_)
    grid, block = (4, 3, 2), (16, 16)

    class _Memory:  # what a numba device array needs of its memory: a pointer
        def __init__(self, ptr: int) -> None:
            self.device_ctypes_pointer = ctypes.c_void_p(ptr)

    views: dict[tuple, Any] = {}
    for a in args:
        if isinstance(a, torch.Tensor):
            key = (a.data_ptr(), a.shape, a.stride(), a.dtype, -1)
            views[key] = DeviceNDArray(tuple(a.shape), tuple(s * a.element_size()
                                                             for s in a.stride()),
                                       np.dtype(str(a.dtype).removeprefix("torch.")),
                                       gpu_data=_Memory(a.data_ptr() or 8))
    stub = types.SimpleNamespace(extensions=[])
    prepare = _Kernel._prepare_args
    pairs = list(zip(argtypes, args, strict=True))

    def numba_args() -> None:
        retr: list = []
        kernelargs: list = []
        for ty, a in pairs:
            if isinstance(a, torch.Tensor):  # runtime.view: its cache lookup
                a = views[(a.data_ptr(), a.shape, a.stride(), a.dtype, -1)]
            prepare(stub, ty, a, 0, retr, kernelargs)

    def thin() -> None:
        runtime.launch(kernel, grid, block, fake_device, *args)

    saved_sim, saved_on = runtime.SIMULATOR, thin_launch._enabled[0]
    runtime.SIMULATOR = False
    thin_launch.set_enabled(True)
    times: dict[str, list[float]] = {"thin": [], "numba": []}
    try:
        with thin_launch.installed(backend):
            thin()
            assert isinstance(thin_launch.plans_of(kernel), list), "the thin path took it"
            numba_args()
            for _ in range(repeats):  # alternately: a busy machine slows both alike
                times["thin"].append(_median_us(thin, n, 1))
                times["numba"].append(_median_us(numba_args, n, 1))
    finally:
        runtime.SIMULATOR = saved_sim
        thin_launch._enabled[0] = saved_on
    thin_us, numba_us = (statistics.median(times[k]) for k in ("thin", "numba"))
    n_arrays = sum(isinstance(a, torch.Tensor) for a in args)
    return {"kernel": spec.name, "arguments": len(args), "arrays": n_arrays,
            "launches": n, "repeats": repeats,
            "thin_us_per_launch": thin_us, "numba_prepare_args_us_per_launch": numba_us,
            "thin_us_min": min(times["thin"]), "numba_us_min": min(times["numba"]),
            "numba_over_thin": numba_us / thin_us if thin_us else None,
            "ratios": [b / a for a, b in zip(times["thin"], times["numba"], strict=True)]}


# ---- on a GPU -----------------------------------------------------------------------------


def _render(scene: Any, device: torch.device, seed: int,
            tile_size: int = TILE_SIZE) -> tuple[list, list]:
    """Outputs and gradients of one rasterization() forward + backward (per_pixel)."""
    import tilesplat

    leaves = [t.detach().clone().to(device).requires_grad_(True)
              for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.colors)]
    colors, alphas, _ = tilesplat.rasterization(
        *leaves, scene.viewmats.to(device), scene.Ks.to(device), scene.width, scene.height,
        tile_size=tile_size, backend="cuda", backward_scheme="per_pixel")
    g = torch.Generator().manual_seed(seed)
    loss = ((colors * torch.randn(colors.shape, generator=g).to(device)).sum()
            + (alphas * torch.randn(alphas.shape, generator=g).to(device)).sum())
    grads = torch.autograd.grad(loss, leaves)
    return [colors.detach(), alphas.detach()], list(grads)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_launches(scene: str = "synthetic:5000:128x128", n: int = 1000,
                    repeats: int = 3, parity_scene: str | None = None,
                    tile_size: int = TILE_SIZE) -> dict[str, Any]:
    """µs per launch of ``n`` raster-backward launches through each path, and parity of a
    forward + backward through each (see the module docstring). Under numba's simulator it
    only rehearses this code: the thin path does not run there."""
    from ..backends.cuda import get_options, reset_options, runtime, set_options, thin_launch
    from ..backends.cuda import rasterize as raster_launchers
    from ..backends.registry import cuda_simulator
    from ..data.scenes import load_scene

    sim = cuda_simulator()
    device = torch.device("cpu" if sim else "cuda")
    sc = load_scene(scene)
    captured: list[tuple] = []

    def capture(kernel: Any, grid: Any, block: Any, dev: Any, *args: Any) -> None:
        if getattr(getattr(kernel, "py_func", None), "__name__", "") == KERNEL:
            captured.append((kernel, grid, block, dev, args))
        runtime.launch(kernel, grid, block, dev, *args)

    raster_launchers.launch = capture  # the launchers' name for runtime.launch
    try:
        _render(sc, device, 0, tile_size)  # compiles every kernel; keeps the backward's launch
    finally:
        raster_launchers.launch = runtime.launch
    if not captured:
        raise RuntimeError(f"no {KERNEL} launch seen in a forward + backward")
    kernel, grid, block, dev, args = captured[-1]
    warmup = min(10, n)

    def loop(thin: bool) -> tuple[float, float]:
        thin_launch.set_enabled(thin)
        for _ in range(warmup):
            runtime.launch(kernel, grid, block, dev, *args)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            runtime.launch(kernel, grid, block, dev, *args)
        t1 = time.perf_counter()
        _sync(device)
        t2 = time.perf_counter()
        return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6

    saved, options = thin_launch._enabled[0], get_options()
    runs: dict[str, list] = {"thin": [], "numba": []}
    try:
        for _ in range(repeats):  # alternately, so that drift hits both
            runs["thin"].append(loop(True))
            runs["numba"].append(loop(False))
        thin_taken = isinstance(thin_launch.plans_of(kernel), list)
        parity = {}
        for det in (True, False):
            set_options(deterministic=det)
            results = {}
            for thin in (True, False):
                thin_launch.set_enabled(thin)
                results[thin] = _render(load_scene(parity_scene or scene), device, 1,
                                        tile_size)
            parity["deterministic" if det else "default"] = _compare(results[True],
                                                                     results[False], det)
    finally:
        thin_launch._enabled[0] = saved
        reset_options()
        set_options(**options)
    med = {k: (statistics.median(v[0] for v in r), statistics.median(v[1] for v in r))
           for k, r in runs.items()}
    return {"scene": scene, "parity_scene": parity_scene or scene, "kernel": KERNEL,
            "tile_size": tile_size,
            "arguments": len(args), "grid": grid, "block": block, "launches": n,
            "repeats": repeats, "simulator": sim, "thin_taken": thin_taken,
            "refused": None if thin_taken else thin_launch.plans_of(kernel),
            "thin_host_us": med["thin"][0], "thin_wall_us": med["thin"][1],
            "numba_host_us": med["numba"][0], "numba_wall_us": med["numba"][1],
            "parity": parity,
            "passed": all(p["passed"] for p in parity.values()) and (thin_taken or sim)}


def _compare(thin: tuple[list, list], numba: tuple[list, list], bitwise: bool) -> dict:
    names = ["render_colors", "render_alphas", "v_means", "v_quats", "v_scales",
             "v_opacities", "v_colors"]
    rows = []
    for name, a, b in zip(names, [*thin[0], *thin[1]], [*numba[0], *numba[1]], strict=True):
        diff = (a.double() - b.double()).abs()
        max_abs = float(diff.max()) if diff.numel() else 0.0
        if bitwise:
            ok = bool(torch.equal(a, b))
        else:
            ok = bool(torch.all(diff <= 1e-4 + 1e-4 * b.double().abs()))
        rows.append({"name": name, "passed": ok, "max_abs": max_abs})
    return {"rule": "bitwise equal" if bitwise else "abs 1e-4 + rel 1e-4",
            "passed": all(r["passed"] for r in rows), "tensors": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="µs per launch: thin path vs numba's "
                                     "argument preparation, on the host (no GPU)")
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    res = host_packing(args.launches, args.repeats)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
