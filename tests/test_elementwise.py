"""The parameters' activations give the same bits for any torch thread count (ops/elementwise.py):
torch's own sigmoid and exp take a scalar loop at the end of each thread's share of a large
tensor, whose last bit differs from the vector loop's for some inputs."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tilesplat.ops import elementwise
from tilesplat.train.models.splats import activated

# sizes around one and two pieces: each thread's share ends at another element, so across
# them several thousand elements fall in a share's scalar tail
SIZES = [elementwise.GRAIN + k for k in range(1, 40)] + [2 * elementwise.GRAIN + 37, 100_003]


@contextlib.contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _inputs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * 4.0


@pytest.mark.parametrize("name", ["sigmoid", "exp", "log", "logit"])
def test_forward_same_bits_for_one_and_two_threads(name):
    fn = getattr(elementwise, name)
    for k, n in enumerate(SIZES):
        x = _inputs(n, k)
        if name in ("log", "logit"):
            x = torch.sigmoid(x)  # in (0, 1): both defined
        with torch_threads(1):
            one = fn(x)
            reference = getattr(torch, name)(x)
        with torch_threads(2):
            two = fn(x)
        assert torch.equal(one, two), f"{name}, {n} elements: {int((one != two).sum())} differ"
        # one thread: torch's own bits (the pieces are whole multiples of its vector stride)
        assert torch.equal(one, reference), f"{name}, {n} elements: not torch's one-thread bits"


@pytest.mark.parametrize("name", ["sigmoid", "exp"])
def test_gradients_same_bits_and_torch_formula(name):
    for k, n in enumerate(SIZES[::6]):
        x = _inputs(n, 100 + k).reshape(-1, 1) if k % 2 else _inputs(n, 100 + k)
        up = _inputs(n, 200 + k).reshape(x.shape)
        grads = []
        for threads in (1, 2):
            with torch_threads(threads):
                leaf = x.clone().requires_grad_(True)
                y = getattr(elementwise, name)(leaf)
                (y * up).sum().backward()
                grads.append((y.detach(), leaf.grad))
        (y1, g1), (y2, g2) = grads
        assert torch.equal(y1, y2) and torch.equal(g1, g2), f"{name}, {n} elements"
        with torch_threads(1):
            leaf = x.clone().requires_grad_(True)
            (getattr(torch, name)(leaf) * up).sum().backward()
        assert torch.equal(g1, leaf.grad), f"{name}, {n} elements: not torch's gradient"


def test_small_and_strided_inputs_match_torch():
    x = _inputs(5 * (elementwise.GRAIN + 3), 7).reshape(-1, 5)[:, 1:4]  # not contiguous
    assert not x.is_contiguous()
    for name in ("sigmoid", "exp"):
        with torch_threads(2):
            strided = getattr(elementwise, name)(x)
        with torch_threads(1):
            # the bits of the values, not of their layout (torch's own op on a strided
            # tensor takes its scalar loop for rows this short)
            assert torch.equal(strided, getattr(torch, name)(x.contiguous()))
    empty = torch.zeros(0, 3)
    assert elementwise.exp(empty).shape == (0, 3)
    small = _inputs(11, 8).requires_grad_(True)
    assert elementwise.sigmoid(small).grad_fn is not None


def test_trainer_activations_do_not_depend_on_torch_threads():
    """The renderer's scales and opacities of a model of ~33,000 Gaussians (sizes whose
    threads' shares end in scalar tails), and their gradients, are the same bits with one
    torch thread and two."""
    for k, n in enumerate(SIZES[::3]):
        g = torch.Generator().manual_seed(k)
        params = {
            "means": torch.randn(n, 3, generator=g), "quats": torch.randn(n, 4, generator=g),
            "scales": torch.randn(n, 3, generator=g) - 4.0,
            "opacities": torch.randn(n, generator=g) * 3.0,
            "sh0": torch.randn(n, 1, 3, generator=g), "shN": torch.randn(n, 3, 3, generator=g),
        }  # fmt: skip
        outs = []
        for threads in (1, 2):
            with torch_threads(threads):
                leaves = {key: v.clone().requires_grad_(True) for key, v in params.items()}
                act = activated(leaves)
                (act["scales"].square().sum() + act["opacities"].square().sum()).backward()
                outs.append([act["scales"].detach(), act["opacities"].detach(),
                             leaves["scales"].grad, leaves["opacities"].grad])
        for name, a, b in zip(("scales", "opacities", "v_scales", "v_opacities"), *outs,
                              strict=True):
            assert torch.equal(a, b), f"{n} Gaussians: {name} differs between 1 and 2 threads"
