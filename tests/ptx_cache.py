"""The PTX of the catalogue's kernels, compiled once per test run and shared by the tests that
read it (tests/test_cuda_ptx.py, test_cuda_launch_abi.py, test_cuda_resources.py): each
kernel's NVVM compile takes 5-60 s on 2 cores, and the PTX and launch-ABI tests read the same
sm_90 PTX of every kernel.

The cache is a folder in the system's temporary directory named by a digest of every source
file of the package and of numba and numba-cuda's versions, so a cached PTX is always the one
the current code compiles to. One file lock per kernel: two xdist workers that want the same
PTX compile it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

import tilesplat
from tilesplat.backends.cuda import kernels


@cache
def _folder() -> Path:
    digest = hashlib.sha256()
    root = Path(tilesplat.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    import numba
    import numba_cuda

    digest.update(f"{numba.__version__} {numba_cuda.__version__}".encode())
    folder = Path(tempfile.gettempdir()) / f"tilesplat-test-ptx-{digest.hexdigest()[:16]}"
    folder.mkdir(exist_ok=True)
    return folder


def compiled_ptx(spec: kernels.KernelSpec, ft: type, cc: tuple[int, int],
                 threads: int | None = None) -> str:
    """``kernels.compile_ptx(spec, ft, cc, threads)``, compiled once per source state."""
    name = f"{spec.name}-{np.dtype(ft).name}-sm{cc[0]}{cc[1]}-t{threads}.ptx"
    path = _folder() / name
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.is_file():
                return path.read_text()
            ptx = kernels.compile_ptx(spec, ft, cc, threads=threads)
            part = path.with_suffix(f".{os.getpid()}.part")
            part.write_text(ptx)
            part.replace(path)
            return ptx
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
