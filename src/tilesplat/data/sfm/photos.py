"""A folder of photos, checked and staged for structure-from-motion before any work starts.

Photos are untrusted input: each file is decoded in full by Pillow (which refuses
decompression bombs) before pycolmap sees anything, and pycolmap then reads only the staged
copies written here. Nothing is unpickled.

Staging keeps what COLMAP needs from a photo: the pixels upright (the EXIF orientation is
applied, as a viewer shows the photo), at most ``max_size`` pixels on the long side, and the
EXIF block, whose focal length (with the camera make and model) seeds the intrinsics. A JPEG
or PNG that needs no change is copied byte for byte.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".webp")
MIN_IMAGES = 3  # two views make a model of one pair: nothing to train on
MIN_SIDE = 32  # px: SIFT's smallest octaves need room
_EXIF_IFD = 0x8769
_EXIF_FOCAL = 0x920A  # FocalLength (mm)
_EXIF_FOCAL_35MM = 0xA405  # FocalLengthIn35mmFilm
_ORIENTATION = 0x0112


@dataclass
class Photo:
    """One input photo.

    Attributes:
        name: file name in the input folder.
        path: the file.
        width, height: pixels as stored (before the EXIF orientation is applied).
        exif_focal: the EXIF focal length in mm (35 mm equivalent when only that is given),
            or None.
        staged: the staged file's name (set by :func:`stage_photos`).
        staged_size: its (width, height) (set by :func:`stage_photos`).
    """

    name: str
    path: Path
    width: int
    height: int
    exif_focal: float | None
    staged: str = ""
    staged_size: tuple[int, int] = (0, 0)


def _exif_focal(pil: Image.Image) -> float | None:
    try:
        ifd = pil.getexif().get_ifd(_EXIF_IFD)
        for tag in (_EXIF_FOCAL, _EXIF_FOCAL_35MM):
            value = ifd.get(tag)
            if value is not None and float(value) > 0:
                return float(value)
    except (TypeError, ValueError, ZeroDivisionError, OSError):  # a malformed EXIF block
        return None
    return None


def _open_checked(path: Path) -> Image.Image:
    """The decoded image; ValueError naming the file when it cannot be read."""
    pil = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            pil = Image.open(path)
            pil.load()
    except (
        UnidentifiedImageError,
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as e:
        if pil is not None:
            pil.close()
        raise ValueError(f"{path.name}: {e}") from e
    return pil


def scan_photos(folder: str | Path) -> list[Photo]:
    """The photos of ``folder`` (its image files, not subfolders), sorted by name, each decoded.

    Raises:
        FileNotFoundError: the folder does not exist.
        ValueError: no images, fewer than MIN_IMAGES, images too small, or unreadable files
            (all named in one line).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"images folder not found: {folder}")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if not images:
        others = f" (found {len(files)} other files)" if files else " (it is empty)"
        raise ValueError(
            f"no images in {folder}{others}: expected photos named *" + ", *".join(IMAGE_SUFFIXES)
        )
    photos, bad, small = [], [], []
    for path in images:
        try:
            pil = _open_checked(path)
        except ValueError as e:
            bad.append(str(e))
            continue
        with pil:
            if min(pil.size) < MIN_SIDE:
                small.append(f"{path.name} ({pil.size[0]}x{pil.size[1]})")
            photos.append(Photo(path.name, path, pil.size[0], pil.size[1], _exif_focal(pil)))
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ValueError(
            f"{len(bad)} of {len(images)} images in {folder} cannot be read: "
            + "; ".join(bad[:3])
            + more
            + ". Remove or re-export them."
        )
    if small:
        raise ValueError(
            f"images smaller than {MIN_SIDE} px on a side in {folder}: " + ", ".join(small[:5])
        )
    if len(photos) < MIN_IMAGES:
        raise ValueError(
            f"{folder} holds {len(photos)} image(s); structure-from-motion needs at least "
            f"{MIN_IMAGES} overlapping photos (20 or more work best)"
        )
    return photos


def one_camera(photos: list[Photo]) -> bool:
    """Whether the staged photos look like one camera: one size and one EXIF focal length."""
    return len({(p.staged_size, p.exif_focal) for p in photos}) == 1


def _staged_name(photo: Photo, reencode_as: str) -> str:
    if reencode_as == Path(photo.name).suffix.lower().lstrip(".").replace("jpeg", "jpg"):
        return photo.name
    return f"{photo.name}.{reencode_as}"  # keeps names unique: a.tif and a.png both exist


def stage_photos(photos: list[Photo], dest: str | Path, max_size: int) -> None:
    """Write each photo into ``dest`` for pycolmap and set its ``staged`` name.

    Args:
        photos: from :func:`scan_photos`.
        dest: an existing empty folder.
        max_size: the long side in pixels after staging (larger photos are shrunk with a
            Lanczos filter); 0 keeps every size.
    """
    dest = Path(dest)
    for photo in photos:
        suffix = photo.path.suffix.lower()
        with _open_checked(photo.path) as pil:
            orientation = pil.getexif().get(_ORIENTATION, 1)
            too_big = max_size > 0 and max(pil.size) > max_size
            plain = pil.mode in ("RGB", "L")
            if suffix in (".jpg", ".jpeg", ".png") and orientation == 1 and not too_big and plain:
                photo.staged, photo.staged_size = photo.name, pil.size
                shutil.copyfile(photo.path, dest / photo.staged)
                continue
            exif = pil.info.get("exif")
            img = ImageOps.exif_transpose(pil)  # upright; its EXIF loses the orientation tag
            exif = img.info.get("exif", exif)
            if img.mode in ("I", "I;16", "I;16B", "I;16L"):  # 16-bit grey, as read_image does
                grey = np.clip(np.asarray(img, dtype=np.float64) / 65535.0, 0.0, 1.0)
                img = Image.fromarray(np.round(grey * 255.0).astype(np.uint8))
            img = img.convert("RGB")
            if too_big:
                scale = max_size / max(img.size)
                size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
                img = img.resize(size, Image.Resampling.LANCZOS)
            fmt = "jpg" if suffix in (".jpg", ".jpeg") else "png"
            photo.staged, photo.staged_size = _staged_name(photo, fmt), img.size
            kwargs = {"exif": exif} if exif else {}
            if fmt == "jpg":
                img.save(dest / photo.staged, format="JPEG", quality=95, **kwargs)
            else:
                img.save(dest / photo.staged, format="PNG", **kwargs)
