"""Every rasterization launch the cuda launchers allow fits the hardware, read off the linker.

No GPU needed: each kernel is compiled to PTX for sm_80 and sm_90 with the launch bound the
launchers give it (``runtime.jit``), linked to a cubin by nvJitLink (``nvidia-nvjitlink`` of
the ``[cuda]`` extra) with ``-verbose``, and the registers and static shared memory that
ptxas reports are checked against the block it is launched with:

- registers: warps x (registers x 32, rounded up to 256) <= 65,536 (the register file);
- static shared memory <= 48 KB (no opt-in is used; on sm_90 ptxas counts 1 KB the system
  reserves per block) and equal to the launchers' own count (``raster_limits.shared_bytes``),
  which then covers every (tile size, channels) exhaustively.

The configurations are the edges of what the launchers allow: the default tile (16) and the
largest (32), channels at the default (3), at the most that keep colours in shared memory and
one more (the global-memory variant), and many (64).
"""

from __future__ import annotations

import importlib.util
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
import torch  # noqa: E402

from ptx_cache import compiled_ptx  # noqa: E402
from tilesplat.backends.cuda import kernels, raster_limits, runtime  # noqa: E402
from tilesplat.backends.cuda.rasterize import backward as rasterize_to_pixels_bwd  # noqa: E402
from tilesplat.backends.cuda.rasterize import forward as rasterize_to_pixels_fwd  # noqa: E402
from tilesplat.backends.cuda.rasterize_fwd import KEEP_SUM  # noqa: E402
from tilesplat.backends.cuda.twodgs_rasterize_bwd import n_warps  # noqa: E402
from tilesplat.backends.cuda.twodgs_rasterize_fwd import shared_bytes as twodgs_shared  # noqa: E402
from tilesplat.backends.cuda.ut_rasterize_fwd import shared_bytes as ut_shared  # noqa: E402

FLOAT_BYTES = {np.float32: 4, np.float64: 8}


