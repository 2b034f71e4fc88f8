"""A short smoke test of every ``cuda`` kernel: each op forward and backward once through the
public API with ``backend="cuda"``, against the ``torch`` reference, on a tiny scene.

It is the first step of ``scripts/gpu_check.py``: a kernel that does not compile, does not
load (too many registers or too much shared memory), or computes nonsense shows up in seconds,
before any long step. Cases (each one forward and backward unless said):

- ``quat_scale_to_covar_preci`` (covariance and precision);
- ``fully_fused_projection`` (pinhole, compensations, opacity-aware radii);
- ``spherical_harmonics`` (degree 3, masks);
- ``isect_tiles`` + ``isect_offset_encode``, and ``isect_tiles_tight`` + the same (forward
  only: integer outputs);
- ``rasterize_to_pixels`` with backgrounds and absgrad: ``per_pixel`` with the warp skip on
  and off, ``per_splat`` with batches of 32 and 256.

The reference runs on CPU float32 copies of the same inputs. Outputs and gradients are
compared with :func:`.tolerance.compare` (an element fails when abs > 1e-4 and rel > 1e-4, the
gradients' tolerance of DESIGN.md; on a GPU a tensor may have the few failing elements of the
cross-device policy of :mod:`.tolerance`; the intersection lists must match exactly) and
reported in counts. Each case is timed on its first call (compilation included) and, when
``warm`` is set, on a second call.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..constants import BACKWARD_SCHEMES, TILE_SIZE
from ..devices import to_device
from .arms import parse_arm
from .tolerance import ATOL, RTOL, allowed_failures, compare, compare_radii

# (case name, backward scheme, cuda options) of the rasterizer cases
RASTER_CASES = (
    ("per_pixel, warp skip on", "per_pixel", {"warp_skip": True}),
    ("per_pixel, warp skip off", "per_pixel", {"warp_skip": False}),
    ("per_splat, batch 32", "per_splat", {"splat_batch": 32}),
    ("per_splat, batch 256", "per_splat", {"splat_batch": 256}),
)
assert {c[1] for c in RASTER_CASES} == set(BACKWARD_SCHEMES)


def _scene(n: int, cameras: int, width: int, height: int, tile_size: int,
           seed: int) -> dict[str, Any]:
    """Tiny random inputs of every op (CPU, float32)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.rand(shape, generator=g)  # noqa: E731
    viewmats = torch.eye(4).repeat(cameras, 1, 1)
    viewmats[:, 2, 3] = 4.0  # the cameras look at the origin from z = -4
    viewmats[:, 0, 3] = torch.linspace(-0.3, 0.3, cameras)
    f = 1.2 * max(width, height)
    Ks = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1.0]]).repeat(cameras, 1, 1)
    # splats for the rasterizer: conics of a few pixels, one opacity near 1 (alpha clamps)
    a, c = rand(cameras, n) * 0.25 + 0.04, rand(cameras, n) * 0.25 + 0.04
    b = (rand(cameras, n) - 0.5) * 0.5 * torch.sqrt(a * c)
    opacities2d = rand(cameras, n) * 0.9 + 0.1
    opacities2d[0, 0] = 1.0
    return {
        "means": (rand(n, 3) * 2 - 1) * 0.8,
        "quats": torch.randn((n, 4), generator=g),
        "scales": rand(n, 3) * 0.15 + 0.02,
        "opacities": rand(n) * 0.8 + 0.1,
        "viewmats": viewmats,
        "Ks": Ks,
        "dirs": torch.randn((cameras * n, 3), generator=g),
        "sh_coeffs": torch.randn((cameras * n, 16, 3), generator=g) * 0.5,
        "sh_masks": rand(cameras * n) > 0.2,
        "means2d": rand(cameras, n, 2) * torch.tensor([width, height]) * 1.2 - 1,
        "conics": torch.stack([a, b, c], -1),
        "colors": rand(cameras, n, 3),
        "opacities2d": opacities2d,
        "depths": rand(cameras, n) + 1,
        "radii": torch.full((cameras, n, 2), max(2, tile_size // 2), dtype=torch.int32),
        "backgrounds": rand(cameras, 3),
        "width": width, "height": height, "tile_size": tile_size,
        "tiles": (math.ceil(width / tile_size), math.ceil(height / tile_size)),
    }


def _forward_backward(fn: Callable[..., tuple], inputs: list[Tensor | None],
                      upstream_seed: int) -> tuple[list[Tensor], list[Tensor]]:
    """Outputs of ``fn(*leaves)`` and the gradients of the floating inputs under a random
    linear loss of the floating outputs (the same loss for both backends)."""
    leaves = [None if t is None else
              t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    outs = [o for o in fn(*leaves) if o is not None]
    g = torch.Generator().manual_seed(upstream_seed)
    floats = [o for o in outs if o.is_floating_point() and o.requires_grad]
    grads: list[Tensor] = []
    used = [t for t in leaves if t is not None and t.requires_grad]
    if floats and used:
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device)).sum()
                   for o in floats)
        got = torch.autograd.grad(loss, used, allow_unused=True)
        grads = [torch.zeros_like(t) if v is None else v for t, v in zip(used, got, strict=True)]
    return [o.detach() for o in outs], grads


