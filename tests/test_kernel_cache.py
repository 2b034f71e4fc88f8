"""Numba's cache of the CPU kernels follows the code compiled into them
(``tilesplat.backends.kernel_cache``): a kernel is reloaded while nothing changed, and
recompiled when only an inlined file (``shared/compositing.py``) changed, which Numba alone
misses; and a kernel compiled in this process computes what the same kernel loaded from the
cache does."""

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
    inlined = tmp_path / "src" / "tilesplat" / "backends" / "shared" / "compositing.py"
    inlined.write_text(inlined.read_text() + "\n# an edit\n")
    edited = probe()
    assert edited["misses"] >= 1 and edited["hits"] == 0  # recompiled, not the stale kernel


# One process: both raster backward schemes on a random scene, a digest of their gradients and
# whether the backward kernel was compiled (a cache miss) or loaded.
GRADS_PROBE = """
import hashlib, json, torch, tilesplat
from tilesplat.backends.cpu import rasterize, rasterize_bwd
g = torch.Generator().manual_seed(3)
W, H, ts, G = 61, 47, 16, 400
means2d = torch.rand(G, 2, generator=g) * torch.tensor([W, H])
s = torch.rand(G, 2, generator=g) * 5 + 1
rho = (torch.rand(G, generator=g) - 0.5) * 1.2
det = (s[:, 0] * s[:, 1]) ** 2 * (1 - rho ** 2)
conics = torch.stack([s[:, 1] ** 2 / det, -rho * s[:, 0] * s[:, 1] / det, s[:, 0] ** 2 / det], -1)
tw, th = (W + ts - 1) // ts, (H + ts - 1) // ts
_, ids, flat = tilesplat.isect_tiles(means2d[None], torch.ceil(3 * s).int()[None],
                                     torch.rand(1, G, generator=g) + 1, ts, tw, th,
                                     backend="torch")
offs = tilesplat.isect_offset_encode(ids, 1, tw, th, backend="torch")
colors, op = torch.rand(G, 3, generator=g), torch.rand(G, generator=g) * 0.9 + 0.05
vc, va = torch.randn(1, H, W, 3, generator=g), torch.randn(1, H, W, 1, generator=g)
out = {}
for scheme in ("per_pixel", "per_splat"):
    args = (means2d, conics, colors, op, None, None, W, H, ts, offs, flat)
    rc, ra, last, saved = rasterize.forward(*args, scheme)
    grads = rasterize.backward(*args, rc, ra, last, vc, va, True, scheme, saved)
    out[scheme] = hashlib.sha256(b"".join(t.numpy().tobytes() for t in grads
                                          if t is not None)).hexdigest()
out["misses"] = sum(rasterize_bwd.backward_kernel.stats.cache_misses.values())
print(json.dumps(out))
"""


def test_a_fresh_compile_and_the_cache_give_the_same_gradients(tmp_path):
    # The backward's sums may be reordered by LLVM (pair_grads' reassoc); its callees are
    # inlined at the LLVM level (forceinline) so that the process that compiles the kernel
    # runs the code it writes to the cache. Before, it ran separately compiled callees, and
    # the colour gradients of every first run after an install or upgrade differed in the
    # last bits from all later ones.
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba_cache"),
           "PYTHONPATH": os.path.dirname(os.path.dirname(tilesplat.__file__))}
    env.pop("NUMBA_DISABLE_JIT", None)

    def probe() -> dict:
        run = subprocess.run([sys.executable, "-c", GRADS_PROBE], env=env,
                             capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    fresh = probe()
    cached = probe()
    assert fresh["misses"] == 1 and cached["misses"] == 0
    assert fresh == {**cached, "misses": 1}
