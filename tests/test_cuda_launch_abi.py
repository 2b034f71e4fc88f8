"""The thin launch path's parameter layout (``backends/cuda/ptx_abi.py``) is numba's: for
every kernel of the catalogue and float type, the ``.entry`` parameters of the PTX that
``numba.cuda.compile_ptx`` makes (no GPU needed) have the count, widths, float-or-integer
class and offsets the packer writes. A numba-cuda that flattened arrays differently (another
field, another order of shape and strides, a 4-byte boolean) fails here, and on a device the
same comparison makes the kernel keep ``kernel[...]`` (``tests/test_cuda_thin_launch.py``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX is compiled by the real numba-cuda, not its simulator",
                allow_module_level=True)

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba.core import types as nt  # noqa: E402

from ptx_cache import compiled_ptx  # noqa: E402
from tilesplat.backends.cuda import kernels, ptx_abi  # noqa: E402

CASES = [pytest.param(spec, ft, id=f"{spec.name}-{ft.__name__}")
         for spec in kernels.KERNELS for ft in spec.float_types]


def _probe(a, n, x, flag, b, y):
    i = cuda.grid(1)
    if flag and i < n:
        a[i] = x + b[0, i] + y


PROBE_TYPES = (nt.Array(nt.float32, 1, "C"), nt.int64, nt.float32, nt.boolean,
               nt.Array(nt.float64, 2, "C"), nt.float64)


def test_a_small_kernel_has_the_layout_numba_documents():
    """1-D array (7 parameters), int64, float32, boolean, 2-D array (9), float64: 20
    parameters, the boolean one byte, then the next array 8-aligned."""
    ptx, _ = cuda.compile_ptx(_probe, PROBE_TYPES, cc=(9, 0))
    got = ptx_abi.entry_params(ptx)
    assert [f"{p.kind}{p.size * 8}" for p in got] == (
        ["u64"] * 8 + ["f32", "u8"] + ["u64"] * 9 + ["f64"])
    params = ptx_abi.layout(PROBE_TYPES)
    assert [p.field for p in params[:7]] == ["meminfo", "parent", "nitems", "itemsize",
                                             "data", "shape0", "strides0"]
    assert [p.field for p in params[10:19]] == ["meminfo", "parent", "nitems", "itemsize",
                                                "data", "shape0", "shape1", "strides0",
                                                "strides1"]
    assert [p.offset for p in params[7:11]] == [56, 64, 68, 72]  # int64, f32, bool, then 8-aligned
    assert ptx_abi.ptx_offsets(got) == tuple(p.offset for p in params)
    assert ptx_abi.mismatch(params, got) is None
    assert ptx_abi.buffer_size(params) == 72 + 9 * 8 + 8


@pytest.mark.parametrize("spec, ft", CASES)
def test_packer_layout_equals_the_ptx_entry(spec, ft):
    F = nt.float32 if ft is np.float32 else nt.float64
    argtypes = spec.args(F)
    ptx = compiled_ptx(spec, ft, (9, 0))
    entry = ptx_abi.entry_params(ptx)
    params = ptx_abi.layout(argtypes)
    n_arrays = sum(isinstance(t, nt.Array) for t in argtypes)
    expected_count = sum(5 + 2 * t.ndim if isinstance(t, nt.Array) else 1 for t in argtypes)
    assert len(entry) == expected_count and n_arrays > 0
    assert ptx_abi.mismatch(params, entry) is None, ptx_abi.mismatch(params, entry)
    # the struct format writes each value where the offsets say
    import struct

    fmt = struct.Struct(ptx_abi.struct_format(params))
    assert fmt.size == params[-1].offset + params[-1].size <= ptx_abi.buffer_size(params)


def test_a_difference_is_reported():
    ptx, _ = cuda.compile_ptx(_probe, PROBE_TYPES, cc=(9, 0))
    params = ptx_abi.layout(PROBE_TYPES)
    # a boolean of 4 bytes, a float passed as an integer, a missing parameter
    wide = ptx.replace(".param .u8", ".param .u32", 1)
    why = ptx_abi.mismatch(params, ptx_abi.entry_params(wide))
    assert why is not None and "parameter 9 (argument 3 value)" in why and ".u32" in why
    as_int = ptx.replace(".param .f32", ".param .b32", 1)
    assert "argument 2 value" in ptx_abi.mismatch(params, ptx_abi.entry_params(as_int))
    assert "20 parameters, the PTX has 19" in ptx_abi.mismatch(
        params, ptx_abi.entry_params(ptx)[:-1])


def test_entry_parsing():
    ptx = """
.visible .entry k(
	.param .u64 k_param_0,
	.param .align 8 .b8 k_param_1[16],
	.param .u8 k_param_2
)
{ ret; }"""
    got = ptx_abi.entry_params(ptx)
    assert got == (ptx_abi.PtxParam("u", 8, 8), ptx_abi.PtxParam("b", 16, 8),
                   ptx_abi.PtxParam("u", 1, 1))
    assert ptx_abi.ptx_offsets(got) == (0, 8, 24)
    with pytest.raises(ValueError, match="expected one .entry"):
        ptx_abi.entry_params(ptx + ptx)
    assert ptx_abi.entry_params(ptx + ptx.replace(" k(", " j("), "j")[2].size == 1
    with pytest.raises(TypeError, match="not complex128"):
        ptx_abi.layout((nt.complex128,))
