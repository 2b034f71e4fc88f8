"""Structure-from-motion: a folder of photos to a COLMAP dataset, in-process with pycolmap.

``pycolmap`` is the optional extra ``tilesplat[sfm]``; it is imported only inside
:func:`prepare`, so this package imports without it. See ``docs/sfm.md``.
"""

from .photos import IMAGE_SUFFIXES, Photo, scan_photos, stage_photos
from .pipeline import (
    INSTALL_HINT,
    MATCHERS,
    REPORT_FILE,
    SFM_CAMERA_MODELS,
    PrepareReport,
    import_pycolmap,
    prepare,
)

__all__ = [
    "IMAGE_SUFFIXES",
    "INSTALL_HINT",
    "MATCHERS",
    "REPORT_FILE",
    "SFM_CAMERA_MODELS",
    "Photo",
    "PrepareReport",
    "import_pycolmap",
    "prepare",
    "scan_photos",
    "stage_photos",
]
