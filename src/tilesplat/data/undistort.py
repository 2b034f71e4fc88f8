"""Undistortion of COLMAP cameras: which camera a lens trains as, and the remap of its images.

What a camera becomes (:func:`plan`, one log line each):

- ``SIMPLE_PINHOLE`` / ``PINHOLE``, and a distorted perspective model (``SIMPLE_RADIAL``,
  ``RADIAL``, ``OPENCV``, ``FULL_OPENCV``, ``FOV``) whose distortion moves no pixel by more than
  ``NEGLIGIBLE_PX``: a pinhole camera with its own intrinsics, images as they are.
- A distorted perspective model: undistorted to ``PINHOLE`` as COLMAP's ``image_undistorter``
  does with its default options (``UndistortCamera`` in ``src/colmap/image/undistortion.cc``):
  the focal lengths are kept, the border pixels are traced through the lens, the image is
  scaled (within [0.2, 2]) so that it holds no blank pixel, its size is the scaled size
  rounded down, and the principal point scales with the size. Each output pixel centre is
  traced back into the distorted image and sampled bilinearly from the four pixel centres
  around it (black, and masked out, where one of them is missing), as COLMAP's warp.
- A fisheye model (``OPENCV_FISHEYE``, ``SIMPLE_RADIAL_FISHEYE``, ``RADIAL_FISHEYE``,
  ``SIMPLE_FISHEYE``, ``FISHEYE``) or ``FOV``:
    - distortion within ``NEGLIGIBLE_PX`` of the equidistant model r = f theta (the
      rasterizer's ``fisheye`` camera): trained natively as that fisheye, images as they are;
    - otherwise, when no border ray is more than ``PINHOLE_MAX_DEGREES`` off axis, undistorted
      to ``PINHOLE`` as above (a pinhole holds such a view without stretching it much);
    - otherwise undistorted to an equidistant fisheye (COLMAP's ``FISHEYE`` model) by the same
      rules in the equidistant image, and trained natively as the rasterizer's fisheye.

The remap runs in PyTorch (``grid_sample``) on the CPU, from a table computed once per camera
(:class:`Remap`); results are rounded to 8 bits as COLMAP writes them, so a cached image and a
freshly undistorted one are the same. Pixels with no source (blank) come back in a validity
mask, which the dataset turns into the frame's training mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import camera_models as cm

if TYPE_CHECKING:
    from .lens import Lens

NEGLIGIBLE_PX = 0.1  # distortion that moves no pixel further than this is left as it is
PINHOLE_MAX_DEGREES = 60.0  # a wider fisheye stays a fisheye (tan 60 deg = 1.7 x the focal)
# COLMAP's UndistortCameraOptions defaults
MIN_SCALE, MAX_SCALE = 0.2, 2.0
DIRECT_WARP_MIN_SCALE = 0.5  # COLMAP warps at the source size below this, then resizes


@dataclass(frozen=True)
class Camera:
    """A COLMAP camera's intrinsics: ``model``, image size, ``params`` [n] float64."""

    model: str
    width: int
    height: int
    params: tuple[float, ...]

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.params, dtype=np.float64)

    @property
    def camera_model(self) -> str:
        """The rasterizer's ``camera_model`` that renders this camera (pinhole or fisheye)."""
        return "fisheye" if self.model in cm.EQUIDISTANT_MODELS else "pinhole"

    def K(self) -> np.ndarray:
        """[3, 3] intrinsics (focal lengths and principal point)."""
        fx, fy, cx, cy = cm.intrinsics(self.model, self.array)
        return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])

    def scaled(self, sx: float, sy: float) -> Camera:
        """This camera for images resized by (sx, sy) (COLMAP's ``Camera::Rescale``: one focal
        length scales by the mean of the two)."""
        p = list(self.params)
        n_focal = cm.MODELS[self.model][0]
        if n_focal == 1:
            p[0] *= 0.5 * (sx + sy)
        else:
            p[0] *= sx
            p[1] *= sy
        p[n_focal] *= sx
        p[n_focal + 1] *= sy
        return Camera(self.model, round(self.width * sx), round(self.height * sy), tuple(p))


