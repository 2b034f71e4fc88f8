"""The built-in scene: a procedural textured object rendered by an independent NumPy ray caster.

:func:`write_synthetic_dataset` writes a Blender-layout dataset (``transforms_train.json``,
``transforms_test.json``, RGBA PNGs with a transparent background) that the Blender loader reads.
The ground truth is ray cast analytically (spheres, boxes, a capped cylinder; checker, stripe and
noise textures; Lambert + Blinn-Phong shading; 2x2 supersampling of silhouette pixels), never
splatted, so a trained splat model is judged against something it did not produce.

The object sits on a pedestal, centred at the origin within radius ~1.1, z up (Blender's world);
the cameras sit on the upper hemisphere of radius 3.5 and look at the origin. Shading is smooth and
textures are soft-edged, so a 3DGS fit can reach ~30 dB.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.atomic import atomic_write_bytes
from ..io.images import write_png

FORMAT_VERSION = 1
MARKER = "tilesplat_synthetic.json"
CAMERA_DISTANCE = 3.5
BOUNDING_RADIUS = 1.1  # every primitive lies inside this sphere about the origin
CAMERA_ANGLE_X = 0.6911112070083618  # NeRF-synthetic's field of view (39.6 degrees)
ELEVATION_RANGE = (math.radians(8.0), math.radians(75.0))
# The CI variant: write_synthetic_dataset(out_dir, **TINY)
TINY = {"n_train": 24, "n_test": 4, "size": 64}

_LIGHTS = (  # (direction to the light, intensity)
    (np.array([0.5, 0.3, 1.0]) / np.linalg.norm([0.5, 0.3, 1.0]), 0.8),
    (np.array([-0.6, -0.5, 0.35]) / np.linalg.norm([-0.6, -0.5, 0.35]), 0.3),
)
_AMBIENT = 0.22


@dataclass
class Hit:
    """Nearest intersection along M rays; t = inf where there is none."""

    t: np.ndarray  # [M]
    normal: np.ndarray  # [M, 3] unit, world frame
    material: np.ndarray  # [M] int, index into the material table


def _sphere(o: np.ndarray, d: np.ndarray, center, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """(t [M], normal [M, 3]) of rays o [3] + t d [M, 3] (|d| = 1) against a sphere."""
    oc = o - np.asarray(center)
    b = d @ oc
    disc = b * b - (oc @ oc - radius * radius)
    with np.errstate(invalid="ignore"):
        t = -b - np.sqrt(disc)
    t = np.where((disc > 0) & (t > 1e-6), t, np.inf)
    p = o + np.where(np.isfinite(t), t, 0.0)[:, None] * d
    return t, (p - np.asarray(center)) / radius


def _box(o, d, center, half, rot) -> tuple[np.ndarray, np.ndarray]:
    """Oriented box: ``rot`` [3, 3] maps box axes to world axes; ``half`` its half extents."""
    rot = np.asarray(rot)
    lo = (o - np.asarray(center)) @ rot  # ray in the box frame
    ld = d @ rot
    half = np.asarray(half)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (-half - lo) / ld
        t2 = (half - lo) / ld
    tnear = np.minimum(t1, t2)
    tfar = np.maximum(t1, t2)
    axis = np.argmax(tnear, axis=1)
    t_in = tnear.max(axis=1)
    t_out = tfar.min(axis=1)
    t = np.where((t_out >= t_in) & (t_in > 1e-6), t_in, np.inf)
    m = len(d)
    n_local = np.zeros((m, 3))
    n_local[np.arange(m), axis] = -np.sign(ld[np.arange(m), axis])
    return t, n_local @ rot.T


def _cylinder(o, d, center_xy, radius, z0, z1) -> tuple[np.ndarray, np.ndarray]:
    """Capped cylinder with a vertical axis through ``center_xy``, from z0 to z1."""
    ox, oy = o[0] - center_xy[0], o[1] - center_xy[1]
    a = d[:, 0] ** 2 + d[:, 1] ** 2
    b = ox * d[:, 0] + oy * d[:, 1]
    c = ox * ox + oy * oy - radius * radius
    disc = b * b - a * c
    with np.errstate(invalid="ignore", divide="ignore"):
        t_side = (-b - np.sqrt(disc)) / a
    z_side = o[2] + t_side * d[:, 2]
    t_side = np.where(
        (disc > 0) & (t_side > 1e-6) & (z_side >= z0) & (z_side <= z1), t_side, np.inf
    )
    t_best, n = t_side, np.zeros((len(d), 3))
    for zc, nz in ((z1, 1.0), (z0, -1.0)):
        with np.errstate(divide="ignore", invalid="ignore"):
            tc = (zc - o[2]) / d[:, 2]
            px = ox + tc * d[:, 0]
            py = oy + tc * d[:, 1]
            ok = (tc > 1e-6) & (px * px + py * py <= radius * radius) & (tc < t_best)
        t_best = np.where(ok, tc, t_best)
        n[ok] = (0.0, 0.0, nz)
    side = np.isfinite(t_side) & (t_best == t_side)
    p = o + np.where(side, t_side, 0.0)[:, None] * d
    n[side, 0] = (p[side, 0] - center_xy[0]) / radius
    n[side, 1] = (p[side, 1] - center_xy[1]) / radius
    n[side, 2] = 0.0
    return t_best, n


def _rot_z(deg: float) -> np.ndarray:
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


# (kind, geometry args, material id)
_PRIMITIVES = (
    ("box", ((0.0, 0.0, -0.6), (0.55, 0.55, 0.12), _rot_z(0.0)), 0),  # pedestal
    ("sphere", ((-0.22, 0.18, -0.06), 0.42), 1),
    ("cylinder", ((0.3, -0.28), 0.2, -0.48, 0.3), 2),
    ("sphere", ((0.3, -0.28, 0.44), 0.14), 3),
    ("box", ((0.3, 0.3, -0.33), (0.15, 0.15, 0.15), _rot_z(30.0)), 4),
)
_GEOMETRY = {"sphere": _sphere, "box": _box, "cylinder": _cylinder}
# material -> (specular strength, shininess)
_SPECULAR = {0: (0.1, 16.0), 1: (0.35, 40.0), 2: (0.15, 20.0), 3: (0.5, 60.0), 4: (0.2, 24.0)}


def intersect(o: np.ndarray, d: np.ndarray) -> Hit:
    """Nearest hit of rays o [3] + t d [M, 3] with the whole object."""
    t = np.full(len(d), np.inf)
    normal = np.zeros((len(d), 3))
    material = np.full(len(d), -1)
    for kind, args, mat in _PRIMITIVES:
        tp, n_p = _GEOMETRY[kind](o, d, *args)
        closer = tp < t
        t = np.where(closer, tp, t)
        normal[closer] = n_p[closer]
        material[closer] = mat
    return Hit(t, normal, material)


def _mix(a, b, w: np.ndarray) -> np.ndarray:
    return np.asarray(a) * (1.0 - w[:, None]) + np.asarray(b) * w[:, None]


def _noise(p: np.ndarray) -> np.ndarray:
    """Smooth deterministic 3D noise in [0, 1]: a fixed sum of oriented sinusoids."""
    rng = np.random.default_rng(1234)
    dirs = rng.normal(size=(6, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    freqs = np.array([3.0, 3.5, 5.0, 6.0, 8.0, 9.0])
    phases = rng.uniform(0, 2 * np.pi, 6)
    amps = 1.0 / freqs
    v = (np.sin(p @ (dirs * freqs[:, None]).T + phases) * amps).sum(1)
    return 0.5 + 0.5 * v / amps.sum()


def albedo(p: np.ndarray, material: np.ndarray) -> np.ndarray:
    """Procedural texture colours [M, 3] at surface points p [M, 3]."""
    out = np.zeros_like(p)
    m = material == 0  # pedestal: soft 3D checker
    if m.any():
        q = p[m]
        s = 0.18
        f = (
            np.sin(np.pi * q[:, 0] / s)
            * np.sin(np.pi * q[:, 1] / s)
            * np.sin(np.pi * (q[:, 2] + 0.09) / s)
        )
        w = 0.5 + 0.5 * np.tanh(4.0 * f)
        out[m] = _mix((0.85, 0.82, 0.74), (0.25, 0.3, 0.45), w)
    m = material == 1  # big sphere: tilted stripes
    if m.any():
        axis = np.array([0.3, -0.2, 0.93])
        axis /= np.linalg.norm(axis)
        h = (p[m] - np.array([-0.22, 0.18, -0.06])) @ axis / 0.42
        w = 0.5 + 0.5 * np.tanh(2.5 * np.sin(2.0 * np.pi * 2.5 * h))
        out[m] = _mix((0.95, 0.65, 0.15), (0.2, 0.45, 0.75), w)
    m = material == 2  # cylinder: noise
    if m.any():
        out[m] = _mix((0.2, 0.55, 0.3), (0.85, 0.9, 0.6), _noise(p[m]))
    m = material == 3  # small glossy sphere
    out[m] = (0.8, 0.12, 0.1)
    m = material == 4  # rotated box: noise-tinted
    if m.any():
        out[m] = _mix((0.55, 0.25, 0.6), (0.9, 0.75, 0.85), _noise(2.0 * p[m] + 1.0))
    return out


def shade(o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rgb [M, 3] in [0, 1], material [M], -1 where nothing is hit) of rays o [3] + t d [M, 3]."""
    # Most rays miss the object: cast only those that meet its bounding sphere.
    near = np.isfinite(_sphere(o, d, (0.0, 0.0, 0.0), BOUNDING_RADIUS)[0])
    rgb = np.zeros((len(d), 3))
    material = np.full(len(d), -1)
    if near.any():
        rgb[near], material[near] = _shade_all(o, d[near])
    return rgb, material


