"""Numba's cache of the CPU kernels follows the code compiled into them
(``tilesplat.backends.kernel_cache``): a kernel is reloaded while nothing changed, and
recompiled when only an inlined file (``scalar_math.py``) changed, which Numba alone misses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numba

import tilesplat
from tilesplat.backends import kernel_cache

# One process: the covariance kernel on 5 Gaussians, then its Numba cache statistics.
PROBE = """
import json, torch, tilesplat
from tilesplat.backends.cpu import covariance
q, s = torch.randn(5, 4), torch.rand(5, 3) + 0.1
tilesplat.quat_scale_to_covar_preci(q, s, backend="cpu")
st = covariance.forward_kernel.stats
print(json.dumps({"hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values()),
                  "file": tilesplat.__file__}))
"""


def test_the_kernels_use_the_dependency_aware_locator():
    from tilesplat.backends.cpu import covariance
    from tilesplat.bench import ceiling

    assert kernel_cache.install()  # installed (already, by the cpu backend); idempotent
    for kernel in (covariance.forward_kernel, ceiling._tile_pairs):
        locator = kernel._cache._impl.locator
        assert type(locator).__name__.startswith("Tilesplat"), type(locator)
        own, digest = locator.get_source_stamp()
        assert digest == kernel_cache.dependency_digest() and len(digest) == 64


def test_the_stamp_changes_with_any_compiled_in_file(monkeypatch):
    from tilesplat.backends.cpu import covariance

    locator = covariance.forward_kernel._cache._impl.locator
    before = locator.get_source_stamp()
    monkeypatch.setattr(kernel_cache, "dependency_digest", lambda: "0" * 64)
    assert locator.get_source_stamp() != before
    assert locator.get_source_stamp()[0] == before[0]  # the kernel file's own stamp


def test_functions_outside_the_package_keep_numbas_locator(tmp_path):
    module = tmp_path / "outside_module.py"
    module.write_text("def f(x):\n    return x + 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import outside_module

        dispatcher = numba.njit(cache=True)(outside_module.f)
        assert not type(dispatcher._cache._impl.locator).__name__.startswith("Tilesplat")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("outside_module", None)


def test_an_edit_of_an_inlined_file_recompiles_the_kernels(tmp_path):
    package = os.path.dirname(tilesplat.__file__)
    shutil.copytree(package, tmp_path / "src" / "tilesplat",
                    ignore=shutil.ignore_patterns("__pycache__", "assets"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"),
           "NUMBA_CACHE_DIR": str(tmp_path / "numba_cache")}
    env.pop("NUMBA_DISABLE_JIT", None)

    def probe() -> dict:
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                             text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    first = probe()
    assert first["file"].startswith(str(tmp_path)) and first["misses"] >= 1
    assert probe() == {**first, "hits": 1, "misses": 0}  # unchanged: loaded from the cache
    scalar_math = tmp_path / "src" / "tilesplat" / "backends" / "scalar_math.py"
    scalar_math.write_text(scalar_math.read_text() + "\n# an edit\n")
    edited = probe()
    assert edited["misses"] >= 1 and edited["hits"] == 0  # recompiled, not the stale kernel
