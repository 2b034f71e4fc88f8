"""Intersection lists at a capacity (issue 21): the render equals the exact one, an overflow is
flagged on the device, the trainer grows the capacity and redoes the skipped steps so that the
run equals the exact run bit for bit, and on ``cuda`` two batches with different counts
allocate the same shapes.

The torch reference follows the capacity contract too (``backends/torch/intersect.py``), so
the trainer's redo logic runs here on the CPU in float32, where it is deterministic; the
``cuda`` kernels' layout and the static shapes run in numba's simulator (its own process).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tilesplat
from tilesplat.ops.deferred_checks import FiniteFlag, deferred_finite_checks
from tilesplat.ops.intersect_capacity import (
    OVERFLOW,
    IntersectionCounts,
    IsectCapacity,
    counting_intersections,
    intersection_capacity,
)

INNER = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
W, H = 23, 17


def _scene(backend: str, seed: int = 0, n: int = 40):
    from helpers import cameras, random_gaussians

    means, quats, scales, opacities, colors = random_gaussians(n, seed=seed)
    viewmats, Ks = cameras(2, W, H)
    tensors = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities, colors)]
    return tensors, viewmats, Ks


def _render(tensors, viewmats, Ks, backend, capacity=None, flag=None, **kw):
    ctx = deferred_finite_checks(flag) if flag is not None else _null()
    with ctx, intersection_capacity(capacity):
        colors, alphas, meta = tilesplat.rasterization(
            *tensors, viewmats, Ks, W, H, tile_size=4, backend=backend,
            backgrounds=torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.5, 1.0]]), **kw)
    loss = (colors * torch.linspace(0.5, 1.5, 3)).sum() + alphas.square().sum()
    grads = torch.autograd.grad(loss, tensors)
    return colors.detach(), alphas.detach(), grads, meta


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _exact_count(meta) -> int:
    return int(meta["tiles_per_gauss"].sum())


def _same_render(a, b, exact: bool) -> None:
    colors_a, alphas_a, grads_a, _ = a
    colors_b, alphas_b, grads_b, _ = b
    assert torch.equal(colors_a, colors_b) and torch.equal(alphas_a, alphas_b)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        if exact:
            assert torch.equal(ga, gb)
        else:  # float atomics sum in any order
            torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)


def _check_capacity_render(backend: str, exact_grads: bool, spares: tuple[int, ...]) -> None:
    tensors, viewmats, Ks = _scene(backend)
    exact = _render(tensors, viewmats, Ks, backend)
    n = _exact_count(exact[3])
    assert n > 20
    for size in (n + k for k in spares):  # full, one unused slot, mostly unused
        cap = IsectCapacity(size)
        flag = FiniteFlag()
        got = _render(tensors, viewmats, Ks, backend, cap, flag)
        assert got[3]["isect_ids"].shape == (size,)
        assert int((got[3]["isect_ids"] < 0).sum()) == size - n  # the unused slots, first
        _same_render(exact, got, exact_grads)
        assert flag.bad_names() == [] and cap.largest_count() == n
    # too small: flagged on the device, and the count it needs is known
    cap, flag = IsectCapacity(n // 2), FiniteFlag()
    _render(tensors, viewmats, Ks, backend, cap, flag)
    assert flag.bad_names() == [OVERFLOW] and cap.largest_count() == n
    assert float(flag.found_inf(torch.device("cpu"))) == 1.0
    # nothing in view: every slot unused, every tile empty
    far = [t.detach().clone().requires_grad_(True) for t in tensors]
    with torch.no_grad():
        far[0][:, 2] -= 100.0  # behind the cameras
    empty = _render(far, viewmats, Ks, backend, IsectCapacity(7))
    assert torch.equal(empty[0], _render(far, viewmats, Ks, backend)[0])
    assert bool((empty[3]["isect_offsets"] == 7).all())


def _check_counting(backend: str) -> None:
    tensors, viewmats, Ks = _scene(backend, seed=3)
    with torch.no_grad():
        meta = tilesplat.rasterization(*tensors, viewmats, Ks, W, H, tile_size=4,
                                       backend=backend)[2]
    per_image = meta["tiles_per_gauss"].reshape(2, -1).sum(-1)
    with torch.no_grad(), counting_intersections(), pytest.raises(IntersectionCounts) as taken:
        tilesplat.rasterization(*tensors, viewmats, Ks, W, H, tile_size=4, backend=backend)
    assert torch.equal(taken.value.counts, per_image.to(torch.int64))


if not INNER:

    def test_a_render_at_a_capacity_equals_the_exact_one():
        _check_capacity_render("torch", exact_grads=True, spares=(0, 1, 300))

    def test_counting_stops_the_render_with_the_count_of_each_image():
        _check_counting("torch")
        _check_counting("cpu")  # a backend without capacity counts from its exact lists

    def test_direct_calls_keep_exact_sizes():
        tensors, viewmats, Ks = _scene("torch")
        meta = _render(tensors, viewmats, Ks, "torch")[3]
        assert meta["isect_ids"].shape == (_exact_count(meta),)
        assert bool((meta["isect_ids"] >= 0).all())

    @pytest.mark.parametrize("backend", ["torch", "cpu"])
    def test_the_public_offsets_op_takes_lists_at_a_capacity(backend):
        """A direct ``isect_offset_encode`` call (validated; 2DGS's pipeline calls it so) of
        lists with unused slots: the offsets of the exact lists, shifted past the slots."""
        from tilesplat.backends.torch.intersect import isect_tiles as reference

        tensors, viewmats, Ks = _scene("torch")
        meta = _render(tensors, viewmats, Ks, "torch")[3]
        exact = tilesplat.isect_offset_encode(meta["isect_ids"], 2, meta["tile_width"],
                                              meta["tile_height"], backend=backend)
        n = meta["isect_ids"].numel()
        keys = torch.cat([torch.full((5,), -1, dtype=torch.int64), meta["isect_ids"]])
        shifted = tilesplat.isect_offset_encode(keys, 2, meta["tile_width"],
                                                meta["tile_height"], backend=backend)
        assert torch.equal(shifted, exact + 5)
        assert reference.takes_capacity and n > 0
        bad = keys.clone()
        bad[0] = -2
        with pytest.raises(ValueError, match="negative keys other than -1"):
            tilesplat.isect_offset_encode(bad, 2, meta["tile_width"], meta["tile_height"],
                                          backend=backend)

    def test_a_capacity_must_be_positive():
        for bad in (0, -3, 2.5, True):
            with pytest.raises(ValueError, match="capacity must be a positive int"):
                IsectCapacity(bad)

    # --- the trainer ---------------------------------------------------------------------

    def _trainer(tmp_path, name: str, headroom: float | None, **keys):
        from tilesplat.data.dataset import load_dataset
        from tilesplat.data.synthetic import write_synthetic_dataset
        from tilesplat.train.config import TrainConfig
        from tilesplat.train.loop.trainer import Trainer
        from tilesplat.train.step.capacity import StepCapacity

        folder = tmp_path / "scene"
        if not folder.exists():
            write_synthetic_dataset(folder, n_train=3, n_test=1, size=16)
        cfg = TrainConfig(**{"steps": 12, "batch_size": 2, "init_points": 60, "sh_degree": 1,
                             "refine_start": 3, "refine_every": 4, "refine_stop": 11,
                             "reset_every": 9, "log_every": 1000, "progress": False,
                             "lpips": False, "backend": "torch", "checkpoint_every": 0,
                             "eval_every": 0, "seed": 4, "random_background": True, **keys})
        trainer = Trainer(cfg, load_dataset(folder), tmp_path / name, log=lambda s: None)
        assert trainer.steps.capacity is None  # capacity mode is the cuda backend's
        if headroom is not None:  # the torch reference follows the same contract
            trainer.steps.capacity = StepCapacity(trainer.count_views, cfg.batch_size,
                                            trainer.device, headroom=headroom)
        return trainer

    @pytest.mark.usefixtures("one_torch_thread")
    @pytest.mark.parametrize("headroom", [0.6, 1.15])
    def test_overflowing_steps_are_redone_and_the_run_equals_the_exact_one(tmp_path, headroom):
        runs = []
        for name, room in (("exact", None), ("capacity", headroom)):  # one after the other:
            trainer = _trainer(tmp_path, name, room)  # the random backgrounds share an RNG
            losses = [trainer.train_step(step) for step in range(12)]
            trainer.steps.settle()
            runs.append((trainer, losses))
        (exact, losses_a), (sized, losses_b) = runs
        assert len(sized.params["means"]) != 60  # it densified and pruned
        for k, p in exact.params.items():
            assert torch.equal(p, sized.params[k]), k
            sa = exact.optimizers[k].state_dict()["state"][0]
            sb = sized.optimizers[k].state_dict()["state"][0]
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(sa[key], sb[key]), (k, key)
        for key in ("grad2d", "count"):
            assert torch.equal(exact.strategy_state[key], sized.strategy_state[key]), key
        assert torch.equal(losses_a[-1][0], losses_b[-1][0])
        cap = sized.steps.capacity
        assert cap.measured >= 3  # at the start and after each change of the Gaussian count
        if headroom < 1:
            assert cap.grown >= 3  # every measurement overflows, and is grown past
        assert cap.current.size >= cap.current.largest_count()

    @pytest.mark.usefixtures("one_torch_thread")
    def test_a_nan_is_still_named_in_capacity_mode(tmp_path):
        trainer = _trainer(tmp_path, "nan", 1.15)
        trainer.train_step(0)
        with torch.no_grad():
            trainer.params["opacities"][5] = float("nan")
        trainer.train_step(1)
        with pytest.raises(ValueError, match=r"step 2: NaN or Inf in opacities \(what"):
            trainer.train_step(2)

    def test_an_overflow_skips_the_steps_after_it_until_grown():
        from tilesplat.train.step.capacity import BLOCKED, StepCapacity, overflowed

        def views(params, factor):
            return torch.tensor([30, 50, 40])

        cap = StepCapacity(views, 2, torch.device("cpu"))
        assert cap.for_step({"means": torch.zeros(5, 3)}, 1).size == 104  # 1.15 x (50 + 40)
        flags = []
        for count in (200, 10, 10):  # the first overflows, the next two would fit
            flag = FiniteFlag()
            cap.begin_step(flag)
            with deferred_finite_checks(flag):
                cap.current.observe(torch.tensor(count))
            cap.end_step()
            flags.append(flag.bad_names())
        assert flags == [[OVERFLOW], [BLOCKED], [BLOCKED]]
        assert all(overflowed(f) for f in flags) and not overflowed([]) and not overflowed(
            [OVERFLOW, "means"])
        cap.grow()
        assert cap.current.size == 230 and cap.grown == 1  # 1.15 x 200
        flag = FiniteFlag()
        cap.begin_step(flag)
        assert flag.bad_names() == []
        assert cap.for_step({"means": torch.zeros(5, 3)}, 1).size == 230  # same key: kept
        assert cap.for_step({"means": torch.zeros(6, 3)}, 1).size == 104  # measured again

    def test_the_config_key_chooses_exact_sizes():
        from tilesplat.train.config import TrainConfig
        from tilesplat.train.step.capacity import capacity_applies

        cpu, gpu = torch.device("cpu"), torch.device("cuda")
        assert capacity_applies(TrainConfig(backend="cuda"), cpu, 0)
        assert capacity_applies(TrainConfig(backend="auto"), gpu, 0)
        assert not capacity_applies(TrainConfig(backend="cuda", isect_capacity="exact"), cpu, 0)
        assert not capacity_applies(TrainConfig(backend="cpu"), cpu, 0)
        assert not capacity_applies(TrainConfig(backend="cuda"), cpu, 1)  # a feature
        assert not capacity_applies(TrainConfig(backend="cuda", parallel="data"), cpu, 0)
        with pytest.raises(ValueError, match="isect_capacity must be one of"):
            TrainConfig(isect_capacity="big").validate()

    @pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                        reason="numba-cuda is not installed (pip install tilesplat[cuda])")
    def test_cuda_capacity_in_the_simulator(request):
        from helpers import run_in_cuda_simulator

        passed = run_in_cuda_simulator([__file__], str(request.config.rootpath))
        assert len(passed) == 3, passed

else:

    def test_cuda_render_at_a_capacity_equals_the_exact_one():
        _check_capacity_render("cuda", exact_grads=False, spares=(37,))

    def test_cuda_counting():
        _check_counting("cuda")

    class Shapes(TorchDispatchMode):
        """The shape and dtype of every tensor each op makes."""

        def __init__(self) -> None:
            super().__init__()
            self.made: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.made.append((str(func.overloadpacket.__name__), tuple(t.shape),
                                      t.dtype))
            return out

    def test_two_batches_with_different_counts_make_the_same_shapes():
        made, counts = [], []
        for seed in (0, 2):  # 288 and 274 intersections (seeds 0 and 1 both make 288)
            tensors, viewmats, Ks = _scene("cuda", seed=seed)
            cap = IsectCapacity(700)
            shapes = Shapes()
            with shapes:
                _render(tensors, viewmats, Ks, "cuda", cap, FiniteFlag())
            made.append(shapes.made)
            counts.append(cap.largest_count())
        assert counts[0] != counts[1] and max(counts) <= 700, counts
        assert len(made[0]) > 50
        assert made[0] == made[1]
