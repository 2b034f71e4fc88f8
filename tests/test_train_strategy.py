"""Densification: parameter edits keep Adam aligned; default and MCMC strategies behave."""

import math

import pytest
import torch

from tilesplat.strategy import DefaultStrategy, MCMCStrategy
from tilesplat.strategy.ops import (
    compute_relocation,
    duplicate,
    inject_noise,
    relocation_table,
    remove,
    reset_opacity,
    split,
)


def _model(n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "means": torch.randn(n, 3, generator=g),
        "scales": torch.randn(n, 3, generator=g) - 3.0,
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, 3, 3, generator=g),
    }
    params = {k: torch.nn.Parameter(v) for k, v in tensors.items()}
    opts = {k: torch.optim.Adam([p], lr=1e-2) for k, p in params.items()}
    loss = sum((p**2).sum() for p in params.values())
    loss.backward()
    for o in opts.values():
        o.step()
        o.zero_grad()
    return params, opts


def _moments(opts, name):
    opt = opts[name]
    return opt.state[opt.param_groups[0]["params"][0]]


def test_duplicate_appends_copies_with_fresh_moments():
    params, opts = _model()
    before = {k: p.detach().clone() for k, p in params.items()}
    m_before = _moments(opts, "means")["exp_avg"].clone()
    state = {"grad2d": torch.arange(6.0), "scene_scale": 2.0}
    mask = torch.tensor([0, 1, 0, 0, 1, 0], dtype=torch.bool)
    duplicate(params, opts, state, mask)
    for k, p in params.items():
        assert p.shape[0] == 8
        assert torch.equal(p[:6], before[k]) and torch.equal(p[6:], before[k][[1, 4]])
        assert opts[k].param_groups[0]["params"][0] is p
    m = _moments(opts, "means")
    assert torch.equal(m["exp_avg"][:6], m_before) and not m["exp_avg"][6:].any()
    assert m["step"] == 1  # the shared step counter is kept
    assert torch.equal(state["grad2d"], torch.tensor([0, 1, 2, 3, 4, 5, 1, 4.0]))
    assert state["scene_scale"] == 2.0


def test_split_replaces_parent_by_two_smaller_children():
    params, opts = _model()
    before = {k: p.detach().clone() for k, p in params.items()}
    state = {"count": torch.arange(6.0)}
    mask = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool)
    torch.manual_seed(0)
    split(params, opts, state, mask)
    keep = [0, 1, 3, 4, 5]
    assert params["means"].shape[0] == 7
    assert torch.equal(params["means"][:5], before["means"][keep])
    want_scales = (before["scales"][2].exp() / 1.6).log()
    assert torch.allclose(params["scales"][5:], want_scales.expand(2, 3))
    assert torch.equal(params["sh0"][5:], before["sh0"][[2, 2]])
    # children are spread around the parent by about its size
    offset = (params["means"][5:] - before["means"][2]).norm(dim=-1)
    assert (offset > 0).all() and (offset < 10 * before["scales"][2].exp().max()).all()
    assert not _moments(opts, "quats")["exp_avg_sq"][5:].any()
    assert torch.equal(state["count"], torch.tensor([0, 1, 3, 4, 5, 2, 2.0]))


@pytest.mark.parametrize("revised", [False, True])
def test_a_revised_split_composites_like_its_parent(revised):
    params, opts = _model()
    before = torch.sigmoid(params["opacities"].detach()).clone()
    mask = torch.tensor([0, 1, 0, 0, 1, 0], dtype=torch.bool)
    split(params, opts, {"count": torch.zeros(6)}, mask, revised_opacity=revised)
    parents = before[[1, 4, 1, 4]].double()
    children = torch.sigmoid(params["opacities"].detach()[4:]).double()
    assert torch.equal(torch.sigmoid(params["opacities"].detach()[:4]), before[[0, 2, 3, 5]])
    if revised:  # two children one behind the other let through what the parent let through
        assert torch.allclose((1 - children) ** 2, 1 - parents, atol=1e-6)
        assert (children < parents).all()
    else:
        assert torch.equal(children, parents)


def test_the_revised_opacity_key_reaches_the_strategies():
    from tilesplat.train import seams
    from tilesplat.train.config import TrainConfig, apply_overrides

    for name in ("default", "budget"):
        on = apply_overrides(TrainConfig(), [f"strategy={name}", "revised_opacity=true"])
        assert seams.strategy(on).revised_opacity
        assert not seams.strategy(apply_overrides(TrainConfig(), [f"strategy={name}"])
                                  ).revised_opacity


def test_remove_and_reset_opacity():
    params, opts = _model()
    before = params["opacities"].detach().clone()
    state = {"count": torch.arange(6.0)}
    remove(params, opts, state, torch.tensor([1, 0, 0, 0, 0, 1], dtype=torch.bool))
    assert torch.equal(params["opacities"], before[1:5]) and state["count"].tolist() == [1, 2, 3, 4]
    assert _moments(opts, "opacities")["exp_avg"].shape == (4,)
    reset_opacity(params, opts, 0.01)
    assert (torch.sigmoid(params["opacities"]) <= 0.01 + 1e-6).all()
    assert not _moments(opts, "opacities")["exp_avg"].any()