def _shade_all(o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hit = intersect(o, d)
    mask = np.isfinite(hit.t)
    rgb = np.zeros((len(d), 3))
    if not mask.any():
        return rgb, hit.material
    dd, n, mat = d[mask], hit.normal[mask], hit.material[mask]
    p = o + hit.t[mask][:, None] * dd
    base = albedo(p, mat)
    ks = np.array([_SPECULAR[int(k)][0] for k in range(len(_SPECULAR))])[mat]
    shininess = np.array([_SPECULAR[int(k)][1] for k in range(len(_SPECULAR))])[mat]
    diffuse = np.full(len(p), _AMBIENT)
    spec = np.zeros(len(p))
    for ldir, intensity in _LIGHTS:
        ndl = n @ ldir
        diffuse += intensity * np.clip(ndl, 0.0, None)
        half = ldir - dd
        half /= np.linalg.norm(half, axis=1, keepdims=True)
        spec += intensity * (ndl > 0) * np.clip((n * half).sum(1), 0.0, None) ** shininess
    rgb[mask] = np.clip(base * diffuse[:, None] + (ks * spec)[:, None], 0.0, 1.0)
    return rgb, hit.material


def look_at_c2w(eye: np.ndarray) -> np.ndarray:
    """[4, 4] camera-to-world in OpenGL / Blender axes of a camera at ``eye`` looking at 0."""
    fwd = -eye / np.linalg.norm(eye)
    right = np.cross(fwd, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, fwd)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, up, -fwd, eye
    return c2w


def _pixel_rays(c2w: np.ndarray, u: np.ndarray, v: np.ndarray, f: float, size: int) -> np.ndarray:
    """[M, 3] unit world directions through image points (u, v) (pixel x covers [x, x+1))."""
    # OpenGL camera: x right, y up, looking down -z
    dirs = np.stack([(u - 0.5 * size) / f, -(v - 0.5 * size) / f, -np.ones_like(u)], axis=1)
    dirs = dirs @ c2w[:3, :3].T
    return dirs / np.linalg.norm(dirs, axis=1, keepdims=True)


def render_view(c2w: np.ndarray, size: int, camera_angle_x: float = CAMERA_ANGLE_X) -> np.ndarray:
    """Ray cast one square RGBA view [size, size, 4] float in [0, 1] (straight alpha).

    One ray per pixel centre; pixels where the hit primitive (or background) changes from a
    neighbour are recast with 2x2 rays and averaged, which antialiases every silhouette.
    """
    f = 0.5 * size / math.tan(0.5 * camera_angle_x)
    o = c2w[:3, 3]
    ys, xs = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    rgb, mat = shade(o, _pixel_rays(c2w, xs.ravel() + 0.5, ys.ravel() + 0.5, f, size))
    rgb, mat = rgb.reshape(size, size, 3), mat.reshape(size, size)
    premult = rgb * (mat >= 0)[:, :, None]
    alpha = (mat >= 0).astype(np.float64)
    pad = np.pad(mat, 1, mode="edge")
    edge = np.zeros((size, size), dtype=bool)
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2), (0, 0), (0, 2), (2, 0), (2, 2)):
        edge |= pad[dy : dy + size, dx : dx + size] != mat
    ey, ex = np.nonzero(edge)
    if len(ey):
        offs = np.array([[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]])
        u = (ex[:, None] + offs[None, :, 0]).ravel()
        v = (ey[:, None] + offs[None, :, 1]).ravel()
        rgb_s, mat_s = shade(o, _pixel_rays(c2w, u, v, f, size))
        hit_s = (mat_s >= 0).reshape(-1, 4)
        premult[ey, ex] = (rgb_s.reshape(-1, 4, 3) * hit_s[:, :, None]).mean(1)
        alpha[ey, ex] = hit_s.mean(1)
    safe = np.maximum(alpha, 1e-12)[:, :, None]
    straight = np.where(alpha[:, :, None] > 0, premult / safe, 0.0)
    return np.concatenate([np.clip(straight, 0.0, 1.0), alpha[:, :, None]], axis=2)


