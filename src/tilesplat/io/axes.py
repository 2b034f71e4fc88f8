"""Axis conventions of splat files, and moving Gaussians from one to another.

A frame is named by three letters, the direction each of its x, y, z axes points: R/L
(right/left), U/D (up/down), F/B (front/back). tilesplat's Gaussians live in ``RDF`` (3DGS,
COLMAP, the PLY files every trainer writes); glTF is ``LUF``; three.js and SPZ's nominal frame
are ``RUB``. Niantic's 16 named systems (the SPZ coordinate-system extension) are the 8
``standard`` ones (x from R/L, y from U/D, z from F/B) and 8 ``rotated`` ones (y and z
swapped: ``RFD`` ...).

Any change between two such frames is a signed permutation ``M`` (a 3x3 matrix of 0 and +-1).
It moves each part of a Gaussian exactly:

- the mean: ``M @ mean``;
- the covariance ``R S^2 R^T`` becomes ``M R S^2 R^T M^T = R' S'^2 R'^T`` with the proper
  rotation ``R' = M R M^T`` and the scales permuted as the axes are (``|M| @ s``);
  ``R'`` is ``R`` conjugated by the rotation ``+-M`` (its quaternion ``q_M q q_M^*``);
- each SH band by the (2l+1)-square matrix that re-expresses ``sum_i c_i Y_i(M^T d)`` in the
  basis ``Y_j(d)``: fitted once per change by least squares over 512 directions in float64
  (exact to ~1e-15, since the rotated band is in the span), so no table per frame is needed.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..backends.torch.sh import sh_basis
from ._checks import all_sh, split_sh

_DIRECTION = {"R": (0, 1), "L": (0, -1), "U": (1, 1), "D": (1, -1), "F": (2, 1), "B": (2, -1)}
PLY_FRAME = "RDF"
GLTF_FRAME = "LUF"
# Niantic's CoordinateSystem enum (spz splat-types.h): value -> frame
SPZ_SYSTEMS = {
    1: "LDB", 2: "RDB", 3: "LUB", 4: "RUB", 5: "LDF", 6: "RDF", 7: "LUF", 8: "RUF",
    9: "LFD", 10: "RFD", 11: "LFU", 12: "RFU", 13: "LBD", 14: "RBD", 15: "LBU", 16: "RBU",
}  # fmt: skip


def _basis(frame: str) -> np.ndarray:
    """[3, 3]: column i is the world direction (right, up, front) of the frame's axis i."""
    if len(frame) != 3:
        raise ValueError(f"a frame is three letters (e.g. RDF), got {frame!r}")
    e = np.zeros((3, 3))
    for i, letter in enumerate(frame.upper()):
        if letter not in _DIRECTION:
            raise ValueError(f"frame {frame!r}: {letter!r} is not one of R L U D F B")
        axis, sign = _DIRECTION[letter]
        e[axis, i] = sign
    if abs(np.linalg.det(e)) != 1:
        raise ValueError(f"frame {frame!r} names one direction twice")
    return e


def frame_matrix(src: str, dst: str) -> np.ndarray:
    """The signed permutation [3, 3] taking coordinates in ``src`` to coordinates in ``dst``."""
    return np.rint(_basis(dst).T @ _basis(src))


def _quat_of_rotation(m: np.ndarray) -> np.ndarray:
    """(w, x, y, z) of a proper rotation matrix [3, 3] (Shepperd: divide by the largest of
    the four diagonal combinations, so half turns are exact too)."""
    t = np.trace(m)
    cand = [t, m[0, 0], m[1, 1], m[2, 2]]
    i = int(np.argmax(cand))
    if i == 0:
        s = 2.0 * math.sqrt(1.0 + t)
        q = [s / 4, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif i == 1:
        s = 2.0 * math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, s / 4, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif i == 2:
        s = 2.0 * math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, s / 4, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, s / 4]
    return np.array(q)


def _qmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton products of (w, x, y, z) quaternions, broadcast over leading dims."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _sh_matrix(m_key: tuple[float, ...], degree: int) -> np.ndarray:
    """[K, K] taking SH coefficients of the old frame to the new one (block diagonal)."""
    m = np.array(m_key).reshape(3, 3)
    rng = np.random.default_rng(0)
    d = rng.normal(size=(512, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    new = sh_basis(degree, torch.from_numpy(d)).numpy()  # Y_j(d'), d' in the new frame
    old = sh_basis(degree, torch.from_numpy(d @ m)).numpy()  # Y_i(M^T d')
    a, *_ = np.linalg.lstsq(new, old, rcond=None)  # new @ a = old
    a[np.abs(a) < 1e-12] = 0.0
    return a


def change_frame(arrays: dict[str, np.ndarray], src: str, dst: str) -> dict[str, np.ndarray]:
    """The Gaussians ``arrays`` (``SPLAT_KEYS``: means [N, 3], scales [N, 3] log, quats [N, 4]
    (w, x, y, z), opacities [N], sh0 [N, 1, 3], shN [N, K - 1, 3]) given in frame ``src``,
    expressed in frame ``dst``."""
    m = frame_matrix(src, dst)
    if np.array_equal(m, np.eye(3)):
        return arrays
    out = dict(arrays)
    out["means"] = (arrays["means"].astype(np.float64) @ m.T).astype(np.float32)
    m0 = m * np.linalg.det(m)  # +-M, whichever is a proper rotation
    qm = _quat_of_rotation(m0)
    qm_conj = qm * np.array([1.0, -1.0, -1.0, -1.0])
    q = arrays["quats"].astype(np.float64)
    out["quats"] = _qmul(_qmul(qm, q), qm_conj).astype(np.float32)
    out["scales"] = (arrays["scales"] @ np.abs(m).T).astype(np.float32)
    k = arrays["shN"].shape[1] + 1
    if k > 1:
        a = _sh_matrix(tuple(m.ravel().tolist()), math.isqrt(k) - 1)
        sh = all_sh(arrays).astype(np.float64)  # band 0 is its own block (the identity)
        out |= split_sh(np.einsum("jk,nkc->njc", a, sh).astype(np.float32))
    return out
