"""The fast recipe's parts: the resolution schedule, the budget strategy, the recipe presets,
the garden-views built-in scene and the early stop."""

from __future__ import annotations

import math

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.frames import Frame
from tilesplat.strategy import BudgetStrategy
from tilesplat.train.config import TrainConfig, apply_overrides, config_from_dict
from tilesplat.train.features.resolution import CoarseFrames, downscale_factor, downscaled
from tilesplat.train.recipes import FAST


def _frame(w=20, h=12, seed=0, alpha=True):
    g = torch.Generator().manual_seed(seed)
    K = torch.tensor([[30.0, 0, w / 2], [0, 31.0, h / 2], [0, 0, 1]])
    return Frame("f", torch.eye(4), K, w, h, torch.rand(h, w, 3, generator=g),
                 torch.rand(h, w, 1, generator=g) if alpha else None)


def test_the_schedule_halves_the_factor_at_even_steps():
    cfg = TrainConfig(steps=1000, resolution_start=4, resolution_full_at=0.3)
    got = [downscale_factor(cfg, s) for s in (0, 99, 100, 199, 200, 299, 300, 999)]
    assert got == [4, 4, 2, 2, 1, 1, 1, 1]
    assert {downscale_factor(TrainConfig(), s) for s in range(0, 3000, 7)} == {1}


def test_large_images_stretch_the_schedule_in_proportion_to_their_pixels():
    from tilesplat.train.features.resolution import SPAN_MAX, schedule_span

    cfg = TrainConfig(steps=1000, resolution_start=4, resolution_full_at=0.3,
                      resolution_ref_pixels=50_000)
    assert schedule_span(cfg, 40_000) == schedule_span(cfg, 50_000) == 0.3  # not shortened
    assert schedule_span(cfg, 100_000) == pytest.approx(0.6)
    assert schedule_span(cfg, 10**7) == SPAN_MAX
    # twice the reference: the factors' thirds of 0.6 x 1000 steps
    got = [downscale_factor(cfg, s, 100_000) for s in (0, 199, 200, 399, 400, 999)]
    assert got == [4, 4, 2, 2, 1, 1]
    assert downscale_factor(cfg, 200, 50_000) == 1  # at the reference: the span as set
    off = TrainConfig(steps=1000, resolution_start=4, resolution_full_at=0.3)
    assert schedule_span(off, 10**7) == 0.3  # 0: no stretch
    long = TrainConfig(resolution_full_at=0.95, resolution_ref_pixels=1)
    assert schedule_span(long, 10**6) == 0.95  # a longer span than the cap is kept
    fast = apply_overrides(TrainConfig(), ["recipe=fast"])
    assert fast.resolution_ref_pixels == 16_000
    assert apply_overrides(fast, ["recipe=3dgs"]).resolution_ref_pixels == 0


def test_a_downscaled_frame_averages_pixels_and_keeps_pixel_centres():
    f = _frame()
    d = downscaled(f, 4)
    assert (d.width, d.height) == (5, 3)
    assert torch.allclose(d.image[1, 2], f.image[4:8, 8:12].mean(dim=(0, 1)))
    assert torch.allclose(d.alpha[0, 0, 0], f.alpha[0:4, 0:4].mean())
    # a world point on a fine pixel block's centre projects onto the coarse pixel's centre
    p = torch.tensor([0.3, -0.2, 2.0])
    fine, coarse = f.K @ p, d.K @ p
    uf, vf = fine[:2] / fine[2]
    uc, vc = coarse[:2] / coarse[2]
    assert math.isclose(uc, uf / 4, rel_tol=1e-6) and math.isclose(vc, vf / 4, rel_tol=1e-6)
    assert downscaled(f, 1) is f