def camera_positions(n: int, seed: int, test: bool) -> np.ndarray:
    """[n, 3] deterministic positions on the upper hemisphere of radius CAMERA_DISTANCE.

    Train views follow a Fibonacci spiral (even coverage) with a seed-dependent azimuth offset;
    test views are seeded-random in the same elevation band.
    """
    lo, hi = math.sin(ELEVATION_RANGE[0]), math.sin(ELEVATION_RANGE[1])
    rng = np.random.default_rng([seed, int(test)])
    if test:
        z = rng.uniform(lo, hi, n)
        az = rng.uniform(0.0, 2 * np.pi, n)
    else:
        z = lo + (hi - lo) * (np.arange(n) + 0.5) / max(n, 1)
        az = np.arange(n) * math.pi * (3.0 - math.sqrt(5.0)) + rng.uniform(0.0, 2 * np.pi)
    r = np.sqrt(1.0 - z * z)
    return CAMERA_DISTANCE * np.stack([r * np.cos(az), r * np.sin(az), z], axis=1)


def _write_json_atomic(path: Path, obj: object) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode("utf-8"), fsync=False)


def check_scene_size(n_train: int, n_test: int, size: int) -> None:
    """The view counts and image size a ray-cast scene can be written with (the built-in
    scene and its variants, ``data/exposure.py``).

    Raises:
        ValueError: naming the three and what came.
    """
    if n_train < 1 or n_test < 0 or size < 8:
        raise ValueError(
            f"need n_train >= 1, n_test >= 0, size >= 8; got {n_train}, {n_test}, {size}"
        )


