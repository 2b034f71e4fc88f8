"""``camera_mode``: what each camera of a capture trains as, ``undistort`` (the default,
:func:`.undistort.plan`: distorted cameras undistorted on load) or ``native`` (:func:`native_plan`:
a distorted camera keeps its lens and full image, :mod:`.lens`, rendered through 3DGUT).

A native run renders every camera through 3DGUT, an undistorted one (a pinhole, an equidistant
fisheye, or a lens gsplat cannot hold, undistorted on load) through a lens of zero
coefficients: a model trained by 3DGUT's rasterizer, which evaluates each Gaussian in 3D, is
rendered by it too (the 2D rasterizer shows it otherwise: 1.5 dB lower on a pinhole capture,
docs/data.md). The loader's third mode, ``pinhole`` (:func:`pinhole_plan`), loads the cameras as
``undistort`` does and renders them through 3DGUT: how a native run is seen through a pinhole
(``tilesplat render / eval --pinhole``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .lens import Lens, lens_of
from .undistort import Camera, Plan, plan

CAMERA_MODES = ("undistort", "native")  # the config key's values
LOAD_MODES = (*CAMERA_MODES, "pinhole")  # the loaders'


def zero_lens(camera_model: str) -> Lens:
    """The lens of no distortion of ``camera_model`` (``pinhole`` or ``fisheye``): 3DGUT's
    render of the plain camera."""
    if camera_model == "fisheye":
        return Lens("fisheye", (0.0,) * 4)
    return Lens("pinhole", (0.0,) * 6, (0.0, 0.0))


def pinhole_plan(cam: Camera) -> Plan:
    """:func:`.undistort.plan`, the camera it gives rendered through 3DGUT (a zero lens)."""
    base = plan(cam)
    return dataclasses.replace(base, lens=zero_lens(base.target.camera_model),
                               note=f"{base.note}; rendered through 3DGUT")


def native_plan(cam: Camera) -> Plan:
    """What ``cam`` trains as with ``camera_mode = "native"``: its own lens at its own size
    when it has a distortion that :func:`.undistort.plan` would remap and :func:`lens_of`
    can hold; else what the undistort mode does (a pinhole or equidistant camera as it is,
    or, with the reason, the undistortion), rendered through 3DGUT with a zero lens."""
    base = plan(cam)
    lens = lens_of(cam.model, cam.params, cam.width, cam.height) if base.remap else None
    head = f"{cam.model} {cam.width}x{cam.height}"
    if lens is None:
        why = (f" (camera_mode = native: gsplat's cameras have no {cam.model} lens like this "
               "one)" if base.remap else "")
        return dataclasses.replace(base, lens=zero_lens(base.target.camera_model),
                                   note=f"{base.note}{why}; rendered through 3DGUT")
    return Plan(cam, cam, False,
                f"{head}: trained natively through its lens (3DGUT, {lens.camera_model} "
                f"radial {[round(v, 6) for v in lens.radial]}"
                + (f", tangential {list(lens.tangential)}" if lens.tangential else "")
                + f"), full image {cam.width}x{cam.height}, not undistorted", lens)


def planner(camera_mode: str) -> Callable[[Camera], Plan]:
    """The planning function of ``camera_mode``.

    Raises:
        ValueError: an unknown mode (naming the valid ones).
    """
    if camera_mode not in LOAD_MODES:
        raise ValueError(f"camera_mode must be one of {list(LOAD_MODES)}, got {camera_mode!r}")
    return {"undistort": plan, "native": native_plan, "pinhole": pinhole_plan}[camera_mode]