def test_a_downscaled_mask_keeps_only_whole_blocks():
    import dataclasses

    f = _frame(w=8, h=4)
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[1, 5] = False  # one ignored pixel: its 2x2 block is ignored at 1/2
    d = downscaled(dataclasses.replace(f, mask=mask, camera_model="fisheye"), 2)
    expected = torch.ones(2, 4, dtype=torch.bool)
    expected[0, 2] = False
    assert torch.equal(d.mask, expected) and d.camera_model == "fisheye"
    assert downscaled(f, 2).mask is None


def test_coarse_frames_are_capped_at_16_pixels_a_side():
    frames = [_frame(w=40, h=34, seed=i) for i in range(3)]
    coarse = CoarseFrames(frames)
    assert coarse.frame(1, 1) is frames[1]
    a = coarse.frame(2, 2)
    assert (a.width, a.height) == (20, 17) and torch.equal(a.image, downscaled(frames[2], 2).image)
    # no coarse image under 16 pixels a side (the SSIM window is 11): 1/4 would give 10x8
    assert coarse.max_factor == 2 and coarse.frame(2, 4).width == 20
    assert CoarseFrames([_frame(w=20, h=12)]).max_factor == 1


def test_schedule_keys_are_checked():
    with pytest.raises(ValueError, match="resolution_start must be a power of two >= 1, got 3"):
        TrainConfig(resolution_start=3).validate()
    with pytest.raises(ValueError, match=r"resolution_full_at must be in \(0, 1\], got 0.0"):
        TrainConfig(resolution_full_at=0.0).validate()


def test_a_recipe_sets_its_keys_before_the_others():
    fast = apply_overrides(TrainConfig(), ["resolution_start=1", "recipe=fast"])
    assert fast.recipe == "fast" and fast.resolution_start == 1  # switched off on its own
    assert fast.refine_start == FAST["refine_start"] and fast.means_lr == FAST["means_lr"]
    back = apply_overrides(fast, ["recipe=3dgs"])
    assert back.refine_start == 500 and back.means_lr == TrainConfig().means_lr
    assert (fast.ema_decay, back.ema_decay) == (FAST["ema_decay"], 0.0)  # the average: off
    assert back.resolution_start == 1 == TrainConfig().resolution_start
    # a saved config (every key) loads as it was saved

    again = config_from_dict(fast.as_dict())
    assert again == fast
    with pytest.raises(ValueError, match="recipe must be one of"):
        apply_overrides(TrainConfig(), ["recipe=slow"])


def test_the_fast_recipe_grows_by_the_absolute_gradient_from_fewer_points():
    from tilesplat.train import seams

    fast = apply_overrides(TrainConfig(), ["recipe=fast"])
    assert (fast.absgrad, fast.grow_grad2d, fast.init_points) == (True, 8e-4, 3000)
    assert seams.strategy(fast).wants_absgrad()  # the render computes what the growth reads
    assert seams.strategy(fast).revised_opacity  # a split composites like its parent
    back = apply_overrides(fast, ["recipe=3dgs"])
    defaults = TrainConfig()
    assert (back.absgrad, back.grow_grad2d, back.init_points, back.revised_opacity) == (
        defaults.absgrad, defaults.grow_grad2d, defaults.init_points, False)
    plain = apply_overrides(TrainConfig(), ["recipe=fast", "absgrad=false", "grow_grad2d=2e-4"])
    assert not plain.absgrad and plain.refine_every == FAST["refine_every"]


