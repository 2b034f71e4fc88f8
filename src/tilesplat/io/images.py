"""Image files: read any Pillow-readable image as float32, write PNGs atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .atomic import atomic_writer


def to_uint8(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """An image as uint8 [H, W, C] (C in 1, 3, 4).

    Args:
        image: [H, W, C] or [H, W]; float in [0, 1] (clipped, rounded to nearest) or uint8.
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
    arr = np.nan_to_num(arr.astype(np.float64), nan=0.0)
    return np.ascontiguousarray(np.round(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8))


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


def read_image(path: str | Path) -> np.ndarray:
    """Read an image file as float32 [H, W, C] in [0, 1].

    C is 3 for RGB / grey / palette images and 4 when the file has an alpha channel.
    16-bit greyscale images are scaled by 1/65535.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a readable image (corrupt, truncated, unknown format).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as pil:
            pil.load()
            if pil.mode in ("I;16", "I;16B", "I;16L", "I"):
                grey = np.asarray(pil, dtype=np.float64) / 65535.0
                arr = np.repeat(np.clip(grey, 0.0, 1.0)[:, :, None], 3, axis=2)
                return arr.astype(np.float32)
            has_alpha = pil.mode in ("RGBA", "LA", "PA") or (
                pil.mode == "P" and "transparency" in pil.info
            )
            rgb = pil.convert("RGBA" if has_alpha else "RGB")
            arr = np.asarray(rgb, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from e
    return arr.astype(np.float32) / np.float32(255.0)


def image_size(path: str | Path) -> tuple[int, int]:
    """(width, height) of an image file, read from its header only.

    Raises:
        FileNotFoundError / ValueError naming the file, as :func:`read_image`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as pil:
            return pil.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from e


def resize_image(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize a float [H, W, C] image in [0, 1] to [height, width, C] (box/area filter).

    Works on each channel in float32 so no precision is lost to uint8.
    """
    chans = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(image[:, :, c], dtype=np.float32)).resize(
                (width, height), resample=Image.Resampling.BOX
            )
        )
        for c in range(image.shape[2])
    ]
    return np.clip(np.stack(chans, axis=2), 0.0, 1.0).astype(np.float32)
