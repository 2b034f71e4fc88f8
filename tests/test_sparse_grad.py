"""``sparse_grad=True`` (gsplat 1.5.3): with ``packed=True`` the projection's gradients of
means, quats, scales (or covars) come back as sparse COO tensors over the Gaussians some
camera sees. Their values are the dense gradient's rows, on every backend; gsplat's
refusals are one-line ``ValueError``s naming the argument; ``torch.optim.SparseAdam`` takes
them as in gsplat's examples."""

from __future__ import annotations

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians

C, N, W, H = 2, 40, 32, 24
BACKENDS = ["torch", "cpu"]


def _scene(seed: int = 3):
    means, quats, scales, opacities, colors = random_gaussians(N, seed=seed, spread=3.0,
                                                               scale=0.2)
    viewmats, Ks = cameras(C, W, H)
    return means, quats, scales, opacities, colors, viewmats, Ks


def _loss(outs, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs)


def _check_sparse(name: str, sparse: torch.Tensor, dense: torch.Tensor, rows: torch.Tensor):
    assert sparse.is_sparse, name
    assert sparse.shape == dense.shape, name
    assert torch.equal(sparse._indices()[0], rows), name
    assert torch.equal(sparse.to_dense(), dense), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_covars", [False, True])
def test_projection_gradients_are_the_dense_rows_of_the_visible(backend, with_covars):
    means, quats, scales, _, _, viewmats, Ks = _scene()
    covars = None
    if with_covars:
        covars = torch.cat([scales[:, :1] ** 2, 0.01 * quats[:, :2], scales[:, 1:2] ** 2,
                            0.01 * quats[:, 2:3], scales[:, 2:] ** 2], dim=-1)

    def run(sparse_grad):
        leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales)]
        cov = None if covars is None else covars.clone().requires_grad_(True)
        out = tilesplat.fully_fused_projection(
            leaves[0], cov, None if cov is not None else leaves[1],
            None if cov is not None else leaves[2], viewmats, Ks, W, H, packed=True,
            sparse_grad=sparse_grad, backend=backend)
        _loss(out[4:7]).backward()
        grads = [leaves[0].grad] + ([cov.grad] if cov is not None else
                                    [leaves[1].grad, leaves[2].grad])
        return out[2], grads

    ids, dense = run(False)
    ids_sparse, sparse = run(True)
    rows = torch.unique(ids)
    assert 0 < rows.numel() < N  # some Gaussians culled: the test tells rows apart
    assert torch.equal(ids, ids_sparse)
    for i, (s, d) in enumerate(zip(sparse, dense, strict=True)):
        _check_sparse(f"input {i}", s, d, rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rasterization_sparse_grad(backend):
    """The whole render: means, quats, scales sparse (colours, opacities dense, as gsplat's:
    they are gathered per pair by plain indexing); values equal the dense render's."""
    means, quats, scales, opacities, colors, viewmats, Ks = _scene()

    def run(sparse_grad):
        leaves = [t.clone().requires_grad_(True)
                  for t in (means, quats, scales, opacities, colors)]
        out = tilesplat.rasterization(*leaves, viewmats, Ks, W, H, packed=True,
                                      sparse_grad=sparse_grad, backend=backend)
        _loss(out[:2]).backward()
        return out[2], [t.grad for t in leaves]

    _, dense = run(False)
    meta, sparse = run(True)
    rows = torch.unique(meta["gaussian_ids"])
    for name, s, d in zip(("means", "quats", "scales"), sparse, dense, strict=False):
        _check_sparse(name, s, d, rows)
    for s, d in zip(sparse[3:], dense[3:], strict=True):
        assert not s.is_sparse and torch.equal(s, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rasterization_with_covars_sparse_grad(backend):
    means, quats, scales, opacities, colors, viewmats, Ks = _scene()
    covars = torch.diag_embed(scales**2)

    def run(sparse_grad):
        m, cov = means.clone().requires_grad_(True), covars.clone().requires_grad_(True)
        out = tilesplat.rasterization(m, None, None, opacities, colors, viewmats, Ks, W, H,
                                      covars=cov, packed=True, sparse_grad=sparse_grad,
                                      backend=backend)
        _loss(out[:2]).backward()
        return out[2], [m.grad, cov.grad]

    _, dense = run(False)
    meta, sparse = run(True)
    rows = torch.unique(meta["gaussian_ids"])
    for name, s, d in zip(("means", "covars"), sparse, dense, strict=True):
        _check_sparse(name, s, d, rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_2dgs_sparse_grad(backend):
    means, quats, scales, opacities, colors, viewmats, Ks = _scene()

    def run(sparse_grad):
        leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales)]
        out = tilesplat.rasterization_2dgs(*leaves, opacities, colors, viewmats, Ks, W, H,
                                           packed=True, sparse_grad=sparse_grad,
                                           backend=backend)
        _loss(out[:3]).backward()
        return out[-1], [t.grad for t in leaves]

    _, dense = run(False)
    meta, sparse = run(True)
    rows = torch.unique(meta["gaussian_ids"])
    assert 0 < rows.numel() < N
    for name, s, d in zip(("means", "quats", "scales"), sparse, dense, strict=True):
        assert s.is_sparse and torch.equal(s._indices()[0], rows), name
        torch.testing.assert_close(s.to_dense(), d, atol=1e-6, rtol=1e-6, msg=name)


def test_gsplat_refusals():
    """gsplat asserts packed=True (and, for the 3DGS projection, no batch dims)."""
    means, quats, scales, opacities, colors, viewmats, Ks = _scene()
    cases = [
        lambda: tilesplat.fully_fused_projection(means, None, quats, scales, viewmats, Ks, W,
                                                 H, packed=False, sparse_grad=True),
        lambda: tilesplat.fully_fused_projection(means[None], None, quats[None], scales[None],
                                                 viewmats[None], Ks[None], W, H, packed=True,
                                                 sparse_grad=True),
        lambda: tilesplat.rasterization(means, quats, scales, opacities, colors, viewmats, Ks,
                                        W, H, packed=False, sparse_grad=True),
        lambda: tilesplat.rasterization_2dgs(means, quats, scales, opacities, colors,
                                             viewmats, Ks, W, H, sparse_grad=True),
        lambda: tilesplat.fully_fused_projection_2dgs(means, quats, scales, viewmats, Ks, W,
                                                      H, packed=False, sparse_grad=True),
    ]
    for case in cases:
        with pytest.raises(ValueError, match=r"sparse_grad=True\) (needs packed=True|does "
                                             r"not support batch dimensions)") as e:
            case()
        assert "\n" not in str(e.value)


def test_sparse_adam_updates_only_the_visible_rows():
    """gsplat's examples: SparseAdam on the parameters that receive sparse gradients. One
    step equals dense Adam's (whose first step moves a zero-gradient row by 0) and leaves
    the rows of the Gaussians no camera sees exactly as they were."""
    means, quats, scales, opacities, colors, viewmats, Ks = _scene()

    def step(optimizer_cls, sparse_grad):
        params = [torch.nn.Parameter(t.clone()) for t in (means, quats, scales)]
        opt = optimizer_cls(params, lr=1e-2)
        out = tilesplat.rasterization(*params, opacities, colors, viewmats, Ks, W, H,
                                      packed=True, sparse_grad=sparse_grad, backend="cpu")
        _loss(out[:2]).backward()
        assert all(p.grad.is_sparse == sparse_grad for p in params)
        opt.step()
        return out[2]["gaussian_ids"], [p.detach() for p in params]

    ids, sparse = step(torch.optim.SparseAdam, True)
    _, dense = step(torch.optim.Adam, False)
    hidden = torch.ones(N, dtype=torch.bool)
    hidden[ids] = False
    assert hidden.any()
    for before, s, d in zip((means, quats, scales), sparse, dense, strict=True):
        torch.testing.assert_close(s, d, atol=1e-5, rtol=1e-6)
        assert torch.equal(s[hidden], before[hidden])
        assert not torch.equal(s[~hidden], before[~hidden])
