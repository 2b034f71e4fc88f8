"""The CPU kernels' vector width (``backends/vector_width.py``): on a CPU with AVX-512 the
kernels compile for the 512-bit registers unless the user chose Numba's target, turned it off,
or Numba made its target before tilesplat loaded; elsewhere nothing changes. Each case runs in
a fresh process: Numba makes its target once a process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as ll
import pytest

HOST = ll.get_host_cpu_features()
AVX512 = bool(HOST.get("avx512f", False))
TESTS = str(Path(__file__).parent)


def _run(code: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "TILESPLAT_WIDE_VECTORS")}
    prog = (
        "import json, os, sys\n"
        f"sys.path.insert(0, {TESTS!r})\n"
        f"{code}\n"
        "from tilesplat.backends.vector_width import wide_vectors_on\n"
        "print(json.dumps({'features': os.environ.get('NUMBA_CPU_FEATURES'),\n"
        "                  'on': wide_vectors_on(), **out}))\n"
    )
    res = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                         timeout=600, env={**clean, **env})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_cpu_backend_asks_for_the_whole_register_where_there_is_one():
    """What the code must do is ask Numba's target for the features; which width LLVM then
    picks for a loop is the compiler's (it is 16 float32 lanes on the hosts measured,
    docs/benchmarks.md), so only the request and the vectorisation are asserted."""
    got = _run("import tilesplat.backends.cpu\n"
               "from test_cpu_backend import blend_tile_asm, packed_float_ops\n"
               "from numba.core.registry import cpu_target\n"
               "asm = blend_tile_asm()  # Numba makes its target here\n"
               "out = {'target': cpu_target.target_context.codegen().magic_tuple()[2],\n"
               "       'packed': packed_float_ops(asm)}")
    assert got["packed"] > 20  # vectorised either way (test_cpu_backend)
    if AVX512:
        want = HOST.flatten() + ",-prefer-256-bit"
        assert got["on"] and got["features"] == want
        assert got["target"] == want, "Numba's target machine was made without the request"
    else:  # no 512-bit alternative: Numba's target untouched
        assert not got["on"] and got["features"] is None
        assert "-prefer-256-bit" not in got["target"]


def test_the_users_choice_and_the_switch_are_kept():
    mine = HOST.flatten()
    got = _run("import tilesplat.backends.cpu\nout = {}", NUMBA_CPU_FEATURES=mine)
    assert got["features"] == mine and not got["on"]
    got = _run("import tilesplat.backends.cpu\nout = {}", NUMBA_CPU_NAME="generic")
    assert got["features"] in (None, "") and not got["on"]
    got = _run("import tilesplat.backends.cpu\nout = {}", TILESPLAT_WIDE_VECTORS="0")
    assert got["features"] is None and not got["on"]


def test_a_target_numba_already_made_is_left_alone():
    got = _run("from numba import njit\n"
               "njit(lambda x: x + 1)(1)  # Numba makes its target here\n"
               "import tilesplat.backends.cpu\n"
               "from tilesplat.backends.vector_width import prefer_wide_vectors\n"
               "out = {'applied': prefer_wide_vectors()}")
    assert got["features"] is None and not got["applied"] and not got["on"]


def _kernel_modules() -> list[str]:
    """Every tilesplat module that defines a Numba CPU function (an ``@njit`` / ``@jit``
    decorator in its source), outside ``backends/cpu``, and one module of ``backends/cpu``:
    importing any module of that package imports the package first, which asks for the width
    (``backends/cpu/__init__.py``)."""
    src = Path(__file__).resolve().parents[1] / "src"
    found = []
    for path in sorted((src / "tilesplat").rglob("*.py")):
        if re.search(r"^\s*@(numba\.)?n?jit\b", path.read_text(), re.MULTILINE):
            found.append(".".join(path.relative_to(src).with_suffix("").parts))
    inside = [m for m in found if m.startswith("tilesplat.backends.cpu.")]
    return [m for m in found if not m.startswith("tilesplat.backends.cpu.")] + inside[:1]


@pytest.mark.parametrize("module", _kernel_modules())
def test_every_module_with_kernels_asks_for_the_width_before_they_compile(module):
    """Numba makes its one target machine at the first compile of the process, so a module
    whose kernel can be the first to compile (the alpha composite runs when a dataset loads,
    before the CPU backend is imported) must ask first: otherwise every kernel of the
    process compiles 256 bits wide, slower and rounding its sums otherwise."""
    got = _run(f"import {module}\n"
               "from numba import njit\n"
               "from numba.core.registry import cpu_target\n"
               "njit(lambda x: x + 1)(1)  # Numba makes its target here, after the import\n"
               "from tilesplat.backends import vector_width\n"
               "out = {'asked': vector_width._applied is not None,\n"
               "       'target': cpu_target.target_context.codegen().magic_tuple()[2]}")
    assert got["asked"], f"importing {module} did not ask for the vector width"
    assert ("-prefer-256-bit" in got["target"]) == AVX512
