"""The parameters' activations (``exp``, ``sigmoid``) and their inverses (``log``, ``logit``)
with bits that do not depend on torch's thread count.

On the CPU torch splits an elementwise op over more than :data:`GRAIN` elements into one
share per thread. Each share runs a vectorised loop and leaves its last elements (fewer than
two vectors) to a scalar loop; for the transcendental functions the two loops differ in the
last bit for some inputs (the vector loop's exponential is SLEEF's, the scalar loop's the C
library's). Which elements take the scalar loop, and so a run's trained bits, then change
with the thread count: the tests' room capture, 3DGS recipe, seed 0, at 36,781 Gaussians,
one torch thread against two, rendered other colours at step 903 from two opacities'
sigmoids (elements 18,384 and 36,764, at the ends of the two threads' shares), and ended
0.11 dB apart (37.08 against 37.19 dB). Here the op runs over fixed pieces of :data:`GRAIN`
elements, each on one thread: the pieces and their scalar tails depend on the tensor's size
alone, and on a contiguous tensor one thread gives torch's own bits (the pieces are whole
multiples of every vector loop's stride; a strided tensor is made contiguous first). The
gradients are torch's formulas, of exact operations only (``v * (1 - y) * y``, ``v * y``),
so they keep that. On other devices the ops are torch's own. The cost: the pieces run one
at a time; at 3 M Gaussians the scales' exp and the opacities' sigmoid, forward and backward,
took 29.4 ms against torch's 26.4 (2 cores), where a CPU step takes seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# at::internal::GRAIN_SIZE: torch runs an elementwise op over at most this many elements on
# one thread; a multiple of every vector loop's stride (2 x 16 float32 lanes with AVX-512)
GRAIN = 32_768


def _one_piece(x: Tensor) -> bool:
    """Whether torch's own op already gives ``x`` the same bits for any thread count: off
    the CPU, or at most one piece."""
    return x.device.type != "cpu" or x.numel() <= GRAIN


def by_pieces(fn: Callable[..., Tensor], x: Tensor) -> Tensor:
    """``fn(x)`` for an elementwise torch function ``fn`` that takes ``out=``, computed over
    pieces of :data:`GRAIN` elements on the CPU (the same bits for any thread count); ``fn(x)``
    itself elsewhere or when ``x`` is one piece. No gradient flows (see :func:`exp`,
    :func:`sigmoid`).

    Args:
        x: any shape. [...]

    Returns:
        a new tensor of ``x``'s shape and dtype. [...]
    """
    x = x.detach()
    if _one_piece(x):
        return fn(x)
    x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    flat_x, flat_out = x.view(-1), out.view(-1)
    for start in range(0, flat_x.numel(), GRAIN):
        fn(flat_x[start:start + GRAIN], out=flat_out[start:start + GRAIN])
    return out


_TORCH = {"exp": torch.exp, "sigmoid": torch.sigmoid}


class _Activation(torch.autograd.Function):
    """``exp`` or ``sigmoid`` by pieces; the gradient from the saved output, as torch's."""

    @staticmethod
    def forward(ctx, x: Tensor, name: str) -> Tensor:  # type: ignore[override]
        y = by_pieces(_TORCH[name], x)
        ctx.save_for_backward(y)
        ctx.name = name
        return y

    @staticmethod
    def backward(ctx, v_y: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        if ctx.name == "sigmoid":
            return v_y * (1 - y) * y, None  # torch's sigmoid_backward, in its order
        return v_y * y, None


def _activation(name: str, x: Tensor) -> Tensor:
    if _one_piece(x):
        return _TORCH[name](x)
    if x.requires_grad and torch.is_grad_enabled():
        return _Activation.apply(x, name)
    return by_pieces(_TORCH[name], x)


def exp(x: Tensor) -> Tensor:
    """``torch.exp(x)`` with the same bits for any thread count on the CPU (differentiable).

    Args:
        x: e.g. the log-scales. [...]
    """
    return _activation("exp", x)


def sigmoid(x: Tensor) -> Tensor:
    """``torch.sigmoid(x)`` with the same bits for any thread count on the CPU
    (differentiable).

    Args:
        x: e.g. the opacity logits. [...]
    """
    return _activation("sigmoid", x)


def log(x: Tensor) -> Tensor:
    """``torch.log(x)``, the same bits for any thread count (no gradient). [...]"""
    return by_pieces(torch.log, x)


def logit(x: Tensor) -> Tensor:
    """``torch.logit(x)``, the same bits for any thread count (no gradient). [...]"""
    return by_pieces(torch.logit, x)
