"""The vector width of tilesplat's CPU kernels: the whole AVX-512 register where the CPU has one.

LLVM tunes most Intel CPUs with AVX-512 (Skylake-SP to Granite Rapids, and the client cores
it takes them for in a virtual machine) to prefer 256-bit vectors ("prefer-256-bit"): on the
first of them a 512-bit instruction lowered the clock of the whole core. It then vectorises a
float32 loop 8 lanes wide where the hardware holds 16; on AMD's Zen 4 and 5 it already uses
the 512-bit registers. The rasterizer's per-pair loops are arithmetic, not memory, bound, and
on a 2-core Intel Xeon with AMX (LLVM's host name ``rocketlake``) at 1 M Gaussians the forward
ran 1.19-1.21x and the backward 1.08x faster with 16 lanes (docs/benchmarks.md).

:func:`prefer_wide_vectors` asks Numba's CPU target for the host's own features without that
preference (``NUMBA_CPU_FEATURES``). It must run before Numba compiles or loads its first
function in the process, because Numba makes its one LLVM target machine then; every tilesplat
module that defines CPU kernels calls it at import, before its first ``@njit``. It changes
nothing where:

- the CPU has no AVX-512 (the preference has no 512-bit alternative there);
- the user chose the target (``NUMBA_CPU_NAME`` or ``NUMBA_CPU_FEATURES`` set);
- ``TILESPLAT_WIDE_VECTORS=0``;
- Numba already made its target machine (another library compiled first): the kernels keep
  LLVM's width, and the results are as valid.

The setting is Numba's and the process's: the user's own ``@njit`` functions and the child
processes (``--nproc`` ranks) compile for it too. Numba's cache keeps the target's features
in its index, so kernels cached for one width are not loaded for the other. Sums whose order
follows the vector width (the rasterizer backward's per-Gaussian reductions) round otherwise
than at 8 lanes, as they do between an AVX2 and an AVX-512 host; a run stays bit-reproducible
on its machine.
"""

from __future__ import annotations

import os
import sys

OFF = "-prefer-256-bit"
_applied: bool | None = None


def prefer_wide_vectors() -> bool:
    """Set ``NUMBA_CPU_FEATURES`` to the host's features with ``-prefer-256-bit`` where that
    applies (see the module); once a process. True when the kernels will compile 512 bits
    wide by this call's doing."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("TILESPLAT_WIDE_VECTORS", "1").strip() == "0":
        return False
    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES"):
        return False
    if _target_made():
        return False
    import llvmlite.binding as ll

    features = ll.get_host_cpu_features()
    if not features.get("avx512f", False):
        return False
    os.environ["NUMBA_CPU_FEATURES"] = f"{features.flatten()},{OFF}"
    if "numba.core.config" in sys.modules:  # read again at the next compile; now for clarity
        sys.modules["numba.core.config"].reload_config()
    return True


def _target_made() -> bool:
    """Whether Numba already made its CPU target (and with it the LLVM target machine)."""
    registry = sys.modules.get("numba.core.registry")
    if registry is None:
        return False
    return "_toplevel_target_context" in vars(registry.cpu_target)


def wide_vectors_on() -> bool:
    """Whether this process's Numba CPU target was asked for 512-bit vectors (by this module
    or by the user's own ``NUMBA_CPU_FEATURES``)."""
    return OFF in os.environ.get("NUMBA_CPU_FEATURES", "").split(",")
