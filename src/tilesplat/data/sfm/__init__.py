"""Structure-from-motion: a folder of photos to a COLMAP dataset, in-process with pycolmap.

``pycolmap`` is the optional extra ``tilesplat[sfm]``; it is imported only inside
:func:`prepare`, so this package imports without it. See ``docs/sfm.md``.
"""

from .photos import IMAGE_SUFFIXES, Photo, scan_photos, stage_photos
from .pipeline import (
    CAMERA_MODELS,
    INSTALL_HINT,
    MATCHERS,
    REPORT_FILE,
    PrepareReport,
    import_pycolmap,
    prepare,
)

__all__ = [
    "CAMERA_MODELS",
    "IMAGE_SUFFIXES",
    "INSTALL_HINT",
    "MATCHERS",
    "REPORT_FILE",
    "Photo",
    "PrepareReport",
    "import_pycolmap",
    "prepare",
    "scan_photos",
    "stage_photos",
]