def test_the_adam_betas_are_keys_scaled_for_the_batch_as_gsplat_scales_them():
    from tilesplat.train.models.splats import adam_betas, make_optimizers, make_params

    # the defaults are gsplat's betas, 1 - B * 0.1 and 1 - B * 0.001, bit for bit
    for bs in range(1, 13):
        assert adam_betas(TrainConfig(batch_size=bs)) == (
            max(0.0, 1.0 - bs * 0.1), max(0.0, 1.0 - bs * 0.001))
    cfg = TrainConfig(adam_beta1=0.7, adam_beta2=0.99)
    assert adam_betas(cfg) == (0.7, 0.99)
    assert adam_betas(TrainConfig(adam_beta1=0.7, adam_beta2=0.99, batch_size=2)) == (0.4, 0.98)
    assert adam_betas(TrainConfig(adam_beta1=0.7, batch_size=4))[0] == 0.0  # not below 0
    params = make_params({
        "means": torch.zeros(2, 3), "scales": torch.zeros(2, 3), "quats": torch.ones(2, 4),
        "opacities": torch.zeros(2), "sh0": torch.zeros(2, 1, 3), "shN": torch.zeros(2, 0, 3),
    })
    optimizers = make_optimizers(params, cfg, 1.0)
    assert {opt.param_groups[0]["betas"] for opt in optimizers.values()} == {(0.7, 0.99)}
    fast = apply_overrides(TrainConfig(), ["recipe=fast"])
    assert (fast.adam_beta1, fast.adam_beta2) == (FAST["adam_beta1"], FAST["adam_beta2"])
    back = apply_overrides(fast, ["recipe=3dgs"])
    assert (back.adam_beta1, back.adam_beta2) == (0.9, 0.999)
    for name in ("adam_beta1", "adam_beta2"):
        for bad in (1.0, -0.1):
            with pytest.raises(ValueError, match=rf"{name} must be in \[0, 1\), got {bad}"):
                TrainConfig(**{name: bad}).validate()
        with pytest.raises(ValueError, match=f"{name} must be finite, got nan"):
            TrainConfig(**{name: float("nan")}).validate()


def _grow_once(strategy, n=100, n_high=40, step=10):
    """One refinement of ``strategy`` on n Gaussians, n_high of them above the threshold."""
    from tilesplat.train.models.splats import make_optimizers, make_params

    g = torch.Generator().manual_seed(0)
    params = make_params({
        "means": torch.randn(n, 3, generator=g), "scales": torch.full((n, 3), -5.0),
        "quats": torch.randn(n, 4, generator=g), "opacities": torch.zeros(n),
        "sh0": torch.zeros(n, 1, 3), "shN": torch.zeros(n, 0, 3),
    })
    optimizers = make_optimizers(params, TrainConfig(sh_degree=0), 1.0)
    state = strategy.initialize_state(scene_scale=1.0)
    grad = torch.zeros(n)
    grad[:n_high] = torch.linspace(1.0, 2.0, n_high)  # the last of them score highest
    state["grad2d"], state["count"] = grad, torch.ones(n)
    strategy._grow(params, optimizers, state, step)
    return params


def test_the_budget_keeps_the_best_candidates():
    kw = dict(grow_grad2d=0.5, grow_scale3d=1.0, refine_start_iter=0, refine_stop_iter=20)
    # budget at step 10 of 0..20: halfway from 100 to 120 = 110: 10 of the 40 candidates
    budget = BudgetStrategy(cap_max=120, **kw)
    assert budget.budget_at(10, 100) == 110
    params = _grow_once(budget)
    assert len(params["means"]) == 110
    means0 = torch.randn(100, 3, generator=torch.Generator().manual_seed(0))
    # the clones are copies of the 10 highest-scoring candidates (indices 30..39)
    assert torch.equal(params["means"][100:].detach(), means0[30:40])
    # without a budget every candidate grows (the default strategy)
    from tilesplat.strategy import DefaultStrategy

    assert len(_grow_once(DefaultStrategy(**kw))["means"]) == 140


def test_the_garden_views_scene_loads_as_colmap(tmp_path):
    from tilesplat.data.garden_views import write_garden_views_dataset

    folder = write_garden_views_dataset(tmp_path / "g", n_views=6, max_points=3000)
    ds = load_dataset(folder, test_every=3)
    assert len(ds.train) == 4 and len(ds.test) == 2
    assert (ds.train[0].width, ds.train[0].height) == (324, 210)
    assert ds.points is not None and len(ds.points) == 3000
    img = ds.train[0].image
    assert float(img.std()) > 0.05  # real content, not a blank
    # reused when complete, refused over a foreign folder
    assert write_garden_views_dataset(folder, n_views=6, max_points=3000) == folder
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="not a tilesplat garden-views dataset"):
        write_garden_views_dataset(tmp_path / "other", n_views=6)


