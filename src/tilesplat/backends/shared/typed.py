"""Typed scalar intrinsics of the shared math: constants in the float type of a value, 32-bit
integer conversion, exact powers of two, and the fused multiply-add.

Numba types a Python float literal as float64 and promotes what it touches, so a float32
kernel would silently compute in float64: every constant of the shared math goes through
``like(x, c)`` (``c`` cast to the type of ``x``, folded away), and every float-to-int
conversion through ``as_int32`` (a 64-bit one keeps loops from vectorising). Each one is a
plain Python function (the plain-Python meaning, in ``backends/scalar_types.py``, which
imports without Numba) with a Numba ``overload`` here (the compiled one); the CUDA target
replaces ``like`` and ``as_int32`` by intrinsics of its own (``cuda/device_math.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types as nb_types
from numba.extending import intrinsic, overload

from ..scalar_types import as_int32, fma, like, pow2_neg

# The helpers below are called by the compiled functions; none is compiled by ``build``.
FUNCTIONS: tuple[str, ...] = ()


@overload(like, inline="always")
def _like_overload(x, c):
    target = x

    def impl(x, c):  # pragma: no cover - compiled
        return target(c)

    return impl


@overload(as_int32, inline="always")
def _as_int32_overload(x):
    def impl(x):  # pragma: no cover - compiled
        return np.int32(x)

    return impl


@intrinsic
def _pow2_neg_bits(typingctx, x, n):
    if not isinstance(x, nb_types.Float) or not isinstance(n, nb_types.Integer):
        return None
    bits = x.bitwidth
    bias, mantissa = (127, 23) if bits == 32 else (1023, 52)

    def codegen(context, builder, signature, args):
        ity = ir.IntType(bits)
        n_val = context.cast(builder, args[1], signature.args[1],
                             nb_types.int32 if bits == 32 else nb_types.int64)
        exponent = builder.sub(ir.Constant(ity, bias), n_val)
        field = builder.shl(exponent, ir.Constant(ity, mantissa))
        return builder.bitcast(field, context.get_value_type(signature.return_type))

    return x(x, n), codegen


@overload(pow2_neg, inline="always")
def _pow2_neg_overload(x, n):
    def impl(x, n):  # pragma: no cover - compiled
        return _pow2_neg_bits(x, n)

    return impl


@intrinsic
def _fma_ir(typingctx, a, b, c):
    if not (isinstance(a, nb_types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)  # llvm.fma: rounded once, never split by a target

    return a(a, b, c), codegen


@overload(fma, inline="always")
def _fma_overload(a, b, c):
    def impl(a, b, c):  # pragma: no cover - compiled
        return _fma_ir(a, b, c)

    return impl
