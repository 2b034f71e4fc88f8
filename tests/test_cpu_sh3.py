"""The unrolled degree-3 SH kernels (``backends/cpu/sh3.py``) give the bits of the generic
ones (``backends/cpu/sh.py``) on the trainer's layout: colours, v_dirs and both coefficient
gradients, with radii, bool or no masks, with and without ``rgb``, float32 and float64, on
rows that stress the arithmetic (zero directions, colours clamped by ``rgb``, negative
gradients on hidden rows, whose zero products keep their sign). The launchers pick the
unrolled kernels for exactly that layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tilesplat.backends.cpu import sh, sh3
from tilesplat.backends.cpu._common import BLOCK, parallel_for, view


def _scene(n: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(n, 3, generator=g, dtype=torch.float64) * 3
    dirs[::17] = 0.0  # |d| <= 1e-12: the normalisation's floor
    dirs[5::23] *= 1e-14
    sh0 = torch.randn(n, 1, 3, generator=g, dtype=torch.float64)
    sh0[::7] -= 4.0  # colours well below -0.5: clamped by rgb
    shN = torch.randn(n, 15, 3, generator=g, dtype=torch.float64) * 0.5
    v = torch.randn(n, 3, generator=g, dtype=torch.float64)
    radii = (torch.rand(n, 2, generator=g) * 3).to(torch.int32)  # a third have a zero radius
    return [t.to(dtype) if t.is_floating_point() else t for t in (dirs, sh0, shN, v)] + [radii]


def _masks(kind: str, radii: torch.Tensor) -> np.ndarray:
    if kind == "radii":
        return view(radii)
    if kind == "bool":
        return view((radii[:, 0] > 0).reshape(-1, 1))
    return np.zeros((0, 1), np.bool_)


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_kind", ["radii", "bool", "none"])
@pytest.mark.parametrize("rgb", [False, True])
def test_unrolled_kernels_give_the_generic_bits(dtype, mask_kind, rgb):
    n = 2 * BLOCK + 37  # blocks on both threads, a partial last block
    dirs, sh0, shN, v, radii = _scene(n, dtype, seed=int(rgb) + 2 * len(mask_kind))
    masks = _masks(mask_kind, radii)
    np_dt = view(dirs).dtype
    n_blocks = (n + BLOCK - 1) // BLOCK
    d, c0, cn, vc = view(dirs), view(sh0), view(shN), view(v)

    def fresh(*shape):  # NaN: any element a kernel leaves unwritten shows
        return np.full(shape, np.nan, np_dt)

    col_g, col_u = fresh(n, 3), fresh(n, 3)
    parallel_for(sh.forward_kernel, n_blocks, 3, d, c0, cn, masks, n, 1, rgb, col_g)
    parallel_for(sh3.forward_kernel, n_blocks, d, c0, cn, masks, rgb, col_u)
    assert not np.isnan(col_u).any()
    assert _bits(col_u) == _bits(col_g), "colors"

    for want_dirs in (True, False):
        out_g = [fresh(n, 3) if want_dirs else np.zeros((0, 3), np_dt), fresh(n, 1, 3),
                 fresh(n, 15, 3)]
        out_u = [fresh(n, 3) if want_dirs else np.zeros((0, 3), np_dt), fresh(n, 1, 3),
                 fresh(n, 15, 3)]
        parallel_for(sh.backward_kernel, n_blocks, 3, d, c0, cn, masks, n, 1, rgb, vc, *out_g)
        parallel_for(sh3.backward_kernel, n_blocks, d, c0, cn, masks, rgb, vc, *out_u)
        for name, a, e in zip(("v_dirs", "v_sh0", "v_shN"), out_u, out_g, strict=True):
            assert not np.isnan(a).any(), name
            assert _bits(a) == _bits(e), f"{name} (want_dirs={want_dirs})"
    hidden = ~(radii > 0).all(1).numpy() if mask_kind == "radii" else None
    if hidden is not None and not rgb:  # the zero products of hidden rows keep v's sign
        signs = np.signbit(out_u[2][hidden, 0, 0])
        assert signs.any() and (signs == np.signbit(vc[hidden, 0])).all()


def test_launchers_pick_the_unrolled_kernels_for_the_trainers_layout(monkeypatch):
    calls = []
    real = sh.parallel_for

    def spy(kernel, *args):
        calls.append(kernel)
        return real(kernel, *args)

    monkeypatch.setattr(sh, "parallel_for", spy)
    dirs, sh0, shN, v, radii = _scene(50, torch.float32, seed=9)
    sh.forward(3, dirs, sh0, shN, radii, (50, 1), True)
    sh.backward(3, dirs, sh0, shN, radii, (50, 1), v, True, True)
    assert calls == [sh3.forward_kernel, sh3.backward_kernel]
    calls.clear()
    sh.forward(2, dirs, sh0, shN[:, :8], radii, (50, 1))  # degree 2: the generic kernels
    sh.forward(3, torch.cat([dirs, dirs]), sh0, shN, None, (50, 2))  # two cameras share rows
    sh.forward(3, dirs, torch.cat([sh0, shN[:, :3]], 1), shN[:, 3:], None, (50, 1))
    assert calls == [sh.forward_kernel] * 3


def test_unrolled_kernels_on_zero_gaussians():
    dirs, sh0, shN, v, radii = (t[:0] for t in _scene(4, torch.float32, seed=1))
    colors = sh.forward(3, dirs, sh0, shN, radii, (0, 1), True)
    v_dirs, v_sh0, v_shN = sh.backward(3, dirs, sh0, shN, radii, (0, 1), v, True, True)
    assert colors.shape == (0, 3) and v_dirs.shape == (0, 3)
    assert v_sh0.shape == (0, 1, 3) and v_shN.shape == (0, 15, 3)

