"""Compression of gsplat 1.5.3: ``PngCompression`` (its dependencies are not on PyPI)."""

from .png_compression import PngCompression

__all__ = ["PngCompression"]
