"""This machine's ceiling for the rasterizer's per-pair work, measured by a Numba micro-kernel.

The micro-kernel does only what every pixel-splat pair of the compositing contract costs:
``sigma`` from the conic, ``exp``, ``alpha``, the skip and stop tests and the blend, branch-free
over one tile's 256 pixels, with the tile's Gaussians contiguous in memory, tiles split over
all threads. It reads no index buffers and writes no gradients, so no real rasterizer can beat
it: the bench reports each arm's pair evaluations per second as a percentage of this number.

The exp and sigma are those of the native backends (``backends/shared/compositing.py``: a polynomial
exp, as DESIGN.md's "Measured facts about Numba" explains: without SVML, ``math.exp`` stays a
scalar libm call and the loop does not vectorise).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import njit, prange

from ..backends import shared
from ..backends.kernel_cache import install as _install_kernel_cache
from ..backends.vector_width import prefer_wide_vectors
from ..constants import ALPHA_CLAMP, ALPHA_SKIP, TRANSMITTANCE_STOP

_install_kernel_cache()  # before the micro-kernels below are decorated with cache=True
prefer_wide_vectors()  # the kernels' width: the ceiling is measured as they run

TILE_PIXELS = 256  # one 16 x 16 tile
INTERLEAVED_SECONDS = 0.1  # each ceiling measurement between the arms of a bench run
_F = np.float32
# The scalar math of the native backends, compiled for the CPU: the ceiling measures the same
# exp and sigma as the kernels it is compared with.
_sm = shared.build(njit(inline="always"), "tilesplat.bench._scalar")
exp_neg = _sm.exp_neg
gaussian_sigma = _sm.gaussian_sigma


@njit(cache=True)
def _tile_pairs(px, py, gx, gy, ga, gb, gc, gop, gr, gg, gbl, acc_r, acc_g, acc_b, trans, live):
    """Blends the tile's K Gaussians into its pixels, front to back, branch-free.

    px, py: [P] pixel centres; g*: [K] Gaussian data; acc_*, trans, live: [P] pixel state.
    """
    n_pix = px.shape[0]
    for j in range(gx.shape[0]):
        mx = gx[j]
        my = gy[j]
        a = ga[j]
        b = gb[j]
        c = gc[j]
        op = gop[j]
        cr = gr[j]
        cg = gg[j]
        cb = gbl[j]
        for i in range(n_pix):
            dx = mx - px[i]
            dy = my - py[i]
            sigma = gaussian_sigma(a, b, c, dx, dy)
            alpha = min(_F(ALPHA_CLAMP), op * exp_neg(sigma))
            t = trans[i]
            t_next = t * (_F(1.0) - alpha)
            ok = (sigma >= _F(0.0)) & (alpha >= _F(ALPHA_SKIP)) & (live[i] > 0)
            stop = ok & (t_next <= _F(TRANSMITTANCE_STOP))
            w = alpha * t if (ok & ~stop) else _F(0.0)
            acc_r[i] += w * cr
            acc_g[i] += w * cg
            acc_b[i] += w * cb
            trans[i] = t_next if (ok & ~stop) else t
            live[i] = _F(0.0) if stop else live[i]


@njit(parallel=True, cache=True)
def _run_tiles(px, py, gx, gy, ga, gb, gc, gop, gr, gg, gbl, out):
    """One call per tile over all tiles; out: [T, 4] per-tile sums that keep the work alive."""
    n_tiles = gx.shape[0]
    n_pix = px.shape[0]
    for t in prange(n_tiles):
        acc_r = np.zeros(n_pix, np.float32)
        acc_g = np.zeros(n_pix, np.float32)
        acc_b = np.zeros(n_pix, np.float32)
        trans = np.ones(n_pix, np.float32)
        live = np.ones(n_pix, np.float32)
        _tile_pairs(px, py, gx[t], gy[t], ga[t], gb[t], gc[t], gop[t], gr[t], gg[t], gbl[t],
                    acc_r, acc_g, acc_b, trans, live)
        out[t, 0] = acc_r.sum()
        out[t, 1] = acc_g.sum()
        out[t, 2] = acc_b.sum()
        out[t, 3] = trans.sum()


def _make_data(n_tiles: int, k: int, seed: int) -> tuple[np.ndarray, ...]:
    """Pixel centres of one tile and K Gaussians per tile that overlap it, like a real tile."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    ys, xs = np.divmod(np.arange(TILE_PIXELS), 16)
    px = (xs + 0.5).astype(f32)
    py = (ys + 0.5).astype(f32)
    shape = (n_tiles, k)
    gx = rng.uniform(-4, 20, shape).astype(f32)
    gy = rng.uniform(-4, 20, shape).astype(f32)
    # conics of Gaussians with standard deviations of 2-12 pixels, random orientation
    s1 = rng.uniform(2, 12, shape)
    s2 = rng.uniform(2, 12, shape)
    th = rng.uniform(0, np.pi, shape)
    cos, sin = np.cos(th), np.sin(th)
    ga = (cos**2 / s1**2 + sin**2 / s2**2).astype(f32)
    gb = (cos * sin * (1 / s1**2 - 1 / s2**2)).astype(f32)
    gc = (sin**2 / s1**2 + cos**2 / s2**2).astype(f32)
    # low opacities keep most pixels live over the whole list, as in a dense real tile
    gop = rng.uniform(0.01, 0.05, shape).astype(f32)
    gr, gg, gbl = (rng.uniform(0, 1, shape).astype(f32) for _ in range(3))
    return px, py, gx, gy, ga, gb, gc, gop, gr, gg, gbl


