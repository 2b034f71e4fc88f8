"""Posed images of a calibrated capture to :class:`.frames.Frame` objects: what the COLMAP and
nerfstudio readers share once they have found each image's file, camera, pose and mask.

For each :class:`Shot` this reads the image (from the ``images_N`` folder when the reader
names one and it exists, else the full image shrunk by ``downscale``), its mask (shrunk the
same way), and trains its camera as :func:`.undistort.plan` says: pinhole or fisheye as it
is, or undistorted (with the images and masks remapped, and the result cached beside the
dataset by :class:`.undistort_cache.UndistortCache`). One line per distinct camera says which.
Each image is decoded once at load in the decoding threads of :mod:`.image_cache` (checking
every file and filling the cache), and again, to the same values, when a step needs an image
the cache has dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..io.images import decode_image, image_size, resize_image, to_float
from .frames import Frame, read_mask
from .image_cache import CACHE, StoredImage, decode_all, new_key
from .native import planner
from .pixels import LazyPixels, MaskBits
from .undistort import Camera, Plan, Remap
from .undistort_cache import UndistortCache, file_stamp

Log = Callable[[str], None]


@dataclass
class Shot:
    """One posed image as a reader found it.

    Attributes:
        name: the frame's name (the image's file stem).
        key: unique among the dataset's shots (the image's name in the model).
        image_file: the full-resolution image.
        camera: its camera at the full resolution.
        viewmat: [4, 4] float64 world-to-camera, OpenCV axes.
        mask_file: its mask at the full resolution, or None.
        downscaled: ``{N: (image file, mask file or None)}`` of the reader's ``images_N`` (and
            ``masks_N``) folders, used when they exist for the asked ``downscale``.
    """

    name: str
    key: str
    image_file: Path
    camera: Camera
    viewmat: np.ndarray
    mask_file: Path | None = None
    downscaled: dict[int, tuple[Path, Path | None]] | None = None


def _source(shot: Shot, downscale: int) -> tuple[Path, Path | None, tuple[int, int], Camera]:
    """(image file, mask file, loaded (w, h), camera at the loaded size) of ``shot``."""
    cam = shot.camera
    pre = (shot.downscaled or {}).get(downscale)
    if downscale > 1 and pre is not None and pre[0].is_file():
        w, h = image_size(pre[0])
        # images_N folders are made with rounding up or down depending on the tool
        if abs(w - cam.width / downscale) > 1 or abs(h - cam.height / downscale) > 1:
            raise ValueError(
                f"{pre[0]}: image is {w}x{h} but the camera is {cam.width}x{cam.height}, so "
                f"this folder should hold {cam.width // downscale}x{cam.height // downscale} "
                "images"
            )
        mask = pre[1] if pre[1] is not None and pre[1].is_file() else shot.mask_file
        return pre[0], mask, (w, h), cam.scaled(w / cam.width, h / cam.height)
    if not shot.image_file.is_file():
        raise FileNotFoundError(f"image of '{shot.key}' not found: {shot.image_file}")
    w, h = image_size(shot.image_file)
    if (w, h) != (cam.width, cam.height):
        raise ValueError(
            f"{shot.image_file}: image is {w}x{h} but its camera ({cam.model}) is "
            f"{cam.width}x{cam.height}"
        )
    size = (max(1, w // downscale), max(1, h // downscale))
    return shot.image_file, shot.mask_file, size, cam.scaled(size[0] / w, size[1] / h)


def _decode(image_file: Path, size: tuple[int, int]) -> np.ndarray:
    """The image as stored: the file's uint8 (or 16-bit float32) at its size, float32
    shrunk to ``size`` (box filter) otherwise."""
    img = decode_image(image_file)
    if (img.shape[1], img.shape[0]) != size:
        return resize_image(img, *size)
    return img


def _read_mask(image_file: Path, mask_file: Path | None, size: tuple[int, int]
               ) -> np.ndarray | None:
    """The [h, w] bool mask of ``image_file`` loaded at ``size``, or None without a file."""
    if mask_file is None:
        return None
    # a mask of the loaded size (masks_N/) or of the image file's
    mask_size = image_size(mask_file, f"mask {mask_file} of image {image_file}")
    ref = size if mask_size == size else image_size(image_file)
    return read_mask(mask_file, image_file, ref, size)


def quantised(image: np.ndarray) -> np.ndarray:
    """uint8 of an image :meth:`.undistort.Remap.image` rounded to 8 bits (k / 255 in float32,
    which ``to_float`` of the result gives back bit for bit)."""
    return np.rint(image * np.float32(255.0)).astype(np.uint8)


def load_shots(shots: list[Shot], root: Path, downscale: int, log: Log,
               camera_mode: str = "undistort") -> list[Frame]:
    """The frames of ``shots`` (same order), undistorted where their cameras need it; with
    ``camera_mode = "native"`` a distorted camera keeps its lens (:func:`.native.native_plan`).

    Raises:
        FileNotFoundError / ValueError: a missing or unreadable image or mask, a size that
            does not match the camera, an unsupported camera model (each naming the file).
    """
    plan = planner(camera_mode)
    sources = [_source(s, downscale) for s in shots]
    plans: dict[Camera, Plan] = {}
    for _, _, _, cam in sources:
        if cam not in plans:
            plans[cam] = plan(cam)
            log(f"camera {plans[cam].note}")
    remapped = [i for i, src in enumerate(sources) if plans[src[3]].remap]
    cache = None
    if remapped:
        parts = {
            "downscale": downscale,
            "frames": [[shots[i].key, file_stamp(sources[i][0], root),
                        file_stamp(sources[i][1], root),
                        list(sources[i][3].params), sources[i][3].model,
                        list(plans[sources[i][3]].target.params)] for i in remapped],
        }
        cache = UndistortCache(root, parts, [shots[i].key for i in remapped], log)
    try:
        frames = _load_frames(shots, sources, plans, cache, log)
    except BaseException:
        if cache is not None:
            cache.abandon()
        raise
    if cache is not None:
        cache.finish()
    return frames


@dataclass(frozen=True)
class _Decoder:
    """How one frame's image and mask are made from its files.

    Attributes:
        name: the shot's key (its name in the undistortion cache).
        image_file, mask_file: the files read; size: the loaded (width, height).
        table: the remap that undistorts the image, or None.
        cache: the undistortion cache the remapped image is written to, or None.
        cached: read the image and mask from ``cache`` (a hit) instead.
    """

    name: str
    image_file: Path
    mask_file: Path | None
    size: tuple[int, int]
    table: Remap | None = None
    cache: UndistortCache | None = None
    cached: bool = False

    def image(self) -> StoredImage:
        """The image alone, as the image cache holds it (what an evicted frame decodes)."""
        if self.cached:
            return StoredImage(self.cache.read_stored(self.name)[0])  # type: ignore[union-attr]
        img = _decode(self.image_file, self.size)
        if self.table is not None:
            img = quantised(self.table.image(to_float(img)[:, :, :3]))
        return StoredImage(img)

    def image_and_mask(self) -> tuple[StoredImage, np.ndarray | None]:
        """The image and its [h, w] bool mask (or None), the undistorted ones written to the
        undistortion cache (what the load does once)."""
        if self.cached:
            img, keep = self.cache.read_stored(self.name)  # type: ignore[union-attr]
            return StoredImage(img), keep
        img = _decode(self.image_file, self.size)
        keep = _read_mask(self.image_file, self.mask_file, self.size)
        if self.table is not None:
            img, keep = self.table.image(to_float(img)[:, :, :3]), self.table.mask(keep)
            if self.cache is not None:
                self.cache.write(self.name, img, keep)
            img = quantised(img)
        return StoredImage(img), keep


def _load_frames(shots: list[Shot], sources: list, plans: dict[Camera, Plan],
                 cache: UndistortCache | None, log: Log) -> list[Frame]:
    """The frames, each image decoded once in the decoding threads (which checks it and
    puts it in the image cache) and again from its file whenever the cache has dropped it."""
    tables: dict[Camera, Remap] = {}
    decoders = []
    for shot, (image_file, mask_file, size, cam) in zip(shots, sources, strict=True):
        p = plans[cam]
        hit = p.remap and cache is not None and cache.hit
        table = None
        if p.remap and not hit:
            table = tables.get(cam) or tables.setdefault(cam, Remap(cam, p.target))
        decoders.append(_Decoder(shot.key, image_file, mask_file, size, table,
                                 cache if p.remap else None, bool(hit)))
    keys = [new_key() for _ in shots]
    loaded = decode_all([functools.partial(_first_decode, d.image_and_mask, k)
                         for d, k in zip(decoders, keys, strict=True)], log)
    frames = []
    for shot, (_, _, _, cam), key, decoder, (size, has_alpha, keep) in zip(
            shots, sources, keys, decoders, loaded, strict=True):
        p = plans[cam]
        frames.append(Frame(
            name=shot.name,
            viewmat=torch.from_numpy(shot.viewmat).float(),
            K=torch.from_numpy(p.target.K()).float(),
            width=size[0],
            height=size[1],
            pixels=LazyPixels(decoder.image, size, has_alpha, key=key),
            mask_bits=MaskBits.of(keep),
            camera_model=p.lens.camera_model if p.lens is not None else p.target.camera_model,
            lens=p.lens,
        ))
    return frames


def _first_decode(read: Callable[[], tuple[StoredImage, np.ndarray | None]], key: int
                  ) -> tuple[tuple[int, int], bool, np.ndarray | None]:
    """Decode a frame's image and mask, put the image in the cache under ``key``: (size,
    has_alpha, mask)."""
    stored, keep = read()
    CACHE.put(key, stored)
    return stored.size, stored.has_alpha, keep