@dataclass(frozen=True)
class Plan:
    """What a camera trains as: ``target`` (PINHOLE or FISHEYE; the source itself when
    trained through its ``lens``, :mod:`.lens`), whether its images are remapped, and the
    line that says so."""

    source: Camera
    target: Camera
    remap: bool
    note: str
    lens: Lens | None = None


def _ideal(model: str, cam: Camera) -> Camera:
    fx, fy, cx, cy = cm.intrinsics(cam.model, cam.array)
    return Camera(model, cam.width, cam.height, (fx, fy, cx, cy))


def _displacement(cam: Camera, ideal: Camera) -> float:
    return cm.max_displacement(cam.model, cam.array, cam.width, cam.height,
                               lambda rays: cm.img_from_ray(ideal.model, ideal.array, rays)[0])


def undistorted_camera(cam: Camera, target_model: str = "PINHOLE") -> Camera:
    """The camera COLMAP's ``UndistortCamera`` makes of ``cam`` (default options: no blank
    pixels, scale within [0.2, 2]); with ``target_model = "FISHEYE"`` the same rules in an
    equidistant fisheye image.

    Raises:
        ValueError: no border pixel of ``cam`` can be traced (a degenerate lens).
    """
    target = _ideal(target_model, cam)
    w, h = cam.width, cam.height
    xs, ys = np.arange(w) + 0.5, np.arange(h) + 0.5

    def trace(px: np.ndarray, axis: int) -> np.ndarray:
        rays, ok = cm.ray_from_img(cam.model, cam.array, px)
        out, valid = cm.img_from_ray(target.model, target.array, rays)
        return out[ok & valid, axis]

    left = trace(np.stack([np.full_like(ys, 0.5), ys], -1), 0)
    right = trace(np.stack([np.full_like(ys, w - 0.5), ys], -1), 0)
    top = trace(np.stack([xs, np.full_like(xs, 0.5)], -1), 1)
    bottom = trace(np.stack([xs, np.full_like(xs, h - 0.5)], -1), 1)
    if not (len(left) and len(right) and len(top) and len(bottom)):
        raise ValueError(
            f"camera {cam.model} {cam.params}: its border pixels cannot be traced through the "
            "lens (the distortion does not invert); check the calibration"
        )
    _, _, cx, cy = target.params
    with np.errstate(divide="ignore", invalid="ignore"):
        # scale so that the undistorted image holds no blank pixel (COLMAP's blank_pixels = 0)
        scale_x = max(cx / (cx - left.max()), (w - 0.5 - cx) / (right.min() - cx))
        scale_y = max(cy / (cy - top.max()), (h - 0.5 - cy) / (bottom.min() - cy))
    sx = min(max(1.0 / scale_x, MIN_SCALE), MAX_SCALE) if np.isfinite(scale_x) else MAX_SCALE
    sy = min(max(1.0 / scale_y, MIN_SCALE), MAX_SCALE) if np.isfinite(scale_y) else MAX_SCALE
    new_w, new_h = int(max(1.0, sx * w)), int(max(1.0, sy * h))
    fx, fy = target.params[:2]
    return Camera(target_model, new_w, new_h, (fx, fy, cx * new_w / w, cy * new_h / h))


def plan(cam: Camera) -> Plan:
    """What ``cam`` trains as (see the module docstring)."""
    cm.check_model(cam.model, cam.array, f"camera {cam.model}")
    head = f"{cam.model} {cam.width}x{cam.height}"
    if cam.model in cm.PINHOLE_MODELS:
        return Plan(cam, _ideal("PINHOLE", cam), False, f"{head}: pinhole, used as it is")
    if cam.model in cm.EQUIDISTANT_MODELS:
        native = _ideal("FISHEYE", cam)
        moved = _displacement(cam, native)
        if moved <= NEGLIGIBLE_PX:
            return Plan(cam, native, False,
                        f"{head}: equidistant fisheye (distortion moves pixels at most "
                        f"{moved:.2g} px), trained natively with the fisheye camera")
    else:
        pinhole = _ideal("PINHOLE", cam)
        moved = _displacement(cam, pinhole)
        if moved <= NEGLIGIBLE_PX:
            return Plan(cam, pinhole, False,
                        f"{head}: distortion moves pixels at most {moved:.2g} px, used as a "
                        "pinhole as it is")
    wide = cam.model in cm.EQUIDISTANT_MODELS or cam.model == "FOV"
    degrees = cm.max_off_axis_degrees(cam.model, cam.array, cam.width, cam.height)
    if wide and degrees > PINHOLE_MAX_DEGREES:
        target = undistorted_camera(cam, "FISHEYE")
        why = (f"fisheye up to {degrees:.0f} deg off axis (> {PINHOLE_MAX_DEGREES:.0f}), "
               f"distortion beyond the equidistant model (up to {moved:.1f} px): undistorted "
               f"to an equidistant fisheye {target.width}x{target.height}, trained natively "
               "with the fisheye camera")
    else:
        target = undistorted_camera(cam, "PINHOLE")
        why = (f"distortion up to {moved:.1f} px"
               + (f", up to {degrees:.0f} deg off axis" if wide else "")
               + f": undistorted to PINHOLE {target.width}x{target.height} as COLMAP's "
               "image_undistorter")
    return Plan(cam, target, True, f"{head}: {why}")


