"""The trainer's spatial order (``spatial_order``): the Morton sort, the permutation of rows,
moments and statistics, the same renders in any order, and the sorts after the strategy's
edits."""

import itertools

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.strategy import DefaultStrategy, MCMCStrategy
from tilesplat.strategy.ops import reorder
from tilesplat.train.config import TrainConfig
from tilesplat.train.features.spatial_order import morton_codes, morton_order
from tilesplat.train.loop.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _sorted(means: torch.Tensor) -> bool:
    codes = morton_codes(means)
    return bool((codes[1:] >= codes[:-1]).all())


def test_morton_order_follows_the_curve():
    # a 4 x 4 x 4 grid of points, shuffled: the order visits each 2 x 2 x 2 block whole,
    # and the blocks of the first octant before any other point
    grid = torch.tensor(list(itertools.product(range(4), repeat=3)), dtype=torch.float32)
    shuffled = grid[torch.randperm(64, generator=torch.Generator().manual_seed(0))]
    order = morton_order(shuffled)
    assert sorted(order.tolist()) == list(range(64))
    walked = shuffled[order]
    for block in range(8):
        cells = walked[8 * block:8 * block + 8]
        assert len({tuple((c // 2).tolist()) for c in cells}) == 1, block
    assert (walked[:32] < 2).all(dim=1).sum() == 8 and (walked[:8] < 2).all()
    assert _sorted(walked) and not _sorted(shuffled)


def test_morton_order_edge_cases():
    assert morton_order(torch.zeros(0, 3)).tolist() == []
    assert morton_order(torch.ones(1, 3)).tolist() == [0]
    # one point at a time, all at one place, non-finite centres: a permutation, ties in order
    assert morton_order(torch.ones(5, 3)).tolist() == [0, 1, 2, 3, 4]
    bad = torch.tensor([[float("nan"), 0, 0], [1.0, float("inf"), 2], [0.5, 0.5, 0.5]])
    assert sorted(morton_order(bad).tolist()) == [0, 1, 2]
    # a far outlier is clamped to the box and does not squeeze the others into one cell
    pts = torch.cat([torch.rand(999, 3, generator=torch.Generator().manual_seed(1)),
                     torch.tensor([[1e9, 1e9, 1e9]])])
    assert len(torch.unique(morton_codes(pts))) == 1000


def _model(n: int = 7):
    g = torch.Generator().manual_seed(0)
    params = {k: torch.nn.Parameter(torch.randn(n, *shape, generator=g))
              for k, shape in (("means", (3,)), ("scales", (3,)), ("quats", (4,)),
                               ("opacities", ()), ("sh0", (1, 3)), ("shN", (3, 3)))}
    opts = {k: torch.optim.Adam([p], lr=1e-2) for k, p in params.items()}
    sum((p**2).sum() for p in params.values()).backward()
    for o in opts.values():
        o.step()
        o.zero_grad()
    return params, opts


def test_reorder_moves_rows_moments_and_statistics_together():
    params, opts = _model()
    before = {k: p.detach().clone() for k, p in params.items()}
    moments = {k: {m: v.clone() for m, v in opts[k].state[params[k]].items()} for k in params}
    state = {"grad2d": torch.arange(7.0), "count": torch.arange(7.0) * 2, "radii": None,
             "scene_scale": 3.0}
    order = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    reorder(params, opts, state, order, DefaultStrategy().row_state(state))
    for k, p in params.items():
        assert torch.equal(p.detach(), before[k][order]), k
        assert opts[k].param_groups[0]["params"][0] is p
        st = opts[k].state[p]
        assert torch.equal(st["exp_avg"], moments[k]["exp_avg"][order])
        assert torch.equal(st["exp_avg_sq"], moments[k]["exp_avg_sq"][order])
        assert torch.equal(st["step"], moments[k]["step"])
    assert torch.equal(state["grad2d"], torch.arange(7.0)[order])
    assert torch.equal(state["count"], torch.arange(7.0)[order] * 2)
    assert state["radii"] is None and state["scene_scale"] == 3.0


def test_mcmc_state_is_not_per_gaussian():
    # binoms is a [51, 51] table: a model of 51 Gaussians must not permute it
    mcmc = MCMCStrategy()
    state = mcmc.initialize_state(scene_scale=1.0)
    table = state["binoms"].clone()
    params, opts = _model(51)
    reorder(params, opts, state, torch.arange(51).flip(0), mcmc.row_state(state))
    assert torch.equal(state["binoms"], table)


@pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
def test_cpu_render_and_gradients_do_not_depend_on_the_order(scheme):
    from tilesplat import rasterization

    g = torch.Generator().manual_seed(2)
    n, w, h = 300, 37, 29
    means = torch.randn(n, 3, generator=g) * 0.6 + torch.tensor([0.0, 0.0, 3.0])
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.08 + 0.01
    opac = torch.rand(n, generator=g)
    colors = torch.rand(n, 3, generator=g)
    viewmat = torch.eye(4)[None]
    K = torch.tensor([[[40.0, 0, w / 2], [0, 40.0, h / 2], [0, 0, 1]]])
    up = torch.randn(1, h, w, 3, generator=g)

    def run(perm):
        leaves = [t[perm].clone().requires_grad_(True)
                  for t in (means, quats, scales, opac, colors)]
        img, alpha, _ = rasterization(*leaves, viewmat, K, w, h, backend="cpu",
                                      backward_scheme=scheme)
        (img * up).sum().backward()
        return img.detach(), alpha.detach(), [x.grad for x in leaves]

    ident = torch.arange(n)
    perm = morton_order(means)
    img0, a0, g0 = run(ident)
    img1, a1, g1 = run(perm)
    assert torch.equal(img0, img1) and torch.equal(a0, a1)
    for x, y in zip(g0, g1, strict=True):
        assert torch.equal(x[perm], y)


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=1,
                                     size=16)
    return load_dataset(folder)


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_trainer_sorts_at_the_start_and_after_each_edit(tiny_scene, tmp_path, strategy):
    cfg = TrainConfig(steps=14, batch_size=2, init_points=100, sh_degree=1, refine_start=2,
                      refine_every=3, refine_stop=12, reset_every=100, grow_grad2d=1e-5,
                      strategy=strategy, cap_max=200, checkpoint_every=0, progress=False,
                      lpips=False, backend="torch").validate()
    trainer = Trainer(cfg, tiny_scene, tmp_path / "run", log=lambda s: None)
    assert _sorted(trainer.params["means"])  # the initial model
    order = trainer.steps.order
    assert order is not None
    for step in range(cfg.steps):
        trainer.step = step
        before = order.sorts
        trainer.train_step(step)
        if order.sorts > before:  # an edit of the strategy: sorted again, moments aligned
            assert _sorted(trainer.params["means"]), step
            for k, p in trainer.params.items():
                st = trainer.optimizers[k].state[p]
                assert st["exp_avg"].shape == p.shape, k
    assert order.sorts >= 3, order.sorts
    off = Trainer(cfg.replace(spatial_order=False).validate(),
                  tiny_scene, tmp_path / "off", log=lambda s: None)
    assert off.steps.order is None
