"""``spherical_harmonics`` kernels: one thread per row, degrees 0–4, from ``shared.sh``."""

from __future__ import annotations

import math
from functools import cache

import torch
from numba import cuda

from ..sh_rows import expand_rows, reduce_rows
from .device_math import device_math
from .runtime import cdiv, empty, float_type, launch, launcher, optional

THREADS = 256
BASIS = 25  # (SH_MAX_DEGREE + 1) ** 2


def make_sh_fwd(ft: type):
    """Kernel body: colors[m] = sum_k basis_k(dirs[m] / |dirs[m]|) coeffs[m, k]."""
    sh_basis = device_math().sh_basis
    zero = ft(0.0)
    one = ft(1.0)
    tiny = ft(1e-12)

    def sh_fwd(degree, dirs, coeffs, rest, masks, has_mask, colors):
        # dirs [M, 3], coeffs [M, K0, 3] then rest [M, K1, 3], masks [M] bool -> colors [M, 3]
        m = cuda.grid(1)
        if m >= dirs.shape[0]:
            return
        for c in range(3):
            colors[m, c] = zero
        if has_mask and not masks[m]:
            return
        x, y, z = dirs[m, 0], dirs[m, 1], dirs[m, 2]
        inv = one / max(math.sqrt(x * x + y * y + z * z), tiny)
        basis = sh_basis(degree, x * inv, y * inv, z * inv)
        n = (degree + 1) * (degree + 1)
        k0 = coeffs.shape[1]
        for k in range(min(n, k0)):
            for c in range(3):
                colors[m, c] += basis[k] * coeffs[m, k, c]
        for k in range(k0, n):  # rest is read only when K0 < n (else a placeholder)
            for c in range(3):
                colors[m, c] += basis[k] * rest[m, k - k0, c]

    return sh_fwd


def make_sh_bwd(ft: type):
    """Kernel body: v_coeffs [M, K0, 3], v_rest [M, K1, 3] and (optionally) v_dirs [M, 3]."""
    sm = device_math()
    sh_basis = sm.sh_basis
    sh_basis_vjp = sm.sh_basis_vjp
    normalize3_vjp = sm.normalize3_vjp
    zero = ft(0.0)
    one = ft(1.0)
    tiny = ft(1e-12)

    def sh_bwd(degree, dirs, coeffs, rest, masks, has_mask, v_colors, need_v_dirs, v_coeffs,
               v_rest, v_dirs):
        m = cuda.grid(1)
        if m >= dirs.shape[0]:
            return
        if has_mask and not masks[m]:
            return
        x, y, z = dirs[m, 0], dirs[m, 1], dirs[m, 2]
        inv = one / max(math.sqrt(x * x + y * y + z * z), tiny)
        ux, uy, uz = x * inv, y * inv, z * inv
        basis = sh_basis(degree, ux, uy, uz)
        n = (degree + 1) * (degree + 1)
        g = cuda.local.array(BASIS, ft)
        for k in range(BASIS):
            g[k] = zero
        k0 = coeffs.shape[1]
        for k in range(min(n, k0)):
            for c in range(3):
                v_coeffs[m, k, c] = basis[k] * v_colors[m, c]
                g[k] += coeffs[m, k, c] * v_colors[m, c]
        for k in range(k0, n):
            for c in range(3):
                v_rest[m, k - k0, c] = basis[k] * v_colors[m, c]
                g[k] += rest[m, k - k0, c] * v_colors[m, c]
        if need_v_dirs:
            gx, gy, gz = sh_basis_vjp(degree, ux, uy, uz, g)
            vx, vy, vz = normalize3_vjp(x, y, z, gx, gy, gz)
            v_dirs[m, 0] = vx
            v_dirs[m, 1] = vy
            v_dirs[m, 2] = vz

    return sh_bwd


@cache
def _fwd_kernel(ft: type):
    return cuda.jit(make_sh_fwd(ft))


@cache
def _bwd_kernel(ft: type):
    return cuda.jit(make_sh_bwd(ft))


def _rest(rest: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``rest``, or a placeholder when it holds no coefficient (K1 = 0: never read)."""
    return rest if rest.shape[1] > 0 else optional(None, like, 3)


def _bool_masks(masks: torch.Tensor | None) -> torch.Tensor | None:
    """masks [M] bool, or of radii [M, 2]: the rows where both are > 0."""
    return masks if masks is None or masks.dim() == 1 else (masks > 0).all(dim=-1)


def _colors(degree, dirs, coeffs, rest, masks, M):
    """The SH colours [M, 3] of the expanded coefficient rows (masks [M] bool or None)."""
    colors = empty((M, 3), dirs.dtype, dirs.device)
    if M > 0:
        launch(
            _fwd_kernel(float_type(dirs.dtype)), cdiv(M, THREADS), THREADS, dirs.device,
            int(degree), dirs, coeffs, _rest(rest, dirs), optional(masks, dirs, 1, torch.bool),
            masks is not None, colors,
        )  # fmt: skip
    return colors


@launcher
def forward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K0, 3]
    rest: torch.Tensor,  # [Nb, K1, 3]
    masks: torch.Tensor | None,  # [M] bool or [M, 2] radii
    rows: tuple[int, int],
    rgb: bool = False,
) -> torch.Tensor:
    """Launcher: colors [M, 3] (masked-out rows are 0; with ``rgb`` max(colour + 0.5, 0)) of
    the coefficients ``coeffs`` then ``rest`` (``ops/sh.py``), read through ``rows``
    (``backends/sh_rows.py``, expanded here)."""
    coeffs = expand_rows(coeffs, rows).contiguous()
    rest = expand_rows(rest, rows).contiguous()
    colors = _colors(degree, dirs, coeffs, rest, _bool_masks(masks), dirs.shape[0])
    return torch.clamp_min(colors + 0.5, 0.0) if rgb else colors


@launcher
def backward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K0, 3]
    rest: torch.Tensor,  # [Nb, K1, 3]
    masks: torch.Tensor | None,  # [M] bool or [M, 2] radii
    rows: tuple[int, int],
    v_colors: torch.Tensor,  # [M, 3]
    need_v_dirs: bool,
    rgb: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Launcher: (v_dirs [M, 3] | None, v_coeffs [Nb, K0, 3], v_rest [Nb, K1, 3]); with
    ``rgb`` the colours are made again and v_colors kept where colour + 0.5 >= 0 (as
    torch.clamp_min's gradient)."""
    coeffs = expand_rows(coeffs, rows).contiguous()
    rest = expand_rows(rest, rows).contiguous()
    masks = _bool_masks(masks)
    M = dirs.shape[0]
    if rgb:
        keep = _colors(degree, dirs, coeffs, rest, masks, M) + 0.5 >= 0.0
        v_colors = torch.where(keep, v_colors, 0.0)
    v_coeffs = torch.zeros_like(coeffs)
    v_rest = torch.zeros_like(rest)
    v_dirs = torch.zeros_like(dirs) if need_v_dirs else None
    if M > 0:
        launch(
            _bwd_kernel(float_type(dirs.dtype)), cdiv(M, THREADS), THREADS, dirs.device,
            int(degree), dirs, coeffs, _rest(rest, dirs), optional(masks, dirs, 1, torch.bool),
            masks is not None, v_colors.contiguous(), bool(need_v_dirs), v_coeffs,
            _rest(v_rest, dirs), optional(v_dirs, dirs, 2),
        )  # fmt: skip
    return v_dirs, reduce_rows(v_coeffs, rows), reduce_rows(v_rest, rows)
