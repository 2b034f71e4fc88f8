"""Shared by the structure-from-motion tests: the room scene and its reconstruction, made once
per test session even across xdist workers, pose comparison after a similarity alignment, and a
COLMAP text writer for a dataset with the true poses."""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilesplat.data.colmap_format import qvec_to_rotmat, read_model
from tilesplat.data.room import TINY, write_room_scene
from tilesplat.data.sfm import prepare


@dataclass
class Room:
    """The room scene (``scene/images``, ``scene/poses.json``) and ``prepare``'s dataset."""

    scene: Path
    dataset: Path
    truth: dict
    log: list[str]


def shared_room(base: Path) -> Room:
    """The TINY room and its reconstruction under ``base`` (the folder all workers share),
    made by the first worker that asks; the others wait on the lock and reuse it."""
    base.mkdir(parents=True, exist_ok=True)
    scene, dataset, log_file = base / "room", base / "room_sfm", base / "room_sfm.log"
    with open(base / "room.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dataset / "prepare.json").is_file():
            write_room_scene(scene, **TINY)
            lines: list[str] = []
            prepare(scene / "images", dataset, max_size=0, threads=1, log=lines.append)
            log_file.write_text("\n".join(lines))
        fcntl.flock(lock, fcntl.LOCK_UN)
    truth = json.loads((scene / "poses.json").read_text())
    return Room(scene, dataset, truth, log_file.read_text().splitlines())


def umeyama(src: np.ndarray, dst: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R [3, 3], t [3]) minimising |dst - (s R src + t)|² over points src, dst [N, 3]."""
    mu_s, mu_d = src.mean(0), dst.mean(0)
    x, y = src - mu_s, dst - mu_d
    u, sig, vt = np.linalg.svd(y.T @ x / len(x))
    d = np.eye(3)
    d[2, 2] = np.sign(np.linalg.det(u @ vt))
    rot = u @ d @ vt
    s = float((sig * np.diag(d)).sum() / (x**2).sum(1).mean())
    return s, rot, mu_d - s * rot @ mu_s


def recovered_poses(sparse: Path) -> dict[str, np.ndarray]:
    """Image name -> [4, 4] world-to-camera of a COLMAP model, read by tilesplat's reader."""
    _, images, _, _ = read_model(sparse)
    out = {}
    for im in images.values():
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = qvec_to_rotmat(im.qvec), im.tvec
        out[im.name] = m
    return out


def centers(viewmats: np.ndarray) -> np.ndarray:
    """[C, 3] camera centres of world-to-camera viewmats [C, 4, 4]."""
    return np.einsum("cji,cj->ci", viewmats[:, :3, :3], -viewmats[:, :3, 3])


def pose_errors(truth: dict, sparse: Path) -> dict:
    """Rotation (degrees) and position errors (fraction of the scene size) of the recovered
    cameras after the similarity that best maps their centres onto the true ones."""
    rec = recovered_poses(sparse)
    names = [n for n in truth["names"] if n in rec]
    true_v = np.array([truth["viewmats"][truth["names"].index(n)] for n in names])
    rec_v = np.array([rec[n] for n in names])
    s, rot, t = umeyama(centers(rec_v), centers(true_v))
    aligned = s * centers(rec_v) @ rot.T + t
    pos = np.linalg.norm(aligned - centers(true_v), axis=1) / truth["scene_size"]
    # world-from-camera rotations: true R_t^T against the aligned rot @ R_r^T
    rel = np.einsum("cij,jk,clk->cil", true_v[:, :3, :3], rot, rec_v[:, :3, :3])
    cos = np.clip((np.trace(rel, axis1=1, axis2=2) - 1.0) / 2.0, -1.0, 1.0)
    return {
        "names": names,
        "rot_deg": np.degrees(np.arccos(cos)),
        "pos_frac": pos,
        "similarity": (s, rot, t),
    }


def rotmat_to_qvec(r: np.ndarray) -> np.ndarray:
    """[4] unit quaternion (w, x, y, z) of a rotation matrix [3, 3]."""
    k = (
        np.array(
            [
                [r[0, 0] - r[1, 1] - r[2, 2], 0, 0, 0],
                [r[1, 0] + r[0, 1], r[1, 1] - r[0, 0] - r[2, 2], 0, 0],
                [r[2, 0] + r[0, 2], r[2, 1] + r[1, 2], r[2, 2] - r[0, 0] - r[1, 1], 0],
                [
                    r[2, 1] - r[1, 2],
                    r[0, 2] - r[2, 0],
                    r[1, 0] - r[0, 1],
                    r[0, 0] + r[1, 1] + r[2, 2],
                ],
            ]
        )
        / 3.0
    )
    w, v = np.linalg.eigh(k)
    q = v[[3, 0, 1, 2], np.argmax(w)]
    return q if q[0] >= 0 else -q


def write_colmap_text(
    out: Path,
    K: np.ndarray,
    width: int,
    height: int,
    poses: dict[str, np.ndarray],
    xyz: np.ndarray,
    rgb: np.ndarray,
) -> Path:
    """``out/sparse/0/{cameras,images,points3D}.txt``: one PINHOLE camera K [3, 3], the
    world-to-camera ``poses`` [4, 4] by image name, points xyz [P, 3] with colours rgb [P, 3]."""
    sparse = out / "sparse" / "0"
    sparse.mkdir(parents=True, exist_ok=True)
    (sparse / "cameras.txt").write_text(
        f"1 PINHOLE {width} {height} "
        + " ".join(repr(float(v)) for v in K[[0, 1, 0, 1], [0, 1, 2, 2]])
        + "\n"
    )
    lines = []
    for i, (name, m) in enumerate(sorted(poses.items()), start=1):
        q, t = rotmat_to_qvec(m[:3, :3]), m[:3, 3]
        lines += [f"{i} {' '.join(repr(float(v)) for v in (*q, *t))} 1 {name}", ""]
    (sparse / "images.txt").write_text("\n".join(lines) + "\n")
    (sparse / "points3D.txt").write_text(
        "".join(
            f"{j + 1} {p[0]!r} {p[1]!r} {p[2]!r} {c[0]} {c[1]} {c[2]} 0.5\n"
            for j, (p, c) in enumerate(zip(xyz.tolist(), rgb.tolist(), strict=True))
        )
    )
    return out
