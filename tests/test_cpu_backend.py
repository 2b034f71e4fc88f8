"""What only the ``cpu`` backend (Numba) has: the counting sort of the tile intersections over
several chunks and any thread count, an import that compiles nothing, the blend loop's
vectorisation, and the polynomial exp of the shared scalar math bit for bit. Its op parity
against the reference is in tests/ops (the ``cpu`` parameters).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
import torch

import tilesplat
from helpers import tile_grid
from tilesplat.backends.cpu.rasterize_saved import GROUP_PIXELS
from tilesplat.backends.shared import compositing as scalar_math


@pytest.mark.parametrize("packed", [False, True])
def test_isect_many_chunks_any_thread_count(packed):
    """More Gaussians than one chunk of the counting sort (several chunks fill in parallel):
    still exactly the reference's order, with 1 thread and with 2."""
    W, H, ts, I, N = 96, 80, 16, 2, 5000
    g = torch.Generator().manual_seed(4)
    means2d = torch.rand(I, N, 2, generator=g) * torch.tensor([W, H]) * 1.2 - 8
    radii = (torch.rand(I, N, 2, generator=g) * 20).int()
    # many ties (listing order decides) and negative depths (their bits sort as unsigned)
    depths = (torch.rand(I, N, generator=g) * 8).round() - 2
    TW, TH = tile_grid(W, H, ts)
    args, kw = (means2d, radii, depths), {}
    if packed:
        sel = (radii > 0).all(-1)
        image_ids, gaussian_ids = sel.nonzero(as_tuple=True)
        args = (means2d[sel], radii[sel], depths[sel])
        kw = dict(packed=True, n_images=I, image_ids=image_ids, gaussian_ids=gaussian_ids)
    ref = tilesplat.isect_tiles(*args, ts, TW, TH, backend="torch", **kw)
    before = numba.get_num_threads()
    try:
        for threads in (1, before):
            numba.set_num_threads(threads)
            cpu = tilesplat.isect_tiles(*args, ts, TW, TH, backend="cpu", **kw)
            for name, a, e in zip(("tiles_per_gauss", "isect_ids", "flatten_ids"), cpu, ref,
                                  strict=True):
                assert torch.equal(a, e), f"{name} with {threads} threads"
    finally:
        numba.set_num_threads(before)


