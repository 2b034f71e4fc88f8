"""gsplat's own kinds of client code, run against ``tilesplat`` as ``gsplat``:

- a training loop shaped like gsplat 1.5.3's ``examples/simple_trainer.py`` (a ParameterDict
  of splats, one Adam per parameter, the strategy hooks called with its arguments, the optimiser
  step before ``step_post_backward``), with ``DefaultStrategy`` and ``MCMCStrategy``;
- an image fit in the manner of gsplat's ``examples/image_fitting.py`` (random Gaussians in
  front of one camera fitted to an image) in both of its model types, importing its names
  from ``tilesplat`` as that example imports them from ``gsplat``.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import tilesplat as gsplat
from tilesplat import rasterization, rasterization_2dgs
from tilesplat.strategy import DefaultStrategy, MCMCStrategy

W = H = 24


def _target_scene():
    """Two views of a few coloured blobs, rendered by tilesplat itself."""
    g = torch.Generator().manual_seed(7)
    n = 12
    means = (torch.rand(n, 3, generator=g) - 0.5) * 1.2
    quats = F.normalize(torch.randn(n, 4, generator=g), dim=-1)
    scales = torch.rand(n, 3, generator=g) * 0.15 + 0.1
    colors = torch.rand(n, 3, generator=g)
    viewmats = torch.eye(4).repeat(2, 1, 1)
    viewmats[:, 2, 3] = 3.0
    viewmats[1, 0, 3] = 0.4
    K = torch.tensor([[30.0, 0, W / 2], [0, 30.0, H / 2], [0, 0, 1]]).repeat(2, 1, 1)
    with torch.no_grad():
        images, _, _ = rasterization(means, quats, scales, torch.full((n,), 0.9), colors,
                                     viewmats, K, W, H, packed=False)
    return images, viewmats, K


def _splats(n: int, sh_degree: int = 1):
    g = torch.Generator().manual_seed(0)
    rgb = torch.rand(n, 3, generator=g)
    shN = torch.zeros(n, (sh_degree + 1) ** 2 - 1, 3)
    return torch.nn.ParameterDict({
        "means": torch.nn.Parameter((torch.rand(n, 3, generator=g) - 0.5) * 1.5),
        "scales": torch.nn.Parameter(torch.full((n, 3), math.log(0.08))),
        "quats": torch.nn.Parameter(torch.randn(n, 4, generator=g)),
        "opacities": torch.nn.Parameter(torch.logit(torch.full((n,), 0.5))),
        "sh0": torch.nn.Parameter(((rgb - 0.5) / 0.28209479177387814)[:, None, :]),
        "shN": torch.nn.Parameter(shN),
    })


LRS = {"means": 1.6e-3, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2, "sh0": 2.5e-3,
       "shN": 2.5e-3 / 20}


def _train(strategy, steps: int, packed: bool, visible_adam: bool = False):
    """The loop of gsplat's simple_trainer.py, reduced to what touches the strategy."""
    images, viewmats, Ks = _target_scene()
    splats = _splats(80)
    opt_cls = gsplat.SelectiveAdam if visible_adam else torch.optim.Adam
    optimizers = {
        name: opt_cls([{"params": splats[name], "lr": LRS[name], "name": name}],
                      eps=1e-15, betas=(0.9, 0.999))
        for name in splats
    }
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizers["means"], gamma=0.999)
    strategy.check_sanity(splats, optimizers)
    if isinstance(strategy, DefaultStrategy):
        state = strategy.initialize_state(scene_scale=1.0)
    else:
        state = strategy.initialize_state()
    losses, counts = [], []
    for step in range(steps):
        cam = step % 2
        colors = torch.cat([splats["sh0"], splats["shN"]], 1)
        renders, alphas, info = rasterization(
            means=splats["means"], quats=splats["quats"], scales=torch.exp(splats["scales"]),
            opacities=torch.sigmoid(splats["opacities"]), colors=colors,
            viewmats=viewmats[cam:cam + 1], Ks=Ks[cam:cam + 1], width=W, height=H,
            sh_degree=1, packed=packed,
            absgrad=strategy.absgrad if isinstance(strategy, DefaultStrategy) else False,
        )
        strategy.step_pre_backward(params=splats, optimizers=optimizers, state=state,
                                   step=step, info=info)
        loss = F.l1_loss(renders, images[cam:cam + 1])
        loss.backward()
        if visible_adam:
            if packed:
                visibility = torch.zeros_like(splats["opacities"], dtype=torch.bool)
                visibility.scatter_(0, info["gaussian_ids"], 1)
            else:
                visibility = (info["radii"] > 0).all(-1).any(0)
        for optimizer in optimizers.values():
            if visible_adam:
                optimizer.step(visibility)
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if isinstance(strategy, DefaultStrategy):
            strategy.step_post_backward(params=splats, optimizers=optimizers, state=state,
                                        step=step, info=info, packed=packed)
        else:
            strategy.step_post_backward(params=splats, optimizers=optimizers, state=state,
                                        step=step, info=info, lr=scheduler.get_last_lr()[0])
        losses.append(loss.item())
        counts.append(len(splats["means"]))
    for name, opt in optimizers.items():
        (p,) = opt.param_groups[0]["params"]
        assert p is splats[name]
        assert opt.state[p]["exp_avg"].shape == p.shape
    return losses, counts, state


