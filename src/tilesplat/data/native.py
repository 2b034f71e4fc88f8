"""``camera_mode``: what each camera of a capture trains as, ``undistort`` (the default,
:func:`.undistort.plan`: distorted cameras undistorted on load) or ``native`` (:func:`native_plan`:
a distorted camera keeps its lens and full image, :mod:`.lens`, rendered through 3DGUT)."""

from __future__ import annotations

from collections.abc import Callable

from .lens import lens_of
from .undistort import Camera, Plan, plan

CAMERA_MODES = ("undistort", "native")


def native_plan(cam: Camera) -> Plan:
    """What ``cam`` trains as with ``camera_mode = "native"``: its own lens at its own size
    when it has a distortion that :func:`.undistort.plan` would remap and :func:`lens_of`
    can hold; else what the undistort mode does (a pinhole or equidistant camera as it is,
    or, with the reason, the undistortion)."""
    base = plan(cam)
    if not base.remap:
        return base
    lens = lens_of(cam.model, cam.params, cam.width, cam.height)
    head = f"{cam.model} {cam.width}x{cam.height}"
    if lens is None:
        return Plan(base.source, base.target, True,
                    f"{base.note} (camera_mode = native: gsplat's cameras have no {cam.model} "
                    "lens like this one)")
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
    if camera_mode not in CAMERA_MODES:
        raise ValueError(f"camera_mode must be one of {list(CAMERA_MODES)}, got {camera_mode!r}")
    return native_plan if camera_mode == "native" else plan
