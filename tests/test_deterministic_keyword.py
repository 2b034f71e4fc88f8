"""``rasterization(..., deterministic=)`` (tilesplat's extension; gsplat 1.5.3 has no such
keyword): validation, and bit-identical gradients on the CPU backends. That it reaches the
cuda backend's fixed-order backward for one call is tested in the simulator
(tests/test_cuda_sim.py)."""

from __future__ import annotations

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians


def _grads(render, backend: str, **kw):
    C, N, width, height = 2, 12, 24, 16
    means, quats, scales, opacities, colors = random_gaussians(N, seed=3, spread=0.8,
                                                               scale=0.3)
    viewmats, Ks = cameras(C, width, height)
    leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities, colors)]
    out = render(*leaves, viewmats, Ks, width, height, tile_size=8, backend=backend, **kw)
    g = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in out[:2])
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("render", [tilesplat.rasterization, tilesplat.rasterization_2dgs])
@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_a_non_bool_is_one_line_naming_the_argument(render, value):
    with pytest.raises(ValueError, match=r"^deterministic must be True, False or None") as e:
        _grads(render, "torch", deterministic=value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_the_keyword_gives_bitwise_equal_gradients(backend):
    """On the CPU every backend is bit-exact; the keyword changes nothing there (the default
    ``None`` and ``False`` give the very same bits)."""
    first = _grads(tilesplat.rasterization, backend, deterministic=True)
    for kw in ({"deterministic": True}, {}, {"deterministic": False}):
        again = _grads(tilesplat.rasterization, backend, **kw)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)


def test_gsplat_signature_is_kept():
    """The keyword is keyword-only, after gsplat's positional parameters."""
    import inspect

    params = inspect.signature(tilesplat.rasterization).parameters
    assert params["deterministic"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["deterministic"].default is None


def test_true_with_the_torch_reference_on_a_gpu_is_refused():
    """The reference adds gradients with PyTorch's atomic index ops on a GPU (the trainer's
    key refuses the same); on the CPU, or with the cuda backend, True is fine."""
    from tilesplat.ops.validation import check_deterministic

    with pytest.raises(ValueError, match=r"deterministic=True with the torch backend on cuda"):
        check_deterministic(True, torch.device("cuda"), "torch")
    assert check_deterministic(True, torch.device("cuda"), "cuda") is True
    assert check_deterministic(True, torch.device("cpu"), "torch") is True
    assert check_deterministic(None, torch.device("cuda"), "torch") is None