@pytest.fixture(autouse=True)
def _reference_backend():
    with gsplat.use_backend("torch"):  # no kernel compilation in these tests
        yield


@pytest.mark.parametrize(("packed", "visible_adam"), [(True, False), (False, True)])
def test_default_strategy_in_a_gsplat_loop(packed, visible_adam):
    strategy = DefaultStrategy(refine_start_iter=5, refine_every=10, grow_grad2d=2e-5,
                               prune_opa=0.02, verbose=False)
    losses, counts, state = _train(strategy, 32, packed, visible_adam)
    assert counts[-1] != counts[0]  # it densified and / or pruned
    assert max(counts) > counts[0]
    assert state["grad2d"].shape == (counts[-1],)
    assert sum(losses[-6:]) < sum(losses[:6])


def test_mcmc_strategy_in_a_gsplat_loop():
    strategy = MCMCStrategy(cap_max=90, refine_start_iter=5, refine_every=5)
    losses, counts, state = _train(strategy, 31, packed=False)
    assert counts[-1] == 90 and counts[0] == 80  # 5% more per refinement up to the cap
    assert state["binoms"].shape == (51, 51)
    assert sum(losses[-6:]) < sum(losses[:6])


def _image_fit(model_type: str, iterations: int = 40, num_points: int = 150):
    """Fit random Gaussians in front of a camera to a small image (the image_fitting idea)."""
    torch.manual_seed(0)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, H), torch.linspace(0, 1, W), indexing="ij")
    gt_image = torch.stack([xx, yy, ((xx - 0.5) ** 2 + (yy - 0.5) ** 2 < 0.1).float()], -1)

    box = 2.0
    means = box * (torch.rand(num_points, 3) - 0.5)
    scales = torch.rand(num_points, 3) * 0.3
    rgbs = torch.rand(num_points, 3)
    u, v, w = torch.rand(num_points, 1), torch.rand(num_points, 1), torch.rand(num_points, 1)
    quats = torch.cat([torch.sqrt(1 - u) * torch.sin(2 * math.pi * v),
                       torch.sqrt(1 - u) * torch.cos(2 * math.pi * v),
                       torch.sqrt(u) * torch.sin(2 * math.pi * w),
                       torch.sqrt(u) * torch.cos(2 * math.pi * w)], -1)
    opacities = torch.ones(num_points)
    viewmat = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 8], [0, 0, 0, 1]])
    focal = 0.5 * W / math.tan(0.5 * math.pi / 2)
    K = torch.tensor([[focal, 0, W / 2], [0, focal, H / 2], [0, 0, 1]])
    # the example fits an image of the box at depth 8; spread the means over the view
    means[:, :2] *= 8.0
    params = [t.requires_grad_() for t in (means, scales, quats, opacities, rgbs)]
    optimizer = torch.optim.Adam(params, lr=0.05)
    rasterize_fnc = rasterization if model_type == "3dgs" else rasterization_2dgs
    losses = []
    for _ in range(iterations):
        renders = rasterize_fnc(
            means, quats / quats.norm(dim=-1, keepdim=True), scales,
            torch.sigmoid(opacities), torch.sigmoid(rgbs), viewmat[None], K[None], W, H,
            packed=False,
        )[0]
        loss = F.mse_loss(renders[0], gt_image)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("model_type", ["3dgs", "2dgs"])
def test_image_fitting(model_type):
    losses = _image_fit(model_type)
    assert losses[-1] < 0.25 * losses[0], losses[::10]