def test_relocation_matches_equation_9():
    table = relocation_table(51)
    o = torch.tensor([0.3, 0.9, 0.05, 0.99, 0.5])
    s = torch.rand(5, 3) + 0.1
    n = torch.tensor([1, 2, 5, 17, 51])
    new_o, new_s = compute_relocation(o, s, n, table)
    for j in range(5):
        oo, nn = float(o[j]), int(n[j])
        on = 1 - (1 - oo) ** (1 / nn)
        denom = sum(
            math.comb(i - 1, k) * (-1) ** k / math.sqrt(k + 1) * on ** (k + 1)
            for i in range(1, nn + 1)
            for k in range(i)
        )
        assert float(new_o[j]) == pytest.approx(on, rel=1e-5)
        assert torch.allclose(new_s[j], s[j] * (oo / denom), rtol=1e-4)
    # one copy changes nothing
    assert new_o[0] == pytest.approx(0.3) and torch.allclose(new_s[0], s[0])


def _info_with_grads(n: int, grads: torch.Tensor, visible: torch.Tensor, absgrad=None):
    means2d = torch.zeros(1, n, 2, requires_grad=True)
    info = {
        "means2d": means2d,
        "radii": visible[None, :, None].expand(1, n, 2).int() * 3,
        "width": 100,
        "height": 50,
        "n_cameras": 1,
        "gaussian_ids": None,
    }
    (means2d * grads[None]).sum().backward()
    if absgrad is not None:
        means2d.absgrad = absgrad[None]
    return info


@pytest.mark.parametrize("use_absgrad", [False, True])
def test_default_strategy_clones_splits_and_prunes(use_absgrad):
    params, opts = _model(4)
    with torch.no_grad():
        params["scales"].copy_(
            torch.log(torch.tensor([0.001, 1.0, 0.001, 1.0]))[:, None].expand(4, 3)
        )
        params["opacities"].copy_(torch.logit(torch.tensor([0.5, 0.5, 0.5, 0.001])))
    strat = DefaultStrategy(
        refine_start_iter=0, refine_every=1, reset_every=1000, absgrad=use_absgrad
    )
    state = strat.initialize_state(scene_scale=1.0)
    big = torch.tensor([1e-2, 1e-2])
    grads = torch.stack([big, big, torch.zeros(2), torch.zeros(2)])  # [4, 2]
    if use_absgrad:
        info = _info_with_grads(4, torch.zeros(4, 2), torch.ones(4, dtype=torch.bool), grads)
    else:
        info = _info_with_grads(4, grads, torch.ones(4, dtype=torch.bool))
    strat.step_post_backward(params, opts, state, step=1, info=info, means_lr=1e-3)
    # 0: small + high grad -> cloned; 1: large + high grad -> split in two; 3: pruned
    assert len(params["means"]) == 4 - 1 + 1 + 2 - 1
    assert state["grad2d"].shape == (5,) and not state["grad2d"].any()


def test_default_strategy_ignores_invisible_and_stops():
    params, opts = _model(3)
    strat = DefaultStrategy(refine_start_iter=0, refine_every=1, refine_stop_iter=5)
    state = strat.initialize_state()
    info = _info_with_grads(3, torch.ones(3, 2), torch.tensor([True, False, True]))
    strat.step_post_backward(params, opts, state, step=3, info=info)
    # visible Gaussians were counted; after growing, stats are cleared
    before = len(params["means"])
    info = _info_with_grads(before, torch.ones(before, 2), torch.ones(before, dtype=torch.bool))
    strat.step_post_backward(params, opts, state, step=5, info=info)
    assert len(params["means"]) == before  # refine_stop reached: nothing changes


def test_mcmc_relocates_dead_and_respects_cap():
    torch.manual_seed(0)
    params, opts = _model(20)
    with torch.no_grad():
        params["opacities"][:5] = -20.0  # dead
    strat = MCMCStrategy(cap_max=22, refine_start_iter=0, refine_every=1, min_opacity=0.005)
    state = strat.initialize_state()
    strat.step_post_backward(params, opts, state, step=1, info={}, means_lr=1e-4)
    assert len(params["means"]) == 21  # 5% of 20 added
    assert (torch.sigmoid(params["opacities"]) > 0.005).all()
    strat.step_post_backward(params, opts, state, step=2, info={}, means_lr=1e-4)
    strat.step_post_backward(params, opts, state, step=3, info={}, means_lr=1e-4)
    assert len(params["means"]) == 22  # capped
    for k, p in params.items():
        assert _moments(opts, k)["exp_avg"].shape == p.shape


def test_mcmc_noise_moves_transparent_gaussians_most():
    torch.manual_seed(1)
    params, _ = _model(2)
    with torch.no_grad():
        params["opacities"].copy_(torch.logit(torch.tensor([0.001, 0.9])))
        params["scales"].fill_(math.log(0.1))
    before = params["means"].detach().clone()
    inject_noise(params, scale=1.0)
    moved = (params["means"] - before).norm(dim=-1)
    assert moved[0] > 1e-4 and moved[1] < 1e-12
