"""The shared scalar math (``backends/shared/``) compiled for the CUDA target.

``shared.typed`` casts its constants with ``like(x, c)`` and ``as_int32(x)``, and fuses
multiply-adds with ``fma``: functions given to Numba through ``numba.extending.overload``.
numba-cuda types an overload by compiling its implementation as a device function for the
*current device*, which fails on a machine without a GPU (``compile_ptx`` for sm_80/sm_90 in
CI). So the CUDA copies of the scalar functions see numba-cuda intrinsics instead: they are
typed without compiling anything and lower to one cast (``fma``: one fused multiply-add).
Everything else is ``shared`` itself.

Under the simulator (``NUMBA_ENABLE_CUDASIM=1``) the plain Python functions run as they are.
"""

from __future__ import annotations

import types
from functools import cache
from typing import Any

from numba import cuda

from .. import shared
from .runtime import SIMULATOR

if not SIMULATOR:
    from numba.cuda import types as nbtypes
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _like(typingctx, x, c):  # noqa: ARG001 - numba's intrinsic signature
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[1], signature.args[1], signature.args[0])

        return x(x, c), codegen

    @intrinsic
    def _as_int32(typingctx, x):  # noqa: ARG001
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[0], signature.args[0], nbtypes.int32)

        return nbtypes.int32(x), codegen

    @intrinsic
    def _fma(typingctx, a, b, c):  # noqa: ARG001
        def codegen(context, builder, signature, args):
            return builder.fma(*args)

        return a(a, b, c), codegen

    _OVERRIDES: dict[str, Any] = {"like": _like, "as_int32": _as_int32, "fma": _fma}
else:
    _OVERRIDES = {}


@cache
def device_math() -> types.ModuleType:
    """Every compiled function of ``shared`` as an inlined CUDA device function."""
    return shared.build(
        cuda.jit(device=True, inline=True), "tilesplat_cuda_math", overrides=_OVERRIDES
    )