def test_plateaued_compares_the_last_evaluations_with_the_best_before():
    from tilesplat.train.features.early_stop import plateaued

    assert not plateaued([20.0, 21.0, 22.0], patience=0, min_db=0.0)  # off
    assert not plateaued([20.0, 21.0], patience=2, min_db=0.0)  # too few
    assert plateaued([20.0, 22.0, 21.9, 22.0], patience=2, min_db=0.01)
    assert not plateaued([20.0, 22.0, 21.9, 22.02], patience=2, min_db=0.01)
    assert not plateaued([20.0, 22.0, float("nan"), 21.0], patience=1, min_db=0.0)
    with pytest.raises(ValueError, match="early_stop_patience = 3 needs eval_every > 0"):
        TrainConfig(early_stop_patience=3).validate()
    with pytest.raises(ValueError, match="early_stop_min_db must be >= 0, got -1.0"):
        TrainConfig(early_stop_min_db=-1.0).validate()


def test_a_run_stops_early_and_a_resume_stops_again_at_once(tmp_path):
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.loop.trainer import Trainer
    from tilesplat.train.rundir.checkpoint import latest_checkpoint, load_checkpoint

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    ds = load_dataset(folder)
    # a rise of 100 dB never comes: the run stops at the third evaluation, step 6 of 40
    cfg = TrainConfig(steps=40, init_points=100, sh_degree=0, eval_every=2, log_every=2,
                      early_stop_patience=2, early_stop_min_db=100.0, progress=False,
                      lpips=False, backend="torch").validate()
    lines: list[str] = []
    trainer = Trainer(cfg, ds, tmp_path / "run", log=lines.append)
    trainer.train()
    assert trainer.step == 6 and trainer.history["test_step"] == [2, 4, 6]
    assert any("early stop at step 6" in line for line in lines)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert ckpt["step"] == 6
    again = Trainer(cfg, ds, tmp_path / "run", checkpoint=ckpt, log=lines.append)
    again.train()
    assert again.step == 6
    # without the early stop the same run goes on to its last step
    cfg_off = cfg.replace(early_stop_patience=0, steps=10).validate()
    full = Trainer(cfg_off, ds, tmp_path / "run2", log=lines.append)
    full.train()
    assert full.step == 10


def test_the_fast_recipe_chooses_its_length_budget_and_stop(tmp_path):
    from tilesplat.train.config import load_config, save_config

    fast = apply_overrides(TrainConfig(), ["recipe=fast"])
    chosen = ("steps", "eval_every", "early_stop_patience", "eval_max_views", "strategy",
              "cap_max", "resolution_ref_pixels")
    assert {k: getattr(fast, k) for k in chosen} == {k: FAST[k] for k in chosen}
    assert fast.strategy == "budget" and fast.steps < TrainConfig().steps
    # the saved config.toml holds the effective values, and loads as it was saved
    text = save_config(fast, tmp_path / "config.toml").read_text()
    for key in chosen:
        assert f"\n{key} = " in text
    assert f"\nsteps = {FAST['steps']}\n" in text and '\nstrategy = "budget"\n' in text
    assert load_config(tmp_path / "config.toml") == fast
    back = apply_overrides(fast, ["recipe=3dgs"])
    assert {k: getattr(back, k) for k in chosen} == {k: getattr(TrainConfig(), k) for k in chosen}


