"""``PngCompression`` (gsplat 1.5.3): the class and its fields, without the codec.

gsplat's codec (Self-Organizing Gaussians: sort the splats onto a 2D grid with PLAS, store
attributes as PNGs, k-means-quantise the higher SH bands) needs:
- ``plas``: not on PyPI (``pip install git+https://github.com/fraunhoferhhi/PLAS.git``);
- ``torchpq``: k-means on CUDA through ``cupy`` (PyPI, GPU only);
- ``imageio``.
With one not on PyPI and one GPU only, tilesplat does not ship the codec: ``compress`` and
``decompress`` raise ``NotImplementedError`` naming these packages. ``tilesplat export``
writes ``.spz`` (Niantic's compressed format) for a compact file instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

MISSING = (
    "PngCompression is not implemented in tilesplat: gsplat's codec needs 'plas' (not on PyPI: "
    "pip install git+https://github.com/fraunhoferhhi/PLAS.git), 'torchpq' (k-means on CUDA "
    "via cupy) and 'imageio'; for a compact file write .spz with 'tilesplat export --spz'"
)


@dataclass
class PngCompression:
    """gsplat's PNG codec of a splat model (fields kept; the codec is not implemented).

    Args:
        use_sort: sort the splats onto a 2D grid first (PLAS).
        verbose: print progress.
    """

    use_sort: bool = True
    verbose: bool = True

    def compress(self, compress_dir: str, splats: dict[str, Tensor]) -> None:
        """Raises NotImplementedError naming the missing dependencies."""
        raise NotImplementedError(MISSING)

    def decompress(self, compress_dir: str) -> dict[str, Tensor]:
        """Raises NotImplementedError naming the missing dependencies."""
        raise NotImplementedError(MISSING)
