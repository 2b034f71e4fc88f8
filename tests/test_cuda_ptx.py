"""Every kernel of the ``cuda`` backend compiles to PTX for sm_90 (and its float32 rasterizers
for sm_80), with no GPU.

numba-cuda's NVVM comes from pip packages (``numba-cuda[cu13]``), so ``compile_ptx`` runs on
a CPU-only machine. Besides compiling, the PTX is checked for what the design promises:
float32 kernels do no float64 arithmetic (but the 2DGS and 3DGUT ones, which compute in
float64 by design), the per-pixel backward uses warp shuffles and votes, the forward's early
exit is a block-wide count, atomics are native float adds, and the deterministic 2DGS and
3DGUT (eval3d) backwards and the 2DGS projection add no float with an atomic. The 3DGUT
kernels, like the other float64-inside ones, compile for sm_90 only.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX is compiled by the real numba-cuda, not its simulator",
                allow_module_level=True)

import numpy as np  # noqa: E402

from ptx_cache import compiled_ptx  # noqa: E402
from tilesplat.backends.cuda import (  # noqa: E402
    covariance,
    indices,
    intersect,
    kernels,
    projection,
    rasterize_bwd,
    rasterize_fwd,
    segment,
    sh,
    twodgs_projection,
    twodgs_rasterize_bwd,
    twodgs_rasterize_fwd,
    ut_projection,
    ut_rasterize_bwd,
    ut_rasterize_fwd,
)

CASES = [
    pytest.param(spec, ft, cc, id=f"{spec.name}-{ft.__name__}-sm{cc[0]}{cc[1]}")
    for spec in kernels.KERNELS
    for ft in spec.float_types
    for cc in ((8, 0), (9, 0))
    # every kernel for sm_90 (the lent GPU's); for sm_80 the float32 rasterizers, whose PTX
    # holds the warp and barrier instructions checked below: the rest's sm_80 PTX would add
    # ~100 s of CI compilation and nothing the sm_90 one does not check
    if cc == (9, 0) or (ft is np.float32 and spec.name.startswith("rasterize_"))
]
# float64 arithmetic a float32 kernel must not contain (converting a float64 scalar
# argument such as eps2d once is fine: cvt.*.f64, ld.param.f64)
F64_MATH = re.compile(r"\b(?:add|sub|mul|div|fma|rcp|sqrt|neg|abs|min|max)(?:\.\w+)*\.f64\b")
FLOAT_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.add(?:\.\w+)*\.f(?:32|64)\b")


@pytest.mark.parametrize("spec, ft, cc", CASES)
def test_kernel_compiles_to_ptx(spec, ft, cc):
    ptx = compiled_ptx(spec, ft, cc)
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    assert ".visible .entry" in ptx, "a kernel entry point, not a device function"
    if ft is np.float32 and not spec.float64_inside:
        bad = sorted(set(F64_MATH.findall(ptx)))
        assert not bad, f"float32 kernel {spec.name} does float64 math: {bad[:10]}"
    width = "f32" if ft is np.float32 else "f64"
    if spec.name.startswith("rasterize_bwd"):
        assert re.search(rf"\b(?:atom|red)\.global\.add\.{width}\b", ptx), "native atomics"
    if spec.name == "rasterize_bwd_per_pixel":
        assert "shfl.sync.down" in ptx, "warp reductions"
        assert "vote.sync.any" in ptx, "warp skip"
    if spec.name == "rasterize_fwd":
        assert "bar.red.popc" in ptx, "early exit by syncthreads_count"
    if spec.name.startswith("rasterize_bwd_per_splat"):
        assert "bar.red.or" in ptx, "early exit by syncthreads_or"
    if spec.name.startswith("twodgs_rasterize_forward"):
        assert "bar.red.popc" in ptx, "early exit by syncthreads_count"
    if spec.name.startswith("ut_rasterize_forward"):
        assert "bar.red.popc" in ptx, "early exit by syncthreads_count"
    if spec.name.startswith(("twodgs_rasterize_backward", "ut_rasterize_backward")):
        assert "shfl.sync.bfly" in ptx and "shfl.sync.down" in ptx, "warp reductions"
        assert "vote.sync.any" in ptx, "warp skip"
        atomics = FLOAT_ATOMIC.findall(ptx)
        if "_det" in spec.name:  # the deterministic variant stores its rows
            assert not atomics, f"float atomics in {spec.name}: {sorted(set(atomics))}"
        else:
            assert re.search(r"\batom\.global\.add\.f64\b", ptx), "float64 atomics"
    if spec.name.startswith(("twodgs_projection", "ut_projection")):
        assert not FLOAT_ATOMIC.findall(ptx), "the projection writes rows, no atomics"


def test_catalogue_lists_every_kernel():
    """Each kernel body builder of the package appears in kernels.KERNELS."""
    builders = {
        obj
        for module in (covariance, indices, intersect, projection, rasterize_bwd, rasterize_fwd,
                       segment, sh, twodgs_projection, twodgs_rasterize_bwd,
                       twodgs_rasterize_fwd, ut_projection, ut_rasterize_bwd,
                       ut_rasterize_fwd)
        for name, obj in vars(module).items()
        if inspect.isfunction(obj) and name.startswith("make_")
        and obj.__module__ == module.__name__
    }
    listed = {spec.body(np.float32).__code__ for spec in kernels.KERNELS}
    missing = [b.__name__ for b in builders if b(*_probe_args(b)).__code__ not in listed]
    assert not missing, f"kernels not in the PTX catalogue: {missing}"
    assert intersect.isect_offset_encode_kernel.__code__ in listed


def _probe_args(builder):
    """Arguments that build a kernel body: the float type, then tile size, channels, batch."""
    extra = {"tile_size": 16, "channels": 3, "splat_batch": 32, "keep": 0, "det": False,
             "fill": False, "tight": False}
    params = list(inspect.signature(builder).parameters)
    return [np.float32] + [extra[p] for p in params[1:]]