def test_the_users_steps_win_over_the_fast_recipes(tmp_path):
    from tilesplat.train.config import load_config

    for order in (["recipe=fast", "steps=5000"], ["steps=5000", "recipe=fast"]):
        cfg = apply_overrides(TrainConfig(), order)  # --set, in either order
        assert (cfg.steps, cfg.strategy) == (5000, "budget")
    toml = tmp_path / "mine.toml"
    toml.write_text('steps = 5000\nrecipe = "fast"\nstrategy = "default"\n')
    cfg = load_config(toml)
    assert (cfg.steps, cfg.strategy, cfg.means_lr) == (5000, "default", FAST["means_lr"])
    # a --set after the file wins over both
    assert apply_overrides(load_config(toml), ["steps=700"]).steps == 700
    assert apply_overrides(cfg, ["early_stop_patience=0"]).early_stop_patience == 0


def test_a_fast_run_on_a_tiny_scene_stops_on_its_own(tmp_path):
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.loop.trainer import Trainer

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    cfg = apply_overrides(TrainConfig(), [
        "recipe=fast", "init_points=100", "sh_degree=0", "progress=false", "lpips=false",
        "backend=torch", "eval_every=5", "early_stop_min_db=100"]).validate()
    trainer = Trainer(cfg, load_dataset(folder), tmp_path / "run", log=lambda _: None)
    trainer.train()
    # the recipe's own length and patience (3 evaluations), cut short by the early stop: a rise
    # of 100 dB never comes, so the run ends at its fourth evaluation
    assert cfg.steps == FAST["steps"] and cfg.early_stop_patience == FAST["early_stop_patience"]
    assert trainer.step == 5 * (FAST["early_stop_patience"] + 1)
    assert trainer.history["test_step"][-1] == trainer.step


def test_the_budget_grows_with_the_largest_training_image(tmp_path):
    """cap_per_pixel: the cap at least that many Gaussians per pixel of the largest training
    image (the fast recipe's 0.88: garden-views' 324x210 gets 59,875, the room's 128x96 keeps
    cap_max); the trainer passes its images' size."""
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train import seams
    from tilesplat.train.loop.trainer import Trainer

    fast = apply_overrides(TrainConfig(), ["recipe=fast"])
    assert seams.strategy(fast, image_pixels=324 * 210).cap_max == 59_875
    assert seams.strategy(fast, image_pixels=128 * 96).cap_max == FAST["cap_max"]
    assert seams.strategy(fast).cap_max == FAST["cap_max"]  # no size given: cap_max alone
    off = apply_overrides(fast, ["cap_per_pixel=0"])
    assert seams.strategy(off, image_pixels=10**7).cap_max == FAST["cap_max"]
    assert seams.strategy(TrainConfig(), image_pixels=10**7) == seams.strategy(TrainConfig())
    with pytest.raises(ValueError, match="cap_per_pixel"):
        apply_overrides(TrainConfig(), ["cap_per_pixel=-1"])
    folder = write_synthetic_dataset(tmp_path / "scene", n_train=2, n_test=1, size=16)
    cfg = apply_overrides(TrainConfig(), [
        "strategy=budget", "cap_max=10", "cap_per_pixel=2.5", "init_points=50", "steps=1",
        "progress=false", "lpips=false", "checkpoint_every=0", "save_ply=false"])
    trainer = Trainer(cfg, load_dataset(folder), tmp_path / "run", log=lambda _: None)
    assert trainer.strategy.cap_max == round(2.5 * 16 * 16)


