"""Where a :class:`.frames.Frame` gets its image, alpha and mask from.

- :class:`HeldPixels`: tensors the frame holds (a frame made in memory, a frame moved to the
  GPU, a frame averaged down by the resolution schedule);
- :class:`LazyPixels`: a loaded frame's, decoded through the process's bounded cache
  (:mod:`.image_cache`) each time they are asked for, to the same values every time;
- :class:`MaskBits`: a training mask as bits (``np.packbits``), 1/8 of a bool array.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from .image_cache import CACHE, ImageCache, StoredImage, new_key, pool


class HeldPixels:
    """An image [H, W, 3] and alpha [H, W, 1] | None held as they are (any device, dtype)."""

    def __init__(self, image: torch.Tensor, alpha: torch.Tensor | None) -> None:
        self._image, self._alpha = image, alpha

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(image [H, W, 3], alpha [H, W, 1] or None)."""
        return self._image, self._alpha

    @property
    def has_alpha(self) -> bool:
        """Whether there is an alpha channel."""
        return self._alpha is not None

    @property
    def nbytes(self) -> int:
        """Bytes of the image and alpha tensors."""
        return self._image.nbytes + (0 if self._alpha is None else self._alpha.nbytes)


class LazyPixels:
    """A loaded frame's pixels: ``decode()`` gives them, ``cache`` holds them while it may.

    Args:
        decode: the frame's :class:`.image_cache.StoredImage`, the same each call.
        size: its (width, height); has_alpha: whether it has an alpha channel.
        cache: the cache that holds it (the process's by default).
        key: its key in the cache (a new one by default; a loader that put the image there
            first passes the key it used).
    """

    def __init__(self, decode: Callable[[], StoredImage], size: tuple[int, int],
                 has_alpha: bool, cache: ImageCache | None = None, key: int | None = None
                 ) -> None:
        self.key = new_key() if key is None else key
        self.decode = decode
        self.size = size
        self.has_alpha = has_alpha
        self.cache = cache or CACHE

    def stored(self) -> StoredImage:
        """The stored form, from the cache or decoded now."""
        return self.cache.get(self.key, self.decode)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(image [H, W, 3] float32, alpha [H, W, 1] float32 or None), new tensors."""
        return self.stored().tensors()

    @property
    def nbytes(self) -> int:
        """Bytes of the float32 image and alpha it gives (not what the cache holds)."""
        w, h = self.size
        return w * h * 4 * (4 if self.has_alpha else 3)


Pixels = HeldPixels | LazyPixels


@dataclass(frozen=True)
class MaskBits:
    """A [H, W] bool mask as bits.

    Attributes:
        bits: [ceil(H * W / 8)] uint8, ``np.packbits`` of the row-major mask.
        shape: (H, W).
    """

    bits: np.ndarray
    shape: tuple[int, int]

    @staticmethod
    def of(keep: np.ndarray | torch.Tensor | None) -> MaskBits | None:
        """The bits of a [H, W] bool mask; None when there is none or it keeps every pixel."""
        if keep is None:
            return None
        if isinstance(keep, torch.Tensor):
            keep = keep.detach().to("cpu").numpy()
        keep = np.asarray(keep, dtype=bool)
        if keep.all():
            return None
        return MaskBits(np.packbits(keep, axis=None), (int(keep.shape[0]), int(keep.shape[1])))

    def tensor(self) -> torch.Tensor:
        """[H, W] bool."""
        h, w = self.shape
        return torch.from_numpy(np.unpackbits(self.bits, count=h * w).reshape(h, w).view(bool))


def prefetch(pixels: Iterable[object]) -> None:
    """Decode, in the background threads, the lazy pixels among ``pixels`` that the cache
    does not hold (the views the next step reads)."""
    for p in pixels:
        if isinstance(p, LazyPixels) and p.key not in p.cache:
            pool().submit(p.stored)