def _is_complete(out: Path, params: dict) -> bool:
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker != {**params, "complete": True}:
        return False
    for split, n in (("train", params["n_train"]), ("test", params["n_test"])):
        if not (out / f"transforms_{split}.json").is_file():
            return False
        if not all((out / split / f"r_{i}.png").is_file() for i in range(n)):
            return False
    return True


def write_synthetic_dataset(
    out_dir: str | Path, *, n_train: int = 100, n_test: int = 20, size: int = 200, seed: int = 0
) -> Path:
    """Write (or reuse) the built-in scene as a Blender-layout dataset in ``out_dir``.

    An existing complete dataset written with the same arguments is reused as is; one written
    with other arguments, or interrupted, is rewritten. A folder holding anything else is
    refused.

    Returns:
        ``out_dir`` as a Path.
    """
    check_scene_size(n_train, n_test, size)
    out = Path(out_dir)
    params = {
        "version": FORMAT_VERSION,
        "n_train": n_train,
        "n_test": n_test,
        "size": size,
        "seed": seed,
    }
    if _is_complete(out, params):
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ValueError(
            f"{out} exists and is not a tilesplat synthetic dataset; choose another folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    # The marker says "complete" only once every file is written.
    _write_json_atomic(out / MARKER, {**params, "complete": False})
    for split, n in (("train", n_train), ("test", n_test)):
        (out / split).mkdir(exist_ok=True)
        frames = []
        for i, eye in enumerate(camera_positions(n, seed, test=split == "test")):
            c2w = look_at_c2w(eye)
            write_png(out / split / f"r_{i}.png", render_view(c2w, size).astype(np.float32))
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": c2w.tolist()})
        _write_json_atomic(
            out / f"transforms_{split}.json", {"camera_angle_x": CAMERA_ANGLE_X, "frames": frames}
        )
    _write_json_atomic(out / MARKER, {**params, "complete": True})
    return out
