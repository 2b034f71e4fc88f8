"""Cross-device feeding in the bench: every tensor an arm gets is on that arm's device.

On a GPU, parity and the bench's parity gate feed the first arm's stage outputs and
gradients to the next arm; a ``cuda`` arm after a CPU arm must get them on the GPU. Under
numba's simulator a ``cuda`` arm runs on CPU tensors, so a missing move would go unseen. This
file therefore gives the ``cuda`` arm a device of its own, "simulated CUDA": tensors that wrap
a CPU tensor but report the ``meta`` device (a ``__torch_dispatch__`` subclass). Every torch
op on them runs on the wrapped CPU tensors, and an op that mixes them with CPU tensors raises
as it would across real devices. The ``cuda`` backend's registered launchers are wrapped: each
asserts that every tensor argument is on simulated CUDA, then runs the real kernels (in the
simulator) on the unwrapped tensors and wraps the results.

Like ``test_cuda_sim.py``, the outer run re-runs this file in a subprocess with
``NUMBA_ENABLE_CUDASIM=1``. Scenes are tiny (the simulator runs every GPU thread as a Python
thread).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)

INNER = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if not INNER:

    def test_bench_devices_in_simulator():
        env = {k: v for k, v in os.environ.items() if not k.startswith("TILESPLAT_CUDA_")}
        env.update(NUMBA_ENABLE_CUDASIM="1", TILESPLAT_POISON="1")
        cmd = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:xdist",
               "-p", "no:cacheprovider"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
        assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]

else:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    from tilesplat.backends import registry
    from tilesplat.bench import Arm, run_bench, run_parity
    from tilesplat.bench import workload as workload_mod

    SIM = torch.device("meta")  # the device simulated-CUDA tensors report
    SCENE = "synthetic:12:16x8"
    TILE = 8

    class SimCuda(torch.Tensor):
        """A CPU tensor (``inner``) that reports the device ``SIM``."""

        inner: torch.Tensor

        @staticmethod
        def __new__(cls, inner: torch.Tensor) -> SimCuda:
            out = torch.Tensor._make_wrapper_subclass(
                cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(),
                dtype=inner.dtype, device=SIM, requires_grad=inner.requires_grad)
            out.inner = inner
            return out

        def __repr__(self) -> str:
            return f"SimCuda({self.inner!r})"

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return _run(func, args, kwargs or {})

    # ops that legitimately take tensors of two devices (a copy across devices)
    _CROSS_DEVICE_OK = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}

    def _run(func, args, kwargs):
        """Runs ``func`` on the wrapped CPU tensors; the result is on SIM when an input was
        (or when ``device`` asks for it)."""
        devices = set()
        wrappers: dict[int, SimCuda] = {}

        def unwrap(x):
            if isinstance(x, SimCuda):
                devices.add("sim")
                wrappers[id(x.inner)] = x
                return x.inner
            if isinstance(x, torch.Tensor) and x.device == SIM:  # e.g. torch.tensor(device=)
                raise RuntimeError(f"{func}: a tensor on {SIM} that is not simulated CUDA")
            if isinstance(x, torch.Tensor) and x.dim() > 0:  # 0-dim CPU scalars may mix
                devices.add(str(x.device))
            return x

        args, kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        if len(devices) > 1 and func not in _CROSS_DEVICE_OK:
            raise RuntimeError(f"{func}: expected all tensors on one device, got "
                               f"{sorted(devices)} ('sim' = the cuda arm's simulated CUDA)")
        to_sim = "sim" in devices
        if kwargs.get("device") is not None:
            to_sim = torch.device(kwargs["device"]).type == SIM.type
            if to_sim:
                kwargs["device"] = torch.device("cpu")
        out = func(*args, **kwargs)
        if not to_sim:
            return out
        # an in-place op returns its (wrapped) input, not a new wrapper
        return tree_map(lambda x: wrappers.get(id(x)) or SimCuda(x)
                        if isinstance(x, torch.Tensor) else x, out)

    class SimCudaMode(TorchDispatchMode):
        """Makes ``.to(SIM)`` and factories with ``device=SIM`` give simulated-CUDA tensors."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return _run(func, args, kwargs or {})

    def _guarded(op: str, fn, calls: list[str]):
        """``fn`` (a cuda launcher) behind a check that every tensor it gets is on SIM."""

        def launcher(*args, **kwargs):
            for i, x in enumerate([*args, *kwargs.values()]):
                if isinstance(x, torch.Tensor) and not isinstance(x, SimCuda):
                    raise AssertionError(
                        f"argument {i} of the cuda launcher {op} is on {x.device}, not on the "
                        "cuda arm's device (simulated CUDA)")
            calls.append(op)
            inner = lambda x: x.inner if isinstance(x, SimCuda) else x  # noqa: E731
            out = fn(*tree_map(inner, args), **tree_map(inner, kwargs))
            return tree_map(lambda x: SimCuda(x) if isinstance(x, torch.Tensor) else x, out)

        return launcher

    @pytest.fixture
    def simulated_cuda(monkeypatch):
        """The cuda arm on simulated CUDA; yields the list of cuda launchers called."""
        calls: list[str] = []
        registry.implemented_ops("cuda")  # imports the backend
        for (op, backend), impl in list(registry._impls.items()):
            if backend != "cuda":
                continue
            if isinstance(impl, registry.DiffOp):
                impl = registry.DiffOp(_guarded(op, impl.forward, calls),
                                       _guarded(op + ".backward", impl.backward, calls))
            else:
                impl = _guarded(op, impl, calls)
            monkeypatch.setitem(registry._impls, (op, backend), impl)
        monkeypatch.setattr(Arm, "torch_device", property(
            lambda arm: SIM if arm.backend == "cuda" else torch.device(arm.device)))
        # so that a cuda arm is accepted without a GPU, whatever the check
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "simulated CUDA")
        with SimCudaMode():
            yield calls

    STAGED = {"fully_fused_projection", "spherical_harmonics", "isect_tiles_tight",
              "isect_offset_encode", "rasterize_to_pixels", "rasterize_to_pixels.backward",
              "spherical_harmonics.backward", "fully_fused_projection.backward"}

    def test_the_guard_sees_a_cpu_tensor_at_a_cuda_launcher(simulated_cuda):
        import tilesplat

        ids = torch.zeros(0, dtype=torch.int64)
        with pytest.raises(AssertionError, match="not on the cuda arm's device"):
            tilesplat.isect_offset_encode(ids, 1, 2, 1, backend="cuda")
        with pytest.raises(RuntimeError, match="expected all tensors on one device"):
            ids.to(SIM) + torch.ones(1, dtype=torch.int64)
        out = tilesplat.isect_offset_encode(ids.to(SIM), 1, 2, 1, backend="cuda")
        assert out.device == SIM and out.cpu().tolist() == [[[0, 0]]]

    @pytest.mark.parametrize("first, second", [("torch", "cuda:per_pixel"),
                                               ("cuda:per_splat", "torch")])
    def test_parity_feeds_each_arm_on_its_device(simulated_cuda, first, second):
        res = run_parity(SCENE, first, second, sh_degree=1, tile_size=TILE)
        assert STAGED <= set(simulated_cuda)
        assert res["passed"], [r for r in res["tensors"] if not r["passed"]]

    def test_bench_gate_feeds_each_arm_on_its_device(simulated_cuda, monkeypatch):
        class NoStep:  # the training step feeds nothing across arms; not what this checks
            def __init__(self, *args) -> None:
                pass

            def __call__(self, timer) -> None:
                with timer.stage("step"):
                    pass

        monkeypatch.setattr(workload_mod, "TrainStep", NoStep)
        res = run_bench(SCENE, ["torch", "cuda:per_splat"], iters=1, repeats=1, sh_degree=1,
                        tile_size=TILE, calibrate=False)
        assert STAGED <= set(simulated_cuda)
        gate = res["arms"][1]["parity_gate"]
        assert gate["passed"] and res["parity_gate_passed"], gate

    # ---- the smoke test of scripts/gpu_check.py (its cheap cases; the rehearsal runs all) --

    def _cheap(name: str) -> bool:
        return "per_pixel" not in name and "256" not in name

    TINY = {"n": 6, "cameras": 1, "width": 8, "height": 8, "tile_size": 8, "warm": False}

    def test_smoke_test_passes_and_times_each_case():
        from tilesplat.bench.smoke import RASTER_CASES, format_smoke, run_smoke

        res = run_smoke(**TINY, only=_cheap)
        names = [r["case"] for r in res["cases"]]
        assert names == ["quat_scale_to_covar_preci", "fully_fused_projection",
                         "spherical_harmonics", "isect_tiles + isect_offset_encode",
                         "isect_tiles_tight + isect_offset_encode",
                         "rasterize_to_pixels per_splat, batch 32"]
        assert len(RASTER_CASES) == 4 and res["device"] == "cpu"  # the simulator's
        assert res["passed"], format_smoke(res)
        for row in res["cases"]:
            assert row["status"] == "ok" and row["first_call_s"] > 0 and row["n_fail"] == 0
            assert all(t["numel_a"] > 0 for t in row["tensors"]), row
        raster = {t["name"]: t for t in res["cases"][-1]["tensors"]}
        assert set(raster) == {"render_colors", "render_alphas", "last_ids", "v_means2d",
                               "v_conics", "v_colors", "v_opacities", "v_backgrounds"}
        assert "SMOKE PASS" in format_smoke(res)

    def test_smoke_test_counts_a_wrong_kernel_and_goes_on_after_an_error(monkeypatch):
        from tilesplat.bench.smoke import format_smoke, run_smoke

        real = registry._impls[("quat_scale_to_covar_preci", "cuda")]

        def wrong_forward(*args):
            covars, precis = real.forward(*args)
            covars = covars.clone()
            covars.view(-1)[:5] += 1e-2
            return covars, precis

        def broken_forward(*args):
            raise RuntimeError("too many resources requested for launch")

        monkeypatch.setitem(registry._impls, ("quat_scale_to_covar_preci", "cuda"),
                            registry.DiffOp(wrong_forward, real.backward))
        monkeypatch.setitem(registry._impls, ("spherical_harmonics", "cuda"),
                            registry.DiffOp(broken_forward, broken_forward))
        res = run_smoke(**TINY, only=lambda name: "rasterize" not in name)
        rows = {r["case"]: r for r in res["cases"]}
        assert not res["passed"]
        covar = rows["quat_scale_to_covar_preci"]
        assert covar["status"] == "MISMATCH covars 5/54"
        assert rows["spherical_harmonics"]["status"] == (
            "error: RuntimeError: too many resources requested for launch")
        assert rows["fully_fused_projection"]["status"] == "ok"  # the others still ran
        assert rows["isect_tiles + isect_offset_encode"]["status"] == "ok"
        assert rows["isect_tiles_tight + isect_offset_encode"]["status"] == "ok"
        assert "SMOKE FAIL" in format_smoke(res)

    def test_bench_counts_the_launches_of_a_cuda_step():
        from tilesplat.bench import format_bench

        res = run_bench(SCENE, ["torch", "cuda:per_splat"], iters=1, repeats=1, sh_degree=1,
                        tile_size=TILE, calibrate=False)
        torch_arm, cuda_arm = res["arms"]
        assert torch_arm["cuda_launches"] is None
        n = cuda_arm["cuda_launches"]
        # projection, SH, isect count + fill, offsets, raster; raster, SH, projection backward
        assert n["steps"] == 1 and n["launches"] == 9 and n["launcher_calls"] == 8, n
        assert n["host_ms"]["median"] > 0 and n["kernel_call_ms"]["median"] > 0
        assert res["parity_gate_passed"], cuda_arm["parity_gate"]["summary"]
        text = format_bench(res)
        assert "step kernel launches" in text and "step launcher Python ms" in text
