"""``camera_mode``: how the trainer takes a distorted capture (issue 38).

- ``undistort`` (the default): distorted cameras are undistorted on load (``data/undistort.py``:
  COLMAP's ``image_undistorter``, which crops a wide lens to the rectangle it fills);
- ``native``: each camera keeps its own lens and its full image (``data/lens.py``: COLMAP's
  and nerfstudio's distortion parameters as gsplat's coefficients); the frames carry the lens,
  the batch's cameras carry it (``models.base.Cameras.lens``) and the model kind renders
  through it with 3DGUT (``rasterization(with_ut=True, with_eval3d=True, radial_coeffs=...)``),
  the step, the evaluation and the renders alike; its undistorted pinhole and equidistant
  cameras render through 3DGUT too, with a zero lens (``data/native.py``).

3DGUT as gsplat has it asks of the run (:func:`errors`): ``strategy = "mcmc"`` (its
rasterizer evaluates the Gaussians in 3D, so the screen-space means that the default
densification grows by get no gradient; gsplat supports MCMC only with 3DGUT),
``packed = false`` and no model-parallel sharding (``rasterization`` renders both with 3DGUT;
the trainer's steps for them do not carry the lenses yet, nor does its CUDA graph, which a
native run does without); ``model = "2dgs"`` refuses it
(``models/surfels.py``). When each mode pays: docs/data.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...data.native import CAMERA_MODES
from ...keys import Key
from .. import seams

if TYPE_CHECKING:
    from ..config import TrainConfig

KEYS = (
    Key("camera_mode", "undistort", "distorted captures (COLMAP OPENCV, FULL_OPENCV, "
        "OPENCV_FISHEYE, SIMPLE_RADIAL, RADIAL, THIN_PRISM_FISHEYE; nerfstudio OPENCV, "
        "OPENCV_FISHEYE): undistort on load (crops wide lenses) or native (each frame keeps its "
        "lens and full image, rendered through it by 3DGUT; needs strategy = mcmc); "
        "docs/data.md", choices=CAMERA_MODES),
)


def errors(cfg: TrainConfig) -> list[str]:
    """What ``camera_mode = "native"`` needs of the other keys (empty in undistort mode)."""
    if cfg.camera_mode != "native":
        return []
    bad = []
    if cfg.strategy != "mcmc":
        bad.append(f"camera_mode = 'native' needs strategy = 'mcmc' (3DGUT's rasterizer gives "
                   f"the screen-space means no gradient, which the {cfg.strategy!r} strategy "
                   f"densifies by; gsplat supports MCMC only with 3DGUT), got {cfg.strategy!r}")
    if cfg.packed:
        bad.append("camera_mode = 'native' needs packed = false (the trainer's packed 3DGUT "
                   "step is not tested yet)")
    if cfg.parallel == "model":
        bad.append("camera_mode = 'native' does not train with parallel = 'model' yet (the "
                   "model-parallel step does not carry the lenses); use parallel = 'data'")
    return bad


seams.register_keys("camera mode (train/features/camera_mode.py)", KEYS, errors)


def pinhole_mode(cfg: TrainConfig) -> str:
    """The loaders' camera mode that shows ``cfg``'s run through a pinhole (``tilesplat render
    / eval --pinhole``, the flythrough's ``pinhole``): each distorted camera as ``camera_mode =
    "undistort"`` makes it, a pinhole (an equidistant fisheye for a lens more than 60 degrees
    off axis at its border, ``data/undistort.py``) with the undistorted images and masks,
    rendered as the run was trained (a native run through 3DGUT: ``data/native.py``'s
    ``pinhole``)."""
    return "pinhole" if cfg.camera_mode == "native" else "undistort"
