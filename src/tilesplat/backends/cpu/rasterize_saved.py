"""What the CPU rasterizer's forward keeps for its backward, packed into one tensor.

The autograd op (``ops/rasterize.py``) saves one extra tensor per forward; the CPU backend
keeps two things in it, as one uint8 buffer:

- hit flags [n, n_sub] uint8: bit g of flags[k, s] is 1 where intersection k contributes
  (passes the skip tests and is not stopped) to at least one pixel of group g of slice s of
  its tile (slices of SUB_PIXELS pixels in the tile's row-major order, groups of GROUP_PIXELS
  pixels of a slice: half a row of a 16 x 16 tile), else 0. The backward evaluates only the
  flagged (slice, intersection) pairs, and in those only the pixels from the first flagged
  group to the last; skipping the others is exact (they change neither T nor any gradient).
  On garden 28% of the pairs the forward evaluates contribute nowhere.
- the scheme's float buffer, 8-byte aligned after the flags: per_pixel, the final
  transmittances [I, H, W]; per_splat in float32, the colours' rounding residual
  [I, H, W, D] (see ``rasterize.forward``); nothing for per_splat in float64.

4 bytes per intersection for 16 x 16 tiles: 1M Gaussians at 1920 x 1080 keep about 40 MB.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._common import poison_enabled

SUB_PIXELS = 64  # pixels of one slice of a tile (4 rows of a 16 x 16 tile): see rasterize_fwd
GROUP_PIXELS = SUB_PIXELS // 8  # pixels of one bit of a slice's flags (a uint8)


def n_slices(tile_size: int) -> int:
    """Slices of SUB_PIXELS pixels of a tile_size x tile_size tile (the last may be partial)."""
    return (tile_size * tile_size + SUB_PIXELS - 1) // SUB_PIXELS


def float_shape(scheme: str, dtype: torch.dtype, n_img: int, height: int, width: int,
                n_ch: int) -> tuple[int, ...] | None:
    """Shape of the scheme's float buffer (None: none kept)."""
    if scheme == "per_pixel":
        return (n_img, height, width)
    if dtype != torch.float64:
        return (n_img, height, width, n_ch)
    return None


def _layout(n_isects: int, n_sub: int, shape: tuple[int, ...] | None,
            np_dtype: np.dtype) -> tuple[int, int]:
    flag_bytes = (n_isects * n_sub + 7) // 8 * 8
    float_bytes = math.prod(shape) * np.dtype(np_dtype).itemsize if shape is not None else 0
    return flag_bytes, float_bytes


def _views(buf: torch.Tensor, n_isects: int, n_sub: int, shape: tuple[int, ...] | None,
           np_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    raw = buf.detach().numpy()
    flag_bytes, float_bytes = _layout(n_isects, n_sub, shape, np_dtype)
    if raw.shape[0] != flag_bytes + float_bytes:
        raise ValueError(f"the forward's saved buffer has {raw.shape[0]} bytes, expected "
                         f"{flag_bytes + float_bytes}")
    flags = raw[: n_isects * n_sub].reshape(n_isects, n_sub)
    if shape is None:
        return flags, None
    return flags, raw[flag_bytes:].view(np_dtype).reshape(shape)


def alloc_saved(n_isects: int, n_sub: int, shape: tuple[int, ...] | None,
                np_dtype: np.dtype) -> tuple[torch.Tensor, np.ndarray, np.ndarray | None]:
    """The buffer (uint8 [bytes]) and its two views: flags [n_isects, n_sub] uint8 and the float
    buffer of ``shape`` (or None). Poison mode fills it with 0xFF (NaN floats, flags 255)."""
    flag_bytes, float_bytes = _layout(n_isects, n_sub, shape, np_dtype)
    buf = torch.empty(flag_bytes + float_bytes, dtype=torch.uint8)
    if poison_enabled():
        buf.fill_(255)
    return (buf, *_views(buf, n_isects, n_sub, shape, np_dtype))


def unpack_saved(buf: torch.Tensor, n_isects: int, n_sub: int, shape: tuple[int, ...] | None,
                 np_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """The views :func:`alloc_saved` gave for the same arguments."""
    return _views(buf, n_isects, n_sub, shape, np_dtype)