class MicroKernel:
    """The micro-kernel with its data, ready to be timed call by call.

    Args:
        n_tiles: tiles per call (default: 32 per thread); k: Gaussians per tile.
    """

    def __init__(self, n_tiles: int | None = None, k: int = 256, seed: int = 0) -> None:
        import numba

        self.threads = numba.get_num_threads()
        self.n_tiles = 32 * self.threads if n_tiles is None else n_tiles
        self.k = k
        if self.n_tiles <= 0 or k <= 0:
            raise ValueError(
                f"calibration needs n_tiles > 0 and k > 0, got {self.n_tiles} and {k}"
            )
        self.data = _make_data(self.n_tiles, k, seed)
        self.out = np.zeros((self.n_tiles, 4), np.float32)
        self.pairs = self.n_tiles * k * TILE_PIXELS
        _run_tiles(*self.data, self.out)  # compile (or load from the disk cache), warm up

    def rate(self) -> float:
        """Pair evaluations per second of one call."""
        t0 = time.perf_counter()
        _run_tiles(*self.data, self.out)
        return self.pairs / (time.perf_counter() - t0)

    def sustained_rate(self, seconds: float = INTERLEAVED_SECONDS) -> float:
        """Pair evaluations per second over back-to-back calls lasting at least ``seconds``:
        one call takes a few ms, too short to stand for a phase of a shared machine."""
        calls = 0
        t0 = time.perf_counter()
        while True:
            _run_tiles(*self.data, self.out)
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                return calls * self.pairs / elapsed

    def check(self) -> None:
        if not np.isfinite(self.out).all():
            raise RuntimeError("calibration kernel produced non-finite values")


def calibrate(seconds: float = 0.5, n_tiles: int | None = None, k: int = 256,
              seed: int = 0) -> dict[str, Any]:
    """Measures the per-pair ceiling of this machine in pair evaluations per second.

    Runs the micro-kernel (after one warm-up call that also compiles it) until ``seconds`` have
    passed, at least 3 times, and keeps the best rate: the ceiling, not a typical value.

    Returns:
        dict with ``pairs_per_s`` (best), ``median_pairs_per_s``, ``pairs_per_call``, ``calls``,
        ``threads``, ``n_tiles``, ``k`` and ``exp`` (the exp implementation used).
    """
    kernel = MicroKernel(n_tiles, k, seed)
    rates = []
    start = time.perf_counter()
    while len(rates) < 3 or time.perf_counter() - start < seconds:
        rates.append(kernel.rate())
    kernel.check()
    return {
        "pairs_per_s": float(max(rates)),
        "median_pairs_per_s": float(np.median(rates)),
        "pairs_per_call": int(kernel.pairs),
        "calls": len(rates),
        "threads": int(kernel.threads),
        "n_tiles": int(kernel.n_tiles),
        "k": int(k),
        "exp": "shared.compositing.exp_neg (polynomial)",
    }