class Remap:
    """The table that undistorts images of one camera: for every target pixel, where it
    samples the source image (``grid_sample``'s normalised coordinates) and whether all four
    source pixels around it exist."""

    def __init__(self, source: Camera, target: Camera) -> None:
        self.source, self.target = source, target
        warp = target
        shrink = min(target.width / source.width, target.height / source.height)
        self.resize = shrink < DIRECT_WARP_MIN_SCALE  # COLMAP: warp at the source size first
        if self.resize:
            warp = target.scaled(source.width / target.width, source.height / target.height)
        rays, _ = cm.ray_from_img(warp.model, warp.array, cm.pixel_grid(warp.width, warp.height))
        src, ok = cm.img_from_ray(source.model, source.array, rays)
        sx, sy = src[..., 0] - 0.5, src[..., 1] - 0.5  # pixel-centre index coordinates
        ok &= (sx >= 0) & (sx < source.width - 1) & (sy >= 0) & (sy < source.height - 1)
        grid = np.stack([2.0 * src[..., 0] / source.width - 1.0,
                         2.0 * src[..., 1] / source.height - 1.0], -1)
        self.grid = torch.from_numpy(np.where(ok[..., None], grid, -2.0).astype(np.float32))
        self.valid = torch.from_numpy(ok)
        self.all_valid = bool(ok.all())

    def _sample(self, image: torch.Tensor) -> torch.Tensor:
        """[H, W, C] float -> [h, w, C] bilinear at the table's points (zeros outside)."""
        out = torch.nn.functional.grid_sample(
            image.permute(2, 0, 1)[None].float(), self.grid[None], mode="bilinear",
            padding_mode="zeros", align_corners=False)[0].permute(1, 2, 0)
        return out

    def _finish(self, image: torch.Tensor) -> torch.Tensor:
        if not self.resize:
            return image
        from ..io.images import resize_image

        return torch.from_numpy(resize_image(image.numpy(), self.target.width, self.target.height))

    def image(self, image: np.ndarray) -> np.ndarray:
        """An image of the source camera [H, W, C] float32 in [0, 1] undistorted: [h, w, C]
        float32, rounded to 8 bits, black where it has no source pixels."""
        if image.shape[:2] != (self.source.height, self.source.width):
            raise ValueError(
                f"image is {image.shape[1]}x{image.shape[0]}, its camera "
                f"{self.source.width}x{self.source.height}"
            )
        out = self._sample(torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)))
        out = self._finish(out * self.valid[..., None])
        return (torch.round(out.clamp(0.0, 1.0) * 255.0) / 255.0).numpy().astype(np.float32)

    def mask(self, keep: np.ndarray | None) -> np.ndarray | None:
        """The target pixels to train on [h, w] bool: those with source pixels, and (with a
        source mask ``keep`` [H, W] bool) all of whose source pixels are kept; None when every
        pixel counts."""
        if keep is None and self.all_valid:
            return None
        src = np.ones((self.source.height, self.source.width), np.float32) if keep is None \
            else keep.astype(np.float32)
        got = self._sample(torch.from_numpy(src)[..., None])[..., 0] * self.valid
        got = self._finish(got[..., None])[..., 0]
        out = (got >= 1.0 - 1e-4).numpy()
        return None if out.all() else out