def test_import_compiles_nothing():
    code = (
        "import numba, tilesplat, tilesplat.backends.cpu as cpu, sys\n"
        "from numba.core.registry import CPUDispatcher\n"
        "mods = [m for n, m in sys.modules.items() if n.startswith('tilesplat.backends.cpu')]\n"
        "ds = [v for m in mods for v in vars(m).values() if isinstance(v, CPUDispatcher)]\n"
        "assert len(ds) > 20, len(ds)\n"
        "assert not any(d.overloads for d in ds), [d for d in ds if d.overloads]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# Packed floating-point arithmetic, of any vector width: the instruction names end in ps / pd
# (packed single / double; scalar ones end in ss / sd) on x86 (SSE xmm, AVX ymm, AVX-512 zmm),
# and the operands are vector registers with a lane arrangement on Arm (NEON v0.4s, v0.2d;
# SVE z0.s). Which width LLVM picks is the CPU's business (8 lanes on an Emerald Rapids
# with AVX-512, 16 on other AVX-512 CPUs, 4 with NEON); that the loop runs in lanes is ours.
_PACKED_X86 = re.compile(
    r"^\s*v?(?:mul|add|sub|min|max|div|fn?m(?:add|sub)(?:132|213|231))p[sd]\s.*%[xyz]mm\d",
    re.MULTILINE,
)
_PACKED_ARM = re.compile(
    r"^\s*f(?:mul|add|sub|min|max|minnm|maxnm|div|mla|mls|mad|msb|nmla|nmls)\s+"
    r"(?:v\d+\.\d+[hsd]|z\d+\.[hsd])\b",
    re.MULTILINE,
)


def packed_float_ops(asm: str) -> int:
    """The number of packed (SIMD) floating-point arithmetic instructions in ``asm``."""
    pattern = _PACKED_X86 if platform.machine() in ("x86_64", "AMD64") else _PACKED_ARM
    return len(pattern.findall(asm))


def blend_tile_asm() -> str:
    """The machine code of a fresh, uncached copy of ``rasterize_fwd.blend_tile`` with the
    kernel's own options (cached code cannot be inspected), compiled for a float32 tile."""
    from numba import njit

    from tilesplat.backends.cpu import rasterize_fwd

    skip = ("cache", "nopython")
    options = {k: v for k, v in rasterize_fwd.blend_tile.targetoptions.items() if k not in skip}
    blend_tile = njit(**options)(rasterize_fwd.blend_tile.py_func)
    n_k = 20
    f = torch.float32
    loc = torch.rand(n_k, 9, dtype=f).numpy()  # rows of cull.gather_tile
    P = 64
    blend_tile(
        loc,
        np.zeros(n_k, np.int32),  # every row reaches the slice's 4 rows of 16 pixels
        np.full(n_k, 3, np.int32),
        0,
        16,
        0,
        n_k,
        torch.rand(P, dtype=f).numpy(),
        torch.rand(P, dtype=f).numpy(),
        torch.ones(P, dtype=torch.int32).numpy(),
        torch.ones(P, dtype=f).numpy(),
        torch.full((P,), -1, dtype=torch.int32).numpy(),
        torch.empty(P, dtype=f).numpy(),
        np.zeros((3, P), np.float64),
        np.zeros((n_k, 1), np.uint8),  # the hit flags of rasterize_saved
        (1 << (np.arange(P) // GROUP_PIXELS)).astype(np.int32),  # each pixel's flag bit
    )
    return blend_tile.inspect_asm(blend_tile.signatures[0])


# the per-pair loop's body is ~30 float operations; vectorised, each is packed at least once
VECTORISED = 20


def test_blend_loop_vectorises():
    packed = packed_float_ops(blend_tile_asm())
    assert packed > VECTORISED, f"the per-pair loop did not vectorise ({packed} packed ops)"


def test_vectorisation_check_fails_on_a_scalar_loop():
    """The same loop compiled with LLVM's loop vectoriser off (NUMBA_LOOP_VECTORIZE=0, read
    when Numba starts: another process) is scalar, and the count above says so."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_cpu_backend import blend_tile_asm, packed_float_ops\n"
        "print(packed_float_ops(blend_tile_asm()))\n"
    )
    env = {**os.environ, "NUMBA_LOOP_VECTORIZE": "0", "NUMBA_SLP_VECTORIZE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    scalar = int(out.stdout.split()[-1])
    assert scalar <= VECTORISED, f"a scalar loop counted as vectorised ({scalar} packed ops)"


def _exp_neg_by_bit_tests(s):
    """exp_neg as it was before pow2_neg: 2**-n by one exact multiplication per bit of n."""
    sm = scalar_math
    s = min(max(s, sm.like(s, 0.0)), sm.like(s, sm._EXP_MAX))
    n = sm.as_int32(s * sm.like(s, 1.4426950408889634) + sm.like(s, 0.5))
    nf = sm.like(s, n)
    r = nf * sm.like(s, sm._LN2_HI) - s + nf * sm.like(s, sm._LN2_LO)
    p = sm.like(s, 1.0 / 5040.0)
    for c in (1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = sm.fma(p, r, sm.like(s, c))
    for bit, scale in ((1, 0.5), (2, 0.25), (4, 0.0625), (8, 0.00390625),
                       (16, 1.52587890625e-05), (32, 2.3283064365386963e-10)):
        p = p * (sm.like(s, scale) if n & bit else sm.like(s, 1.0))
    return p


def _nearest(exact, dtype):
    """The value of ``dtype`` nearest the Fraction ``exact`` (ties to even)."""
    from fractions import Fraction

    guess = dtype(float(exact))  # within one unit of the last place of the answer
    near = [np.nextafter(guess, dtype(-np.inf)), guess, np.nextafter(guess, dtype(np.inf))]
    dist = [abs(Fraction(float(v)) - exact) for v in near]
    best = min(dist)
    ties = [v for v, d in zip(near, dist, strict=True) if d == best]
    return ties[0] if len(ties) == 1 else next(v for v in ties if int(v.view(
        np.uint32 if dtype is np.float32 else np.uint64)) % 2 == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fma_rounds_once(dtype):
    """``fma`` compiled is a * b + c rounded once (not the product first), in the operands'
    type; its plain-Python meaning is the exact value as a Python float."""
    from fractions import Fraction

    from numba import njit

    from tilesplat.backends.scalar_types import fma as plain_fma

    fused = njit(lambda a, b, c: scalar_math.fma(a, b, c))
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(3000).astype(dtype) for _ in range(3))
    c[:1000] = -(a[:1000] * b[:1000])  # the product's rounding error is all that is left
    split = 0
    for x, y, z in zip(a, b, c, strict=True):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        got = fused(x, y, z)
        assert dtype(got) == _nearest(exact, dtype), (x, y, z)
        assert plain_fma(x, y, z) == _nearest(exact, np.float64)
        split += dtype(got) != dtype(x) * dtype(y) + dtype(z)
    assert split > 500  # the cases above do tell a fused result from a split one
    assert plain_fma(2.0, 3.0, -6.0) == 0.0 and np.isnan(plain_fma(np.inf, 0.0, 1.0))
    assert plain_fma(1e308, 10.0, 0.0) == np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pow2_neg_writes_the_exponent_and_exp_neg_is_unchanged(dtype):
    from numba import njit

    from tilesplat.backends.cpu._common import sm

    pow2 = njit(lambda x, n: scalar_math.pow2_neg(x, n))
    for n in range(127):
        got = pow2(dtype(1.0), np.int32(n))
        assert type(got) is float and got == np.ldexp(1.0, -n), n
    assert scalar_math.pow2_neg(1.0, 5) == 2.0**-5  # plain Python

    @njit
    def both(s):
        a = np.empty_like(s)
        b = np.empty_like(s)
        for i in range(s.size):
            a[i] = sm.exp_neg(s[i])
            b[i] = _old(s[i])
        return a, b

    _old = njit(inline="always")(_exp_neg_by_bit_tests)
    rng = np.random.default_rng(0)
    s = np.concatenate([np.linspace(0.0, 50.0, 20001), rng.exponential(3.0, 20000),
                        [-1.0, 0.0, 43.66, 1e30]]).astype(dtype)
    a, b = both(s)
    assert a.dtype == dtype
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))  # bit for bit