def test_absgrad_is_rendered_only_while_the_strategy_reads_it(tmp_path):
    """Past refine_stop the strategy reads no screen-space gradient: the renders leave absgrad
    out there, and the run trains the same bits as one that computes it at every step."""
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.loop.trainer import Trainer

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=3, n_test=1, size=16)
    cfg = apply_overrides(TrainConfig(), [
        "recipe=fast", "init_points=200", "sh_degree=0", "progress=false", "lpips=false",
        "backend=torch", "steps=24", "refine_start=2", "refine_stop=12", "refine_every=4",
        "grow_grad2d=1e-7", "eval_every=0", "early_stop_patience=0", "ema_decay=0",
        "resolution_start=1"]).validate()

    def run(name, every_step):
        trainer = Trainer(cfg, load_dataset(folder), tmp_path / name, log=lambda _: None)
        assert trainer.plan.absgrad and trainer.plan.absgrad_stop == 12
        if every_step:
            trainer.plan.absgrad_stop = None
        seen = []
        render = trainer.plan.model.render

        def spy(*args, **kwargs):
            seen.append((kwargs["step"], kwargs["absgrad"]))
            return render(*args, **kwargs)

        trainer.plan.model.render = spy
        trainer.train()
        return trainer, seen

    lean, seen = run("lean", every_step=False)
    assert [s for s, a in seen if a] == list(range(12))  # steps 0..11: densification
    assert [s for s, a in seen if not a] == list(range(12, 24))
    full, seen_full = run("full", every_step=True)
    assert all(a for _, a in seen_full)
    assert len(lean.params["means"]) > 200  # it grew: the absgrad it read was there
    for k, v in lean.params.items():
        assert torch.equal(v, full.params[k]), k


def test_the_anneal_lowers_every_rate_but_the_means_over_the_runs_end():
    """lr_anneal_from: the rates of the scales, rotations, opacities and colours stay their
    own until that fraction of the steps, then fall linearly to lr_anneal_to of them at the
    last step; the means' keeps its own decay; a CUDA graph's rate tensors are filled in
    place; the 3DGS recipe leaves every rate but the means' constant."""
    from tilesplat.train.models.splats import (
        PARAM_NAMES,
        anneal_factor,
        base_learning_rates,
        make_optimizers,
        make_params,
        means_rate,
        set_learning_rates,
    )

    cfg = TrainConfig(steps=100, lr_anneal_from=0.8, lr_anneal_to=0.1, batch_size=4)
    assert [anneal_factor(cfg, s) for s in (0, 80)] == [1.0, 1.0]
    assert [round(anneal_factor(cfg, s), 12) for s in (90, 99, 100)] == [0.55, 0.145, 0.1]
    assert {anneal_factor(TrainConfig(steps=100), s) for s in range(101)} == {1.0}
    params = make_params({
        "means": torch.zeros(2, 3), "scales": torch.zeros(2, 3), "quats": torch.ones(2, 4),
        "opacities": torch.zeros(2), "sh0": torch.zeros(2, 1, 3), "shN": torch.zeros(2, 0, 3),
    })
    base = base_learning_rates(cfg, 2.0)
    for as_tensor in (False, True):
        optimizers = make_optimizers(params, cfg, 2.0)
        if as_tensor:
            for opt in optimizers.values():
                opt.param_groups[0]["lr"] = torch.tensor(float("nan"))
        for step in (10, 90):
            got = set_learning_rates(optimizers, cfg, 2.0, step)
            assert got == means_rate(cfg, 2.0, step)
            rates = {k: float(o.param_groups[0]["lr"]) for k, o in optimizers.items()}
            assert rates["means"] == pytest.approx(got, rel=1e-6)
            for name in PARAM_NAMES[1:]:  # the batch of 4 scales them by sqrt(4) = 2
                want = base[name] * 2.0 * (1.0 if step == 10 else 0.55)
                assert rates[name] == pytest.approx(want, rel=1e-6), (name, step)
    plain = TrainConfig(steps=100)
    optimizers = make_optimizers(params, plain, 2.0)
    set_learning_rates(optimizers, plain, 2.0, 99)
    for name in PARAM_NAMES[1:]:
        assert optimizers[name].param_groups[0]["lr"] == base_learning_rates(plain, 2.0)[name]
    fast = apply_overrides(TrainConfig(), ["recipe=fast"])
    assert (fast.lr_anneal_from, fast.lr_anneal_to) == (0.8, 0.1)
    back = apply_overrides(fast, ["recipe=3dgs"])
    assert back.lr_anneal_from == 1.0
    for bad in ("lr_anneal_from=1.5", "lr_anneal_to=0"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            apply_overrides(TrainConfig(), [bad]).validate()