def link_resources(ptx: str, cc: tuple[int, int]) -> dict[str, int]:
    """Registers, static shared memory and local (spill) memory of the one kernel in
    ``ptx``, as ptxas reports them when nvJitLink links it for ``cc``."""
    from cuda.bindings import nvjitlink

    options = [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"]
    handle = nvjitlink.create(len(options), options)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    text = log.decode(errors="replace")
    found = re.search(r"used (\d+) registers.*?(\d+) bytes smem", text)
    assert found, f"no resource line in the linker's log:\n{text[-2000:]}"
    return {"registers": int(found.group(1)), "shared": int(found.group(2)), "log": text}


def register_file_fits(registers: int, threads: int) -> bool:
    """A block of ``threads`` fits one SM's 64k registers (allocated per warp, in units of
    256 registers, compute capability 8.x and 9.x)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    return registers <= 255 and warps * per_warp <= runtime.REGISTERS_PER_SM


def _edge_configs() -> list:
    """(kernel, tile, channels, variant, float type, compute capabilities): the default
    configuration for sm_80 and sm_90, the edges for sm_90 (the lent GPU's)."""
    both, sm90 = ((8, 0), (9, 0)), ((9, 0),)
    cases = []
    for ft in (np.float32, np.float64):
        fb = FLOAT_BYTES[ft]

        def most(kernel, tile, fb=fb):
            return max(c for c in range(1, 257)
                       if raster_limits.colors_in_shared(kernel, fb, tile, c))

        cases += [("forward", 16, 3, KEEP_SUM, ft, both), ("forward", 16, 3, 0, ft, both),
                  ("forward", 32, 3, KEEP_SUM, ft, sm90), ("forward", 32, 64, KEEP_SUM, ft, sm90),
                  ("per_pixel", 16, 3, 0, ft, both),
                  ("per_pixel", 16, most("per_pixel", 16), 0, ft, sm90),
                  ("per_pixel", 16, most("per_pixel", 16) + 1, 0, ft, sm90),
                  ("per_pixel", 32, 3, 0, ft, sm90),
                  ("per_pixel", 32, most("per_pixel", 32) + 1, 0, ft, sm90),
                  ("per_splat", 16, 3, 32, ft, both), ("per_splat", 16, 3, 256, ft, both),
                  ("per_splat", 16, most("per_splat", 16), 32, ft, sm90),
                  ("per_splat", 16, most("per_splat", 16) + 1, 32, ft, sm90),
                  ("per_splat", 32, 3, 32, ft, sm90),
                  ("per_splat", 32, most("per_splat", 32) + 1, 256, ft, sm90)]
    return cases


CASES = [
    pytest.param(*case[:5], cc, id=f"{case[0]}-t{case[1]}-c{case[2]}-v{case[3]}-"
                 f"{case[4].__name__}-sm{cc[0]}{cc[1]}")
    for case in _edge_configs()
    for cc in case[5]
]


@pytest.mark.parametrize("kernel, tile, channels, variant, ft, cc", CASES)
def test_launch_fits_the_hardware(kernel, tile, channels, variant, ft, cc):
    spec = kernels.raster_spec(kernel, tile, channels, variant)
    threads = kernels.block_threads(kernel, tile, variant)
    ptx = compiled_ptx(spec, ft, cc, threads=threads)
    assert f".maxntid {threads}" in ptx.replace(", 1, 1", ""), "launch bound in the PTX"
    res = link_resources(ptx, cc)
    assert register_file_fits(res["registers"], threads), (
        f"{res['registers']} registers x {threads} threads exceed the register file")
    fb = FLOAT_BYTES[ft]
    in_shared = raster_limits.colors_in_shared(kernel, fb, tile, channels)
    predicted = raster_limits.shared_bytes(kernel, fb, tile, channels, in_shared)
    declared = res["shared"] - (raster_limits.RESERVED_SHARED if cc >= (9, 0) else 0)
    assert predicted <= declared <= predicted + raster_limits.SHARED_ALIGN_SLACK, (
        f"linker: {res['shared']} bytes of shared memory, launchers count {predicted}")
    assert res["shared"] <= runtime.STATIC_SHARED_BYTES


# 2DGS: the default tile and RGB+D for each kernel, and the edges of the backward: the most
# registers (16 channels at tile 16) and the largest tile (32) with float64
TWODGS_CASES = [("forward", 16, 4, np.float32), ("backward", 16, 4, np.float32),
                ("backward_det", 16, 4, np.float32), ("backward", 16, 16, np.float32),
                ("backward", 32, 16, np.float64)]


@pytest.mark.parametrize("kernel, tile, channels, ft", TWODGS_CASES,
                         ids=[f"{k}-t{t}-c{c}-{f.__name__}" for k, t, c, f in TWODGS_CASES])
def test_twodgs_launch_fits_the_hardware(kernel, tile, channels, ft):
    cc = (9, 0)
    threads = tile * tile
    ptx = compiled_ptx(kernels.twodgs_raster_spec(kernel, tile, channels), ft, cc,
                              threads=threads)
    assert f".maxntid {threads}" in ptx.replace(", 1, 1", ""), "launch bound in the PTX"
    res = link_resources(ptx, cc)
    assert register_file_fits(res["registers"], threads), (
        f"{res['registers']} registers x {threads} threads exceed the register file")
    predicted = twodgs_shared(tile) + (0 if kernel == "forward" else 4 * n_warps(tile))
    declared = res["shared"] - raster_limits.RESERVED_SHARED
    assert predicted <= declared <= predicted + raster_limits.SHARED_ALIGN_SLACK, (
        f"linker: {res['shared']} bytes of shared memory, launchers count {predicted}")
    assert res["shared"] <= runtime.STATIC_SHARED_BYTES
    for t in range(1, raster_limits.MAX_TILE + 1):  # every tile the launchers accept
        room = raster_limits.SHARED_ALIGN_SLACK + raster_limits.RESERVED_SHARED
        assert twodgs_shared(t) + 4 * n_warps(t) + room <= runtime.STATIC_SHARED_BYTES


# 3DGUT's eval3d rasterizer: the default tile and RGB for each kernel, and the edges of the
# backward: the most registers (16 channels at tile 16) and the largest tile (32) in float64
UT_CASES = [("forward", 16, 3, np.float32), ("backward", 16, 3, np.float32),
            ("backward_det", 16, 3, np.float32), ("backward", 16, 16, np.float32),
            ("backward", 32, 16, np.float64)]


@pytest.mark.parametrize("kernel, tile, channels, ft", UT_CASES,
                         ids=[f"{k}-t{t}-c{c}-{f.__name__}" for k, t, c, f in UT_CASES])
def test_ut_launch_fits_the_hardware(kernel, tile, channels, ft):
    cc = (9, 0)
    threads = tile * tile
    ptx = kernels.compile_ptx(kernels.ut_raster_spec(kernel, tile, channels), ft, cc,
                              threads=threads)
    res = link_resources(ptx, cc)
    assert register_file_fits(res["registers"], threads), (
        f"{res['registers']} registers x {threads} threads exceed the register file")
    predicted = ut_shared(tile) + (0 if kernel == "forward" else 4 * n_warps(tile))
    declared = res["shared"] - raster_limits.RESERVED_SHARED
    assert predicted <= declared <= predicted + raster_limits.SHARED_ALIGN_SLACK, (
        f"linker: {res['shared']} bytes of shared memory, launchers count {predicted}")
    for t in range(1, raster_limits.MAX_TILE + 1):  # every tile the launchers accept
        room = raster_limits.SHARED_ALIGN_SLACK + raster_limits.RESERVED_SHARED
        assert ut_shared(t) + 4 * n_warps(t) + room <= runtime.STATIC_SHARED_BYTES


@pytest.mark.parametrize("ft", [np.float32, np.float64], ids=lambda f: f.__name__)
def test_ut_projection_fits_the_hardware(ft):
    """The unscented projection (float64 inside, seven sigma points and a camera per thread)
    fits the register file in its launch block (``ut_projection.THREADS``)."""
    from tilesplat.backends.cuda.ut_projection import THREADS

    cc = (9, 0)
    spec = next(k for k in kernels.KERNELS if k.name == "ut_projection")
    res = link_resources(kernels.compile_ptx(spec, ft, cc, threads=THREADS), cc)
    assert register_file_fits(res["registers"], THREADS), (
        f"{res['registers']} registers x {THREADS} threads exceed the register file")
    assert res["shared"] <= runtime.STATIC_SHARED_BYTES


def test_every_allowed_configuration_fits_shared_memory():
    """With the launchers' count checked against the linker above, every tile size they
    accept and any channel count (1..256) stays within 48 KB."""
    limit = runtime.STATIC_SHARED_BYTES
    for fb in (4, 8):
        for tile in range(1, raster_limits.MAX_TILE + 1):
            for channels in range(1, 257):
                for kernel in raster_limits.KERNELS:
                    shared = raster_limits.colors_in_shared(kernel, fb, tile, channels)
                    need = raster_limits.shared_bytes(kernel, fb, tile, channels, shared)
                    room = raster_limits.SHARED_ALIGN_SLACK + raster_limits.RESERVED_SHARED
                    assert need + room <= limit, (kernel, fb, tile, channels)
    # the failing cases now keep their colours in global memory
    assert not raster_limits.colors_in_shared("per_splat", 4, 16, 64)
    assert not raster_limits.colors_in_shared("per_pixel", 8, 16, 18)


def _raster_inputs(tile_size: int, height: int = 8, width: int = 8):
    th, tw = -(-height // tile_size), -(-width // tile_size)
    g = torch.zeros(1, 2), torch.ones(1, 3), torch.ones(1, 3), torch.ones(1)
    offsets = torch.zeros(1, th, tw, dtype=torch.int32)
    return (*g, None, None, width, height, tile_size, offsets,
            torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("tile_size", [33, 64])
def test_launchers_refuse_tiles_too_large_before_launch(tile_size):
    with pytest.raises(ValueError, match=r"tile_size from 1 to 32.*got tile_size="):
        rasterize_to_pixels_fwd(*_raster_inputs(tile_size), "per_pixel")
    v = torch.zeros(1, 8, 8, 3), torch.zeros(1, 8, 8, 1)
    with pytest.raises(ValueError, match=r"tile_size from 1 to 32"):
        rasterize_to_pixels_bwd(*_raster_inputs(tile_size), v[0], v[1],
                                torch.zeros(1, 8, 8, dtype=torch.int32), *v, False,
                                "per_pixel", None)


def test_launchers_refuse_grids_and_indices_past_the_limits(monkeypatch):
    with pytest.raises(ValueError, match="got tile_size=0"):
        raster_limits.check_tile_size(0)
    with pytest.raises(ValueError, match="tile rows"):
        raster_limits.check_grid(4, runtime.MAX_GRID_YZ + 1, 10)
    with pytest.raises(ValueError, match="int32 index range"):
        raster_limits.check_grid(4, 4, 2**31)
    monkeypatch.setattr(runtime, "MAX_GRID_YZ", 3)
    assert raster_limits.image_chunks(7) == [(0, 3), (3, 3), (6, 1)]
    assert raster_limits.image_chunks(0) == []


def test_version_floor():
    runtime.check_numba_cuda_version("0.21.0")
    runtime.check_numba_cuda_version("0.30.4+g1234")
    with pytest.raises(ImportError, match=r"numba-cuda >= 0\.21, found 0\.20\.1"):
        runtime.check_numba_cuda_version("0.20.1")
    assert runtime.parse_version("1.2rc1") == (1, 2)
