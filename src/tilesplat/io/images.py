"""Image files: read any Pillow-readable image as uint8 or float32, write PNGs atomically.

The files are a user's and untrusted: a header may declare any size, and the pixels it
declares are what decoding allocates. Pillow refuses an image of more than twice
``PIL.Image.MAX_IMAGE_PIXELS`` (~179 million pixels) before decoding anything, as a
decompression bomb; :func:`open_image` turns that refusal into one line naming the file and
its declared size (and leaves Pillow's limit as it is: it is the process's, not ours).
"""

from __future__ import annotations

import contextlib
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .atomic import atomic_writer

# pixels quantised at a time: float64 temporaries of at most 2 MiB, where whole ones of a
# 3000x2000 render were ~140 MB each (five of them at once)
QUANTISE_PIXELS = 1 << 16


def to_uint8(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """An image as uint8 [H, W, C] (C in 1, 3, 4).

    A float value is clipped to [0, 1] (NaN as 0), times 255 in float64 (exact for float32)
    and rounded to nearest (ties to even), :data:`QUANTISE_PIXELS` pixels at a time.

    Args:
        image: [H, W, C] or [H, W]; float in [0, 1] or uint8.
    """
    if isinstance(image, torch.Tensor):
        image = image.detach().to("cpu").numpy()
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise ValueError(f"expected an image of shape [H, W, 1|3|4], got {list(arr.shape)}")
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"expected a float image in [0, 1] or uint8, got dtype {arr.dtype}")
    flat = arr.reshape(-1, arr.shape[2])  # a view where the image is contiguous
    out = np.empty(flat.shape, dtype=np.uint8)
    for i in range(0, flat.shape[0], QUANTISE_PIXELS):
        part = flat[i:i + QUANTISE_PIXELS].astype(np.float64)
        np.nan_to_num(part, copy=False, nan=0.0)
        np.clip(part, 0.0, 1.0, out=part)
        part *= 255.0
        np.rint(part, out=part)
        out[i:i + QUANTISE_PIXELS] = part
    return out.reshape(arr.shape)


# zlib level of a run's renders (the colour renders and the 2DGS model's normal and depth
# pictures): 1 encodes garden-views' 324x210 renders in 3.9 ms instead of Pillow's default 6's
# 16.1 (a 3000x2000 render in 0.21 s instead of 0.75), for 9-33 % more bytes; the pixels are
# the same (lossless either way)
RENDER_PNG_LEVEL = 1


def write_png(path: str | Path, image: torch.Tensor | np.ndarray, compress_level: int = 6) -> Path:
    """Write ``image`` as a PNG, atomically (temp file in the same folder, then rename).

    Args:
        path: destination file; its folder must exist.
        image: [H, W, 3|4] (or [H, W] / [H, W, 1] grey), float in [0, 1] or uint8.
        compress_level: zlib level, 0-9 (Pillow's default 6; 1 encodes ~5x faster, ~25 %
            larger: what a cache wants).

    Returns:
        The destination path.
    """
    path = Path(path)
    arr = to_uint8(image)
    pil = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)  # L, RGB or RGBA
    with atomic_writer(path, fsync=False) as f:
        pil.save(f, format="PNG", compress_level=compress_level)
    return path


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def declared_size(path: Path, refusal: str) -> str:
    """The size an image file declares, for a message: ``WxH (N pixels)`` from a PNG's IHDR
    chunk, else the ``N pixels`` of Pillow's ``refusal`` message."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] == _PNG_SIGNATURE and head[12:16] == b"IHDR":
        w, h = struct.unpack(">II", head[16:24])
        return f"{w}x{h} ({w * h} pixels)"
    pixels = re.search(r"\((\d+) pixels\)", refusal)
    return f"{pixels.group(1)} pixels" if pixels else "a size"


@contextlib.contextmanager
def open_image(path: Path, what: str = "") -> Iterator[Image.Image]:
    """``PIL.Image.open(path)`` as a context manager; any failure to open or decode inside the
    block is a ``ValueError`` naming the file (``what``: the file as the message names it;
    default ``image <path>``).

    Raises:
        ValueError: not an image Pillow reads, truncated or corrupt, or declaring more pixels
            than Pillow decodes (naming the declared size).
    """
    what = what or f"image {path}"
    try:
        with Image.open(path) as pil:
            yield pil
    except Image.DecompressionBombError as e:  # raised from the header, before decoding
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise ValueError(
            f"cannot read {what}: it declares {declared_size(path, str(e))}, more than "
            f"the {limit} pixels an image may have"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot read {what}: {e}") from e


def read_image(path: str | Path) -> np.ndarray:
    """Read an image file as float32 [H, W, C] in [0, 1].

    C is 3 for RGB / grey / palette images and 4 when the file has an alpha channel.
    16-bit greyscale images are scaled by 1/65535. The same as
    ``to_float(decode_image(path))``.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a readable image (corrupt, truncated, unknown format,
            or declaring more pixels than Pillow decodes).
    """
    return to_float(decode_image(path))


def decode_image(path: str | Path) -> np.ndarray:
    """Read an image file as it is stored: uint8 [H, W, C] for 8-bit images (C 3, or 4 with
    alpha), float32 [H, W, 3] in [0, 1] for 16-bit greyscale ones (scaled by 1/65535).

    What :func:`read_image` returns, in a quarter of the memory where the file is 8-bit
    (:func:`to_float` gives the float32).

    Raises:
        FileNotFoundError / ValueError, as :func:`read_image`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    with open_image(path) as pil:
        pil.load()
        if pil.mode in ("I;16", "I;16B", "I;16L", "I"):
            grey = np.asarray(pil, dtype=np.float64) / 65535.0
            arr = np.repeat(np.clip(grey, 0.0, 1.0)[:, :, None], 3, axis=2)
            return arr.astype(np.float32)
        has_alpha = pil.mode in ("RGBA", "LA", "PA") or (
            pil.mode == "P" and "transparency" in pil.info
        )
        rgb = pil.convert("RGBA" if has_alpha else "RGB")
        return np.asarray(rgb, dtype=np.uint8)


def to_float(image: np.ndarray) -> np.ndarray:
    """float32 [H, W, C] in [0, 1] of a decoded image: uint8 / 255 (in float32, as every
    loader has always divided), float32 as it is."""
    if image.dtype == np.uint8:
        return image.astype(np.float32) / np.float32(255.0)
    return image


def image_size(path: str | Path, what: str = "") -> tuple[int, int]:
    """(width, height) of an image file, read from its header only (``what``: the file as
    a message names it, as :func:`open_image` takes it).

    Raises:
        FileNotFoundError / ValueError naming the file, as :func:`read_image`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    with open_image(path, what) as pil:
        return pil.size


def resize_image(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize a float [H, W, C] image in [0, 1] to [height, width, C] (box/area filter).

    Works on each channel in float32 so no precision is lost to uint8. A uint8 image is
    taken as :func:`to_float` of it, one channel at a time (the same values, without the
    float32 copy of the whole image).
    """
    chans = [
        np.asarray(
            Image.fromarray(_float_channel(image, c)).resize(
                (width, height), resample=Image.Resampling.BOX
            )
        )
        for c in range(image.shape[2])
    ]
    return np.clip(np.stack(chans, axis=2), 0.0, 1.0).astype(np.float32)


def _float_channel(image: np.ndarray, c: int) -> np.ndarray:
    """Channel ``c`` of ``image`` as contiguous float32 in [0, 1]."""
    if image.dtype == np.uint8:
        return to_float(np.ascontiguousarray(image[:, :, c]))
    return np.ascontiguousarray(image[:, :, c], dtype=np.float32)