def _cases(s: dict[str, Any]) -> list[tuple[str, dict[str, Any], Callable, list, list[str]]]:
    """(name, cuda options, fn(*inputs, backend=), inputs, names of outputs then grads)."""
    import tilesplat

    from ..ops import isect_tiles_tight  # tilesplat's own op: not in gsplat's namespace

    W, H, ts = s["width"], s["height"], s["tile_size"]
    tw, th = s["tiles"]
    cams = s["viewmats"].shape[0]
    isect = tilesplat.isect_tiles(s["means2d"], s["radii"], s["depths"], ts, tw, th,
                                  backend="torch")
    offsets = tilesplat.isect_offset_encode(isect[1], cams, tw, th, backend="torch")
    flatten_ids = isect[2]

    def covar(q, sc, backend):
        return tilesplat.quat_scale_to_covar_preci(q, sc, backend=backend)

    def project(m, q, sc, v, k, o, backend):
        return tilesplat.fully_fused_projection(
            m, None, q, sc, v, k, W, H, calc_compensations=True, opacities=o, backend=backend)

    def sh(d, co, mk, backend):
        return (tilesplat.spherical_harmonics(3, d, co, masks=mk, backend=backend),)

    def intersect(m2, r, d, backend):
        tiles, ids, flat = tilesplat.isect_tiles(m2, r, d, ts, tw, th, backend=backend)
        return tiles, ids, flat, tilesplat.isect_offset_encode(ids, cams, tw, th,
                                                                backend=backend)

    def intersect_tight(m2, r, d, co, op, backend):
        tiles, ids, flat = isect_tiles_tight(m2, r, d, co, op, ts, tw, th, W, H,
                                             backend=backend)
        return tiles, ids, flat, tilesplat.isect_offset_encode(ids, cams, tw, th,
                                                                backend=backend)

    cases = [
        ("quat_scale_to_covar_preci", {}, covar, [s["quats"], s["scales"]],
         ["covars", "precis", "v_quats", "v_scales"]),
        ("fully_fused_projection", {}, project,
         [s["means"], s["quats"], s["scales"], s["viewmats"], s["Ks"], s["opacities"]],
         ["radii", "means2d", "depths", "conics", "compensations", "v_means", "v_quats",
          "v_scales", "v_viewmats", "v_Ks", "v_opacities"]),
        ("spherical_harmonics", {}, sh, [s["dirs"], s["sh_coeffs"], s["sh_masks"]],
         ["colors", "v_dirs", "v_coeffs"]),
        ("isect_tiles + isect_offset_encode", {}, intersect,
         [s["means2d"].detach(), s["radii"], s["depths"]],
         ["tiles_per_gauss", "isect_ids", "flatten_ids", "isect_offsets"]),
        ("isect_tiles_tight + isect_offset_encode", {}, intersect_tight,
         [s["means2d"].detach(), s["radii"], s["depths"], s["conics"], s["opacities2d"]],
         ["tiles_per_gauss", "isect_ids", "flatten_ids", "isect_offsets"]),
    ]
    for title, scheme, options in RASTER_CASES:
        # the intersection tensors are inputs, so that they travel to the case's device
        def raster(m2, co, cl, op, bg, off, flat, backend, scheme=scheme):
            return tilesplat.rasterize_to_pixels(
                m2, co, cl, op, W, H, ts, off, flat, backgrounds=bg, absgrad=True,
                backward_scheme=scheme, return_last_ids=True, backend=backend)

        cases.append((f"rasterize_to_pixels {title}", options, raster,
                      [s["means2d"], s["conics"], s["colors"], s["opacities2d"],
                       s["backgrounds"], offsets, flatten_ids],
                      ["render_colors", "render_alphas", "last_ids", "v_means2d", "v_conics",
                       "v_colors", "v_opacities", "v_backgrounds"]))
    return cases


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(name: str, options: dict[str, Any], fn: Callable, inputs: list,
             names: list[str], device: torch.device, warm: bool,
             seed: int = 1) -> dict[str, Any]:
    """One case: the reference on the CPU, then the cuda backend on ``device`` (timed), and
    a row per output and gradient (:func:`.tolerance.compare` counts)."""
    from ..backends.cuda import reset_options, set_options

    row: dict[str, Any] = {"case": name, "options": options}
    try:
        ref_out, ref_grads = _forward_backward(lambda *x: fn(*x, backend="torch"), inputs,
                                               seed)
        on_device = to_device(inputs, device)
        reset_options()
        set_options(**options)
        try:
            times = []
            for _ in range(2 if warm else 1):
                _sync(device)
                t0 = time.perf_counter()
                out, grads = _forward_backward(lambda *x: fn(*x, backend="cuda"), on_device,
                                               seed)
                _sync(device)
                times.append(time.perf_counter() - t0)
        finally:
            reset_options()
        row["first_call_s"] = times[0]
        row["warm_call_s"] = times[1] if warm else None
        across = device.type != "cpu"  # the reference runs on the CPU
        tensors = []
        for tname, a, b in zip(names, [*ref_out, *ref_grads], [*out, *grads], strict=True):
            # decisions on float values may flip across devices (.tolerance's policy); the
            # intersection lists come from identical inputs and must match exactly
            floating = a.is_floating_point() or tname in ("radii", "last_ids")
            allowed = allowed_failures(tname, a.numel(), across) if floating else 0
            if tname == "radii":
                r = compare_radii(a, b, allowed)
            elif floating:
                r = compare(a, b, ATOL, RTOL, allowed)
            else:
                r = compare(a, b, 0.0, 0.0)
            keep = ("n_fail", "numel_a", "allowed", "max_abs", "max_rel", "passed", "note")
            tensors.append({"name": tname, **{k: r[k] for k in keep if k in r}})
        row["tensors"] = tensors
        row["n_fail"] = sum(t.get("n_fail") or 0 for t in tensors)
        row["passed"] = all(t["passed"] for t in tensors)
        row["status"] = ("ok" + (f" ({row['n_fail']} failing elements, within the allowance)"
                                 if row["n_fail"] else "")) if row["passed"] else (
            "MISMATCH " + ", ".join(f"{t['name']} {t.get('n_fail')}/{t['numel_a']}"
                                    for t in tensors if not t["passed"]))
    except Exception as exc:  # one broken kernel must not hide the others
        row.update(passed=False, status=f"error: {type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc())
    return row


def run_smoke(n: int = 40, cameras: int = 2, width: int = 48, height: int = 32,
              tile_size: int = TILE_SIZE, warm: bool = True, seed: int = 0,
              only: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Every case once (see the module docstring) on the ``cuda`` backend's device (the GPU;
    the CPU under numba's simulator). ``only``: run the cases whose name it accepts.

    Returns:
        dict with ``kind`` "smoke", ``device``, ``scene``, ``cases`` (rows of
        :func:`run_case`: ``status``, ``first_call_s``, ``warm_call_s``, ``tensors`` with
        counts), ``seconds`` and ``passed``.
    """
    device = parse_arm("cuda").torch_device
    t0 = time.perf_counter()
    s = _scene(n, cameras, width, height, tile_size, seed)
    rows = [run_case(name, options, fn, inputs, names, device, warm)
            for name, options, fn, inputs, names in _cases(s)
            if only is None or only(name)]
    return {"kind": "smoke", "device": str(device),
            "scene": {"gaussians": n, "cameras": cameras, "width": width, "height": height,
                      "tile_size": tile_size},
            "cases": rows, "seconds": time.perf_counter() - t0,
            "passed": bool(rows) and all(r["passed"] for r in rows)}


def format_smoke(res: dict[str, Any]) -> str:
    """One line per case: status, first-call and warm-call times."""
    sc = res["scene"]
    lines = [f"smoke test of every cuda kernel on {res['device']}: {sc['gaussians']} Gaussians, "
             f"{sc['cameras']} camera(s) {sc['width']}x{sc['height']}, tile {sc['tile_size']}; "
             f"{res['seconds']:.1f} s"]
    for r in res["cases"]:
        first = r.get("first_call_s")
        warm = r.get("warm_call_s")
        t = "" if first is None else f"  first call {first:.2f} s" + (
            "" if warm is None else f", warm {warm * 1e3:.1f} ms")
        lines.append(f"  {r['case']:<42} {r['status'].splitlines()[0][:160]}{t}")
    lines.append("SMOKE " + ("PASS" if res["passed"] else "FAIL"))
    return "\n".join(lines)
