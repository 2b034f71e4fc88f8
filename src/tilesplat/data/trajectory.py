"""Camera paths through a scene, computed from its training cameras (``tilesplat render --path``).

Every path is a list of world-to-camera matrices in the loaders' convention (OpenCV axes: x
right, y down, z forward; ``frames.py``), in float64 NumPy, from three things the training
cameras give:

- the **up vector**: the mean of the cameras' up directions (their -y axis), normalised;
- the **focus**: the point nearest to every optical axis (:func:`.frames.look_at_point`), or,
  when the axes do not meet in front of the cameras (a forward-facing capture), a point on the
  mean viewing direction at the median depth of the scene's points (else at the cameras'
  spread);
- the **radii**: the 90th percentile of the cameras' offsets along the path's axes, so that a
  stray camera does not widen the path.

The paths (the ideas of gsplat's ``examples/datasets/traj.py``, written anew):

- ``ellipse``: one turn in the plane normal to the up vector, at the cameras' mean height over
  the focus, centred on the focus and stretched along the cameras' principal direction; it
  starts at the angle of the first training camera; every camera looks at the focus.
- ``spiral``: around the mean camera, in its image plane (radii from the cameras' spread there),
  moving back and forth along its view direction, two turns; every camera looks at the focus
  (made for forward-facing captures).
- ``interp``: through the training cameras themselves, chained by nearest neighbour from the
  first one; positions on a Catmull-Rom spline (which passes through each camera), rotations
  by slerp between neighbouring cameras; a frame at a camera is that camera, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from .frames import look_at_point

PATHS = ("ellipse", "spiral", "interp")
MAX_FRAMES = 10_000  # 5.5 minutes at 30 fps: more is a typo, not a flythrough
PERCENTILE = 90  # radii: this percentile of the cameras' offsets (a stray one does not count)
SPIRAL_TURNS = 2
SPIRAL_DEPTH_RATE = 0.5  # turns of the back-and-forth motion per turn of the spiral
EPS = 1e-9


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def camera_to_world(viewmats: np.ndarray) -> np.ndarray:
    """[C, 4, 4] camera-to-world matrices of world-to-camera ``viewmats`` [C, 4, 4]."""
    R = viewmats[:, :3, :3]
    t = viewmats[:, :3, 3]
    out = np.zeros_like(viewmats)
    out[:, :3, :3] = np.transpose(R, (0, 2, 1))
    out[:, :3, 3] = -np.einsum("cji,cj->ci", R, t)
    out[:, 3, 3] = 1.0
    return out


def world_to_camera(c2w: np.ndarray) -> np.ndarray:
    """[C, 4, 4] world-to-camera matrices of camera-to-world ``c2w`` [C, 4, 4]."""
    return camera_to_world(c2w)  # the same inversion of a rigid transform


def look_at(positions: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    """World-to-camera matrices [F, 4, 4] of cameras at ``positions`` [F, 3] looking at
    ``target`` [3] with ``up`` [3] (a world direction) up in their images.

    Raises:
        ValueError: a position at the target, or looking along ``up``.
    """
    forward = target[None] - positions
    if np.any(np.linalg.norm(forward, axis=1) < EPS):
        raise ValueError("a camera of the path sits at the point it looks at")
    z = _unit(forward)
    x = np.cross(z, up[None])  # right = forward x up (OpenCV: y = down = z x x)
    if np.any(np.linalg.norm(x, axis=1) < 1e-6):
        raise ValueError("a camera of the path looks straight along the up vector")
    x = _unit(x)
    y = np.cross(z, x)
    c2w = np.zeros((len(positions), 4, 4))
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2] = x, y, z
    c2w[:, :3, 3] = positions
    c2w[:, 3, 3] = 1.0
    return world_to_camera(c2w)


class Rig:
    """What the paths are computed from: the training cameras' centres [C, 3], viewing
    directions [C, 3], the up vector [3], the focus [3] and the cameras' spread (the largest
    distance of a camera from their mean; 1 for a single camera).

    Args:
        viewmats: [C, 4, 4] world-to-camera matrices of the training cameras.
        points: [P, 3] points of the scene (the SfM points), or None; they place the focus of
            a capture whose optical axes do not meet in front of the cameras.
    """

    def __init__(self, viewmats: np.ndarray, points: np.ndarray | None = None) -> None:
        viewmats = np.asarray(viewmats, dtype=np.float64)
        if viewmats.ndim != 3 or viewmats.shape[1:] != (4, 4) or len(viewmats) == 0:
            raise ValueError(f"expected camera matrices [C, 4, 4], got {list(viewmats.shape)}")
        if not np.isfinite(viewmats).all():
            raise ValueError("the camera matrices hold NaN or infinite values")
        self.viewmats = viewmats
        self.c2w = camera_to_world(viewmats)
        self.centres = self.c2w[:, :3, 3]
        self.forwards = _unit(self.c2w[:, :3, 2])
        mean = self.centres.mean(0)
        spread = float(np.linalg.norm(self.centres - mean, axis=1).max())
        self.spread = spread if spread > EPS else 1.0
        self.up = self._up()
        self.focus = self._focus(points)

    def _up(self) -> np.ndarray:
        ups = -self.c2w[:, :3, 1]
        up = ups.mean(0)
        if np.linalg.norm(up) < 1e-3:  # cameras rolled every way: the first camera's
            up = ups[0]
        return _unit(up)

    def _focus(self, points: np.ndarray | None) -> np.ndarray:
        mean, ahead = self.centres.mean(0), _unit(self.forwards.mean(0))
        if len(self.centres) >= 2:
            focus = look_at_point(self.centres, self.forwards)
            if float((focus - mean) @ ahead) > 1e-3 * self.spread:  # in front of the cameras
                return focus
        depth = self.spread
        if points is not None and len(points):
            d = (np.asarray(points, dtype=np.float64) - mean) @ ahead
            d = d[np.isfinite(d) & (d > 0)]
            if len(d):
                depth = float(np.median(d))
        return mean + depth * ahead


def ellipse_path(rig: Rig, n: int) -> np.ndarray:
    """``n`` cameras [n, 4, 4] on one turn of an ellipse around the focus (module docstring)."""
    rel = rig.centres - rig.focus[None]
    height = float((rel @ rig.up).mean())
    planar = rel - (rel @ rig.up)[:, None] * rig.up[None]
    # the ellipse's axes: the principal directions of the cameras' offsets in the plane
    helper = np.eye(3)[int(np.argmin(np.abs(rig.up)))]
    a = _unit(np.cross(rig.up, helper))
    b = np.cross(rig.up, a)
    coords = np.stack([planar @ a, planar @ b], axis=1)  # [C, 2]
    if len(coords) >= 2:
        _, vecs = np.linalg.eigh(coords.T @ coords)
        major = vecs[:, 1]  # the largest eigenvalue's
        a, b = major[0] * a + major[1] * b, -major[1] * a + major[0] * b
        b = np.cross(rig.up, a)  # right-handed: the path turns counter-clockwise seen from up
    ca, cb = planar @ a, planar @ b
    ra, rb = (float(np.percentile(np.abs(c), PERCENTILE)) for c in (ca, cb))
    r = max(ra, rb)
    if r < EPS * rig.spread:  # the cameras stand over the focus: a circle of their spread
        ra = rb = rig.spread
    ra, rb = max(ra, 0.05 * r), max(rb, 0.05 * r)  # a camera line still gives an ellipse
    start = math.atan2(cb[0] / rb, ca[0] / ra)  # the first training camera's angle
    theta = start + 2.0 * np.pi * np.arange(n) / n
    positions = (rig.focus[None] + height * rig.up[None]
                 + ra * np.cos(theta)[:, None] * a[None] + rb * np.sin(theta)[:, None] * b[None])
    return look_at(positions, rig.focus, rig.up)


def spiral_path(rig: Rig, n: int) -> np.ndarray:
    """``n`` cameras [n, 4, 4] on a spiral around the mean camera (module docstring)."""
    mean = rig.centres.mean(0)
    ahead = _unit(rig.focus - mean) if np.linalg.norm(rig.focus - mean) > EPS else _unit(
        rig.forwards.mean(0))
    up = _unit(rig.up - (rig.up @ ahead) * ahead)
    right = np.cross(ahead, up)
    rel = rig.centres - mean[None]
    radii = [float(np.percentile(np.abs(rel @ axis), PERCENTILE)) for axis in (right, up, ahead)]
    distance = float(np.linalg.norm(rig.focus - mean))
    small = 0.1 * distance  # a lone camera, or a line of them: circles of a tenth of the depth
    rx, ry = (r if r > 1e-3 * distance else small for r in radii[:2])
    rz = min(radii[2], 0.5 * distance)  # never through the focus
    theta = 2.0 * np.pi * SPIRAL_TURNS * np.arange(n) / n
    positions = (mean[None] + rx * np.cos(theta)[:, None] * right[None]
                 + ry * np.sin(theta)[:, None] * up[None]
                 + rz * np.sin(theta * SPIRAL_DEPTH_RATE)[:, None] * ahead[None])
    return look_at(positions, rig.focus, rig.up)


def chain_order(rig: Rig) -> list[int]:
    """The training cameras in a chain: from the first, each time the nearest camera not yet
    taken (distance between centres, plus the spread times the angle between the viewing
    directions over pi, so that cameras at one place looking away count as far)."""
    left = list(range(1, len(rig.centres)))
    order = [0]
    while left:
        here = order[-1]
        gap = np.linalg.norm(rig.centres[left] - rig.centres[here], axis=1)
        cos = np.clip(rig.forwards[left] @ rig.forwards[here], -1.0, 1.0)
        nearest = left[int(np.argmin(gap + rig.spread * np.arccos(cos) / np.pi))]
        order.append(nearest)
        left.remove(nearest)
    return order


def _quaternions(R: np.ndarray) -> np.ndarray:
    """Unit quaternions [C, 4] (w, x, y, z) of rotation matrices [C, 3, 3], each on the side
    of the previous one (q and -q are one rotation), so that slerp takes the short way."""
    out = np.zeros((len(R), 4))
    for i, m in enumerate(R):
        # the largest of the four squares, for a well-conditioned division
        sq = np.array([1 + m[0, 0] + m[1, 1] + m[2, 2], 1 + m[0, 0] - m[1, 1] - m[2, 2],
                       1 - m[0, 0] + m[1, 1] - m[2, 2], 1 - m[0, 0] - m[1, 1] + m[2, 2]])
        k = int(np.argmax(sq))
        s = 2.0 * math.sqrt(max(sq[k], EPS))
        if k == 0:
            q = [s / 4, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
        elif k == 1:
            q = [(m[2, 1] - m[1, 2]) / s, s / 4, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
        elif k == 2:
            q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, s / 4, (m[1, 2] + m[2, 1]) / s]
        else:
            q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, s / 4]
        out[i] = _unit(np.array(q))
        if i and out[i] @ out[i - 1] < 0:
            out[i] = -out[i]
    return out


def _rotation(q: np.ndarray) -> np.ndarray:
    """The rotation matrix [3, 3] of a unit quaternion [4] (w, x, y, z)."""
    w, x, y, z = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def slerp(q0: np.ndarray, q1: np.ndarray, t: float) -> np.ndarray:
    """The unit quaternion [4] a fraction ``t`` of the way from ``q0`` to ``q1`` (both [4],
    unit, on one side: ``q0 . q1 >= 0``) at constant angular speed."""
    cos = float(np.clip(q0 @ q1, -1.0, 1.0))
    angle = math.acos(cos)
    if angle < 1e-6:
        return _unit((1 - t) * q0 + t * q1)
    return (math.sin((1 - t) * angle) * q0 + math.sin(t * angle) * q1) / math.sin(angle)


def _catmull_rom(p: np.ndarray, j: int, t: float) -> np.ndarray:
    """The point [3] a fraction ``t`` along segment ``j`` of the uniform Catmull-Rom spline
    through the points ``p`` [K, 3] (ends extended linearly)."""
    k = len(p)
    p0 = p[j - 1] if j > 0 else 2 * p[0] - p[1]
    p3 = p[j + 2] if j + 2 < k else 2 * p[k - 1] - p[k - 2]
    p1, p2 = p[j], p[j + 1]
    return 0.5 * (2 * p1 + (p2 - p0) * t + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t * t
                  + (3 * p1 - p0 + p3 - 3 * p2) * t ** 3)


def interpolated_path(rig: Rig, n: int) -> np.ndarray:
    """``n`` cameras [n, 4, 4] through the training cameras in :func:`chain_order`, the first
    frame at the first camera and the last at the last; frame ``i`` sits at the parameter
    ``i (K - 1) / (n - 1)`` of the K cameras, and a frame at an integer parameter is that
    camera's matrix unchanged."""
    order = chain_order(rig)
    keys = rig.viewmats[order]
    k = len(keys)
    if k == 1 or n == 1:
        return np.repeat(keys[:1], n, axis=0)
    c2w = rig.c2w[order]
    positions, quats = c2w[:, :3, 3], _quaternions(c2w[:, :3, :3])
    out = np.zeros((n, 4, 4))
    for i in range(n):
        j, rem = divmod(i * (k - 1), n - 1)
        if rem == 0:
            out[i] = keys[j]
            continue
        t = rem / (n - 1)
        pose = np.eye(4)
        pose[:3, :3] = _rotation(slerp(quats[j], quats[j + 1], t))
        pose[:3, 3] = _catmull_rom(positions, j, t)
        out[i] = world_to_camera(pose[None])[0]
    return out


def check_path_request(path: str, n: int) -> None:
    """Checks a path's name and frame count before any work.

    Raises:
        ValueError: an unknown path, or ``n`` outside 1..:data:`MAX_FRAMES`.
    """
    if path not in PATHS:
        raise ValueError(f"--path must be one of {list(PATHS)}, got {path!r}")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FRAMES:
        raise ValueError(f"--frames must be an integer in 1..{MAX_FRAMES}, got {n!r}")


def camera_path(path: str, viewmats: np.ndarray, n: int,
                points: np.ndarray | None = None) -> np.ndarray:
    """The ``n`` world-to-camera matrices [n, 4, 4] (float64) of path ``path`` (:data:`PATHS`)
    through a scene whose training cameras are ``viewmats`` [C, 4, 4], with the scene's
    ``points`` [P, 3] (or None) placing the focus when the optical axes do not meet.

    Raises:
        ValueError: an unknown path, a frame count outside 1..:data:`MAX_FRAMES`, malformed
            camera matrices.
    """
    check_path_request(path, n)
    rig = Rig(viewmats, points)
    build = {"ellipse": ellipse_path, "spiral": spiral_path, "interp": interpolated_path}[path]
    return build(rig, n)
