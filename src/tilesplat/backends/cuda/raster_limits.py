"""What the rasterization kernels may be launched with, decided before any launch.

The kernels are specialised at compile time on float type, tile size and channel count,
which fixes their static shared memory. Static shared memory above 48 KB fails to load
without an opt-in, and a block's threads x registers must fit the 64k register file, so the
launchers plan every launch here:

- ``tile_size``: 1 to 32 (a block of ``tile_size**2`` pixel threads, at most 1024). The
  kernels are compiled with their block size as launch bound, so ptxas keeps the registers
  within the register file (``tests/test_cuda_resources.py`` reads them back).
- splats per shared-memory batch: ``min(tile_size**2, MAX_BATCH)`` in the forward and the
  ``per_pixel`` backward, so a 32-pixel tile does not need 1024 splats of shared memory.
- channels: any number. The backward kernels keep the colours (``per_pixel``: the batch's
  splat colours; ``per_splat``: the pixels' colour still to come) in shared memory while that
  fits 48 KB, and keep them in global memory (L1/L2-cached) beyond: no launch is split by
  channel, so ``absgrad`` stays the sum over pixels of the whole gradient's magnitude.
- images: at most ``runtime.MAX_GRID_YZ`` per launch (``gridDim.z``).
- intersections: fewer than 2**31 (``offsets``, ``flatten_ids`` and ``last_ids`` are int32).

The byte counts below are the kernels' ``cuda.shared.array`` declarations summed; the
resource test checks them against what the linker reports.
"""

from __future__ import annotations

from . import runtime

MAX_TILE = 32  # 32 * 32 = 1024 threads, the most a block may have
MAX_BATCH = 256  # splats per shared-memory batch (forward, per_pixel backward)
SHARED_ALIGN_SLACK = 64  # padding the compiler may put between shared arrays (alignment)
# shared memory the system reserves per block, which ptxas counts in for sm_90 (1 KB):
# budgeted on every architecture
RESERVED_SHARED = 1024
KERNELS = ("forward", "per_pixel", "per_splat")


def check_tile_size(tile_size: int) -> int:
    """``tile_size`` if the cuda kernels can run it, else a ValueError naming the limit."""
    if not 1 <= tile_size <= MAX_TILE:
        raise ValueError(
            f"backend 'cuda' needs tile_size from 1 to {MAX_TILE} (a block of tile_size**2 "
            f"pixel threads, at most {runtime.MAX_BLOCK_THREADS}), got tile_size={tile_size}; "
            "use a smaller tile (16 is gsplat's default) or backend='cpu'/'torch'"
        )
    return tile_size


def check_grid(tile_width: int, tile_height: int, n_isects: int) -> None:
    """The tile grid and the number of intersections fit the kernels' launch and index
    limits (images are chunked by the launchers, so their count has no limit)."""
    del tile_width  # gridDim.x may reach 2**31 - 1
    if tile_height > runtime.MAX_GRID_YZ:
        raise ValueError(
            f"backend 'cuda' launches one block row per tile row, at most "
            f"{runtime.MAX_GRID_YZ}; got {tile_height} tile rows (image height / tile_size)"
        )
    if n_isects > runtime.INDEX_LIMIT:
        raise ValueError(
            f"{n_isects} tile intersections exceed the int32 index range of the cuda "
            f"backend (isect_offsets, flatten_ids and last_ids hold at most "
            f"{runtime.INDEX_LIMIT}); render fewer cameras per call"
        )


def batch_size(tile_size: int) -> int:
    """Splats per shared-memory batch of the forward and the ``per_pixel`` backward."""
    return min(tile_size * tile_size, MAX_BATCH)


def shared_bytes(kernel: str, float_bytes: int, tile_size: int, channels: int,
                 colors_shared: bool) -> int:
    """Static shared memory of ``kernel`` (``KERNELS``) in bytes; ``colors_shared``: the
    backward's colour arrays live in shared memory (see :func:`colors_in_shared`)."""
    block = tile_size * tile_size
    batch = batch_size(tile_size)
    colors = channels if colors_shared else 0
    if kernel == "forward":  # s_id (int32), s_xyo, s_conic
        return batch * (4 + 6 * float_bytes)
    if kernel == "per_pixel":  # s_id, s_xyo, s_conic, s_rgb; s_warp_bin (int32 per warp)
        return batch * (4 + (6 + colors) * float_bytes) + 4 * ((block + 31) // 32)
    if kernel == "per_splat":  # per pixel: s_T, s_vw; per pixel and channel: s_hi, s_lo
        return block * float_bytes * (2 + 2 * colors)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def colors_in_shared(kernel: str, float_bytes: int, tile_size: int, channels: int) -> bool:
    """Whether ``kernel`` keeps its colour arrays in shared memory (they fit 48 KB)."""
    need = shared_bytes(kernel, float_bytes, tile_size, channels, True)
    return need + SHARED_ALIGN_SLACK + RESERVED_SHARED <= runtime.STATIC_SHARED_BYTES


def image_chunks(n_images: int) -> list[tuple[int, int]]:
    """``(first, count)`` ranges of at most ``runtime.MAX_GRID_YZ`` images (``gridDim.z``)."""
    step = runtime.MAX_GRID_YZ
    return [(i, min(step, n_images - i)) for i in range(0, n_images, step)]
