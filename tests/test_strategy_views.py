"""The multi-view growth score (strategy/views.py) and the budget strategy that ranks by it."""

from __future__ import annotations

import torch

from tilesplat.strategy import BudgetStrategy
from tilesplat.strategy.views import add_hot_views, rank_by_views

W, H = 40, 20


def _info(grad_ndc: torch.Tensor, seen: torch.Tensor, packed: bool = False) -> dict:
    """A render's meta for C views of N Gaussians: the screen-space gradients that are
    ``grad_ndc`` [C, N, 2] in the threshold's units, the Gaussians ``seen`` [C, N] (radii 0
    elsewhere); packed: the seen pairs only."""
    c = grad_ndc.shape[0]
    pixels = grad_ndc / torch.tensor([W / 2.0, H / 2.0]) / c  # undo the strategy's scaling
    radii = seen.long()[..., None].repeat(1, 1, 2) * 3
    info = {"width": W, "height": H, "n_cameras": c}
    if packed:
        cam, gid = seen.nonzero(as_tuple=True)
        pixels, radii = pixels[cam, gid], radii[cam, gid]
        info.update(gaussian_ids=gid, camera_ids=cam)
    means2d = torch.zeros_like(pixels, requires_grad=True)
    means2d.grad = pixels.clone()
    means2d.absgrad = pixels.abs()
    info.update(means2d=means2d, radii=radii)
    return info


def _views():
    # 3 views of 4 Gaussians: gradient norms (threshold 1.0) and whether each view saw them
    norms = torch.tensor([[2.0, 0.5, 3.0, 2.0], [2.0, 2.0, 0.2, 5.0], [0.1, 2.0, 2.0, 9.0]])
    seen = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 1]], dtype=torch.bool)
    angle = torch.tensor([0.3, 1.1, 2.0, 2.9])  # a direction per Gaussian
    grad = torch.stack([norms * angle.cos(), norms * angle.sin()], dim=-1)
    # above 1.0 where seen: Gaussian 2 in view 0 only (view 2 did not see it), 3 in views 1, 2
    return grad, seen, torch.tensor([2.0, 2.0, 1.0, 2.0])


def test_a_view_counts_when_it_saw_the_gaussian_above_the_threshold():
    grad, seen, want = _views()
    for packed in (False, True):
        for absgrad in (False, True):
            hot = torch.zeros(4)
            add_hot_views(hot, _info(grad, seen, packed), "means2d", absgrad, 1.0, packed)
            assert torch.equal(hot, want), (packed, absgrad, hot)
    hot = torch.zeros(4)
    add_hot_views(hot, _info(grad, seen), "means2d", False, 2.5, False)
    assert torch.equal(hot, torch.tensor([0.0, 0.0, 1.0, 2.0]))  # 3.0; 5.0 and 9.0


def test_the_views_order_the_candidates_and_the_gradient_breaks_ties():
    hot = torch.tensor([3.0, 3.0, 1.0, 0.0])
    grads = torch.tensor([1.0, 4.0, 100.0, 50.0])
    assert rank_by_views(hot, grads).argsort(descending=True).tolist() == [1, 0, 2, 3]


def _refine(score: str, n: int = 100):
    """Ten steps and one refinement of a budget strategy ranking by ``score`` on n Gaussians:
    0..39 are above the threshold on average, 20..29 in every view (gradient 1.0), the others
    in one view of the ten (19.0 there: the higher mean, 1.9)."""
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.models.splats import make_optimizers, make_params

    strategy = BudgetStrategy(grow_grad2d=0.5, grow_scale3d=1.0, refine_start_iter=0,
                              refine_stop_iter=20, refine_every=10, cap_max=120,
                              budget_score=score)
    g = torch.Generator().manual_seed(0)
    means0 = torch.randn(n, 3, generator=g)
    params = make_params({
        "means": means0.clone(), "scales": torch.full((n, 3), -5.0),
        "quats": torch.randn(n, 4, generator=g), "opacities": torch.zeros(n),
        "sh0": torch.zeros(n, 1, 3), "shN": torch.zeros(n, 0, 3),
    })
    optimizers = make_optimizers(params, TrainConfig(sh_degree=0), 1.0)
    state = strategy.initialize_state(scene_scale=1.0)
    seen = torch.ones(1, n, dtype=torch.bool)
    for step in range(1, 11):
        norms = torch.zeros(n)
        norms[20:30] = 1.0
        norms[[*range(0, 20), *range(30, 40)]] = 19.0 if step == 3 else 0.0
        grad = torch.stack([norms, torch.zeros(n)], dim=-1)[None]
        strategy.step_post_backward(params, optimizers, state, step, _info(grad, seen))
    return means0, params["means"].detach(), state


def test_the_budget_grows_the_candidates_most_views_asked_for():
    # the budget at step 10 of 0..20: halfway from 100 to 120: 10 clones of 40 candidates
    means0, means, state = _refine("views")
    assert len(means) == 110
    assert torch.equal(means[100:], means0[20:30])  # the ten asked for in every view
    assert state["hot"].shape == (110,) and not state["hot"].any()  # counted anew
    # by the mean gradient, the one-view spikes grow instead
    means0, means, state = _refine("gradient")
    assert len(means) == 110 and "hot" not in state
    clones = {int((means0 - m).abs().sum(-1).argmin()) for m in means[100:]}
    assert len(clones) == 10 and not clones & set(range(20, 30))
