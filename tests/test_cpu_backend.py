"""The ``cpu`` backend (Numba) against the ``torch`` reference, op by op and end to end.

Outputs are NaN-poisoned before every kernel (``TILESPLAT_POISON=1``, set in conftest), so a
kernel that leaves memory unwritten fails. Tolerances (DESIGN.md): float32 forward 1e-5,
gradients 1e-4, abs-or-rel (both must fail to fail); float64 1e-7 / 1e-6 (the native exp is
a polynomial with ~1e-8 relative error, see ``backends/scalar_math.exp_neg``).
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid
from tilesplat.backends.shared import compositing as scalar_math

TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-7, 1e-6)}  # (forward, gradients)
SCHEMES = ("per_pixel", "per_splat")


def _upstream(outputs, seed=7):
    """Fixed random upstream gradients for a list of outputs."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outputs]


def _grads(fn, inputs, backend, **kw):
    """Runs fn(*leaves, backend=...) and returns (outputs, grads of the float leaves)."""
    leaves = [
        x.detach().clone().requires_grad_(x.is_floating_point()) if torch.is_tensor(x) else x
        for x in inputs
    ]
    outs = fn(*leaves, backend=backend, **kw)
    outs = [
        o
        for o in (outs if isinstance(outs, tuple | list) else (outs,))
        if torch.is_tensor(o) and o.is_floating_point()
    ]
    loss = sum((o * u).sum() for o, u in zip(outs, _upstream(outs), strict=True))
    wanted = [x for x in leaves if torch.is_tensor(x) and x.requires_grad]
    grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    return outs, [
        torch.zeros_like(w) if g is None else g for w, g in zip(wanted, grads, strict=True)
    ]


def _compare(name, cpu, ref, dtype):
    fwd, grad = TOL[dtype]
    (out_c, grad_c), (out_r, grad_r) = cpu, ref
    for i, (a, e) in enumerate(zip(out_c, out_r, strict=True)):
        assert_close(f"{name} output {i}", a, e, fwd, fwd)
    for i, (a, e) in enumerate(zip(grad_c, grad_r, strict=True)):
        assert_close(f"{name} grad {i}", a, e, grad, grad)


# ---------------------------------------------------------------------------------------------
# rasterize_to_pixels


def _splats(G, I, W, H, ts, dtype, seed=0, opacity=0.9, D=3):
    """Random 2D Gaussians [I, G] and their sorted intersections (from the reference)."""
    g = torch.Generator().manual_seed(seed)
    means2d = (
        torch.rand(I, G, 2, generator=g, dtype=torch.float64)
        * torch.tensor([W * 1.2, H * 1.2], dtype=torch.float64)
        - 2
    )
    sx = torch.rand(I, G, generator=g, dtype=torch.float64) * 4 + 0.5
    sy = torch.rand(I, G, generator=g, dtype=torch.float64) * 4 + 0.5
    rho = (torch.rand(I, G, generator=g, dtype=torch.float64) - 0.5) * 1.6
    det = sx * sx * sy * sy * (1 - rho * rho)
    conics = torch.stack([sy * sy / det, -rho * sx * sy / det, sx * sx / det], -1)
    radii = torch.stack([torch.ceil(3 * sx), torch.ceil(3 * sy)], -1).int()
    depths = torch.rand(I, G, generator=g, dtype=torch.float64) * 5 + 1
    colors = torch.rand(I, G, D, generator=g, dtype=torch.float64)
    opac = torch.rand(I, G, generator=g, dtype=torch.float64) * opacity
    TW, TH = tile_grid(W, H, ts)
    cast = [t.to(dtype) for t in (means2d, conics, colors, opac, depths)]
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(
        cast[0], radii, cast[4], ts, TW, TH, backend="torch"
    )
    offsets = tilesplat.isect_offset_encode(isect_ids, I, TW, TH, backend="torch")
    return cast[:4], offsets, flatten_ids


def _raster(
    means2d,
    conics,
    colors,
    opacities,
    backgrounds,
    *,
    backend,
    W,
    H,
    ts,
    offsets,
    flatten_ids,
    masks=None,
    scheme="per_pixel",
    absgrad=False,
):
    if absgrad:
        means2d.retain_grad()
    out = tilesplat.rasterize_to_pixels(
        means2d,
        conics,
        colors,
        opacities,
        W,
        H,
        ts,
        offsets,
        flatten_ids,
        backgrounds=backgrounds,
        masks=masks,
        absgrad=absgrad,
        backward_scheme=scheme,
        return_last_ids=True,
        backend=backend,
    )
    return out[0], out[1], out[2].to(out[0].dtype)  # last_ids compared exactly as floats


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_rasterize_matches_reference(dtype, scheme):
    W, H, ts, I = 37, 23, 16, 2  # odd sizes: partial tiles on both edges
    opacity = 0.95  # many pixels reach the T = 1e-4 stop
    tensors, offsets, flat = _splats(300, I, W, H, ts, dtype, opacity=opacity)
    bg = torch.rand(I, 3, dtype=dtype)
    masks = torch.ones(I, *offsets.shape[1:], dtype=torch.bool)
    masks[0, 0, 1] = False
    masks[1, 1, 2] = False
    kw = dict(W=W, H=H, ts=ts, offsets=offsets, flatten_ids=flat, masks=masks, scheme=scheme)
    ref = _grads(_raster, [*tensors, bg], "torch", **kw)
    cpu = _grads(_raster, [*tensors, bg], "cpu", **kw)
    _compare(f"rasterize {scheme}", cpu, ref, dtype)


@pytest.mark.parametrize("D", [1, 4])  # not RGB: the kernels' general channel loops
@pytest.mark.parametrize("scheme", SCHEMES)
def test_rasterize_channels(scheme, D):
    W, H, ts, I = 29, 21, 16, 1
    tensors, offsets, flat = _splats(150, I, W, H, ts, torch.float32, seed=4, D=D)
    bg = torch.rand(I, D)
    kw = dict(W=W, H=H, ts=ts, offsets=offsets, flatten_ids=flat, scheme=scheme)
    ref = _grads(_raster, [*tensors, bg], "torch", **kw)
    cpu = _grads(_raster, [*tensors, bg], "cpu", **kw)
    _compare(f"rasterize D={D} {scheme}", cpu, ref, torch.float32)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rasterize_absgrad_and_empty_tiles(scheme):
    W, H, ts, I = 150, 90, 16, 1
    tensors, offsets, flat = _splats(6, I, W, H, ts, torch.float32, seed=3)  # most tiles empty
    assert int((offsets.reshape(-1).diff() == 0).sum()) > 5
    got = {}
    for backend in ("torch", "cpu"):
        means2d = tensors[0].clone().requires_grad_(True)
        rc, ra, _ = _raster(
            means2d,
            *tensors[1:],
            None,
            backend=backend,
            W=W,
            H=H,
            ts=ts,
            offsets=offsets,
            flatten_ids=flat,
            scheme=scheme,
            absgrad=True,
        )
        (rc.sum() + 2 * ra.sum()).backward()
        got[backend] = (rc, ra, means2d.grad, means2d.absgrad)
    for name, a, e in zip(
        ("colors", "alphas", "v_means2d", "absgrad"), got["cpu"], got["torch"], strict=True
    ):
        assert_close(name, a, e, 1e-4, 1e-4)


@pytest.mark.parametrize("case", ["one_pixel", "no_gaussians", "no_intersections"])
def test_rasterize_degenerate(case):
    W, H, ts, I = (1, 1, 16, 1) if case == "one_pixel" else (20, 9, 8, 2)
    G = 0 if case == "no_gaussians" else 5
    tensors, offsets, flat = _splats(G, I, W, H, ts, torch.float32, seed=1)
    if case == "no_intersections":
        flat = flat[:0]
        offsets = torch.zeros_like(offsets)
    bg = torch.rand(I, 3)
    kw = dict(W=W, H=H, ts=ts, offsets=offsets, flatten_ids=flat)
    for scheme in SCHEMES:
        ref = _grads(_raster, [*tensors, bg], "torch", scheme=scheme, **kw)
        cpu = _grads(_raster, [*tensors, bg], "cpu", scheme=scheme, **kw)
        _compare(f"{case} {scheme}", cpu, ref, torch.float32)


# ---------------------------------------------------------------------------------------------
# tile intersection


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("sort", [True, False])
def test_isect_matches_reference_exactly(packed, sort):
    W, H, ts, I = 37, 23, 8, 3
    g = torch.Generator().manual_seed(2)
    means2d = torch.rand(I, 200, 2, generator=g) * torch.tensor([W, H]) * 1.3 - 3
    radii = (torch.rand(I, 200, 2, generator=g) * 9).int()  # some 0: culled
    depths = torch.rand(I, 200, generator=g) * 3
    depths[:, :40] = 1.5  # ties keep the listing order
    TW, TH = tile_grid(W, H, ts)
    args = (means2d, radii, depths)
    kw: dict = dict(sort=sort)
    if packed:
        sel = (radii > 0).all(-1)
        image_ids, gaussian_ids = sel.nonzero(as_tuple=True)
        args = (means2d[sel], radii[sel], depths[sel])
        kw.update(packed=True, n_images=I, image_ids=image_ids, gaussian_ids=gaussian_ids)
    ref = tilesplat.isect_tiles(*args, ts, TW, TH, backend="torch", **kw)
    cpu = tilesplat.isect_tiles(*args, ts, TW, TH, backend="cpu", **kw)
    for name, a, e in zip(("tiles_per_gauss", "isect_ids", "flatten_ids"), cpu, ref, strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e), name
    if sort:
        off_ref = tilesplat.isect_offset_encode(ref[1], I, TW, TH, backend="torch")
        off_cpu = tilesplat.isect_offset_encode(ref[1], I, TW, TH, backend="cpu")
        assert torch.equal(off_cpu, off_ref)


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


# ---------------------------------------------------------------------------------------------
# covariance, spherical harmonics, projection


@pytest.mark.parametrize("triu", [False, True])
def test_quat_scale_to_covar_preci(triu):
    g = torch.Generator().manual_seed(4)
    quats = torch.randn(50, 4, generator=g)
    scales = torch.rand(50, 3, generator=g) + 0.2
    fn = tilesplat.quat_scale_to_covar_preci
    ref = _grads(fn, [quats, scales], "torch", triu=triu)
    cpu = _grads(fn, [quats, scales], "cpu", triu=triu)
    _compare("covar_preci", cpu, ref, torch.float32)


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_spherical_harmonics(degree):
    g = torch.Generator().manual_seed(degree)
    dirs = torch.randn(2, 40, 3, generator=g)
    coeffs = torch.randn(2, 40, 25, 3, generator=g)  # more coefficients than the degree uses
    masks = torch.rand(2, 40, generator=g) > 0.2
    fn = tilesplat.spherical_harmonics
    ref = _grads(fn, [degree, dirs, coeffs, masks], "torch")
    cpu = _grads(fn, [degree, dirs, coeffs, masks], "cpu")
    _compare(f"sh degree {degree}", cpu, ref, torch.float32)


@pytest.mark.parametrize(
    "lead, coeff_lead",
    [
        ((3, 50), (50,)),  # every camera shares the Gaussians' coefficients (rasterization)
        ((2, 3, 50), (2, 1, 50)),  # batch dims: cameras share within each batch entry
        ((2, 3, 50), (1, 3, 1)),  # two broadcast runs: expanded (copied) rows
        ((3, 50), (3, 50)),  # nothing shared
    ],
)
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_spherical_harmonics_shared_coefficients(lead, coeff_lead, backend):
    """Broadcast coefficients give what their explicit copy gives, gradients summed over the
    rows that share them."""
    g = torch.Generator().manual_seed(11)
    dirs = torch.randn(*lead, 3, generator=g)
    coeffs = torch.randn(*coeff_lead, 16, 3, generator=g)
    masks = torch.rand(*lead, generator=g) > 0.2
    v = torch.randn(*lead, 3, generator=g)
    got = []
    for c in (coeffs, coeffs.expand(*lead, 16, 3).contiguous()):
        d = dirs.clone().requires_grad_(True)
        c = c.clone().requires_grad_(True)
        out = tilesplat.spherical_harmonics(3, d, c, masks=masks, backend=backend)
        (out * v).sum().backward()
        got.append((out, d.grad, c.grad))
    (out_s, vd_s, vc_s), (out_e, vd_e, vc_e) = got
    assert_close("colors", out_s, out_e, 1e-6, 1e-6)
    assert_close("v_dirs", vd_s, vd_e, 1e-6, 1e-6)
    aligned = (1,) * (len(lead) - len(coeff_lead)) + coeff_lead
    dims = [i for i in range(len(lead)) if aligned[i] != lead[i]]  # the broadcast ones
    summed = vc_e.sum(dim=dims, keepdim=True) if dims else vc_e
    assert_close("v_coeffs", vc_s, summed.reshape(vc_s.shape), 1e-5, 1e-5)


def test_spherical_harmonics_coefficients_must_broadcast():
    with pytest.raises(ValueError, match=r"leading dims broadcastable to dirs' \[3, 50\]"):
        tilesplat.spherical_harmonics(1, torch.ones(3, 50, 3), torch.ones(2, 50, 4, 3))


@pytest.mark.parametrize(
    "camera_model, kw",
    [
        ("pinhole", dict(calc_compensations=True, use_opacities=True)),
        ("pinhole", dict(use_covars=True, radius_clip=1.5, near_plane=3.7)),
        ("ortho", dict(calc_compensations=True)),
        ("fisheye", dict(use_opacities=True)),
    ],
)
def test_fully_fused_projection(camera_model, kw):
    kw = dict(kw)
    W, H = 37, 23
    means, quats, scales, opacities, _ = random_gaussians(120, batch=(2,), seed=5, spread=1.5)
    viewmats, Ks = cameras(3, W, H, batch=(2,))
    if camera_model == "ortho":
        Ks[..., 0, 0] = Ks[..., 1, 1] = 10.0
    covars = None
    if kw.pop("use_covars", False):
        covars, _ = tilesplat.quat_scale_to_covar_preci(
            quats, scales, True, False, True, backend="torch"
        )
        quats = scales = None
    if not kw.pop("use_opacities", False):
        opacities = None

    def fn(means, covars, quats, scales, viewmats, *, backend):
        return tilesplat.fully_fused_projection(
            means,
            covars,
            quats,
            scales,
            viewmats,
            Ks,
            W,
            H,
            camera_model=camera_model,
            opacities=opacities,
            backend=backend,
            **kw,
        )

    inputs = [means, covars, quats, scales, viewmats]
    radii_ref = fn(*inputs, backend="torch")[0]
    radii_cpu = fn(*inputs, backend="cpu")[0]
    assert torch.equal(radii_cpu, radii_ref)
    assert 0 < int((radii_ref > 0).all(-1).sum()) < radii_ref[..., 0].numel()  # some culled
    ref = _grads(fn, inputs, "torch")
    cpu = _grads(fn, inputs, "cpu")
    _compare(f"projection {camera_model}", cpu, ref, torch.float32)


# ---------------------------------------------------------------------------------------------
# end to end


def _render(means, quats, scales, opacities, colors, viewmats, Ks, W, H, *, backend, **kw):
    img, alpha, _ = tilesplat.rasterization(
        means, quats, scales, opacities, colors, viewmats, Ks, W, H, backend=backend, **kw
    )
    return img, alpha


@pytest.mark.parametrize(
    "dtype, kw",
    [
        (torch.float32, dict(packed=True, sh_degree=3)),
        (torch.float32, dict(packed=False, rasterize_mode="antialiased", backgrounds=True)),
        (torch.float32, dict(camera_model="fisheye", render_mode="RGB+D")),
        (torch.float64, dict(packed=True, render_mode="RGB+ED", sh_degree=2)),
    ],
)
def test_rasterization_end_to_end(dtype, kw):
    kw = dict(kw)
    W, H = 37, 23
    batch = (2,) if dtype == torch.float32 and kw.get("packed") else ()
    means, quats, scales, opacities, colors = random_gaussians(
        150, batch=batch, dtype=dtype, seed=6, spread=1.2
    )
    viewmats, Ks = cameras(2, W, H, batch=batch, dtype=dtype)
    if "sh_degree" in kw:
        g = torch.Generator().manual_seed(8)
        K = (kw["sh_degree"] + 1) ** 2
        colors = (torch.randn(*colors.shape[:-1], K, 3, generator=g) * 0.3).to(dtype)
    if kw.get("backgrounds"):
        kw["backgrounds"] = torch.rand(*batch, 2, 3, dtype=dtype)
    inputs = [means, quats, scales, opacities, colors, viewmats, Ks, W, H]
    for scheme in SCHEMES:
        ref = _grads(_render, inputs, "torch", backward_scheme=scheme, **kw)
        cpu = _grads(_render, inputs, "cpu", backward_scheme=scheme, **kw)
        _compare(f"rasterization {scheme}", cpu, ref, dtype)


# ---------------------------------------------------------------------------------------------
# import, vectorisation


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


def test_blend_loop_vectorises():
    from numba import njit

    from tilesplat.backends.cpu import rasterize_fwd

    # A fresh, uncached copy with the kernel's own options (cached code cannot be inspected).
    skip = ("cache", "nopython")
    options = {k: v for k, v in rasterize_fwd.blend_tile.targetoptions.items() if k not in skip}
    blend_tile = njit(**options)(rasterize_fwd.blend_tile.py_func)
    n_k = 20
    f = torch.float32
    loc = torch.rand(n_k, 9, dtype=f).numpy()  # rows of cull.gather_tile
    P = 64
    blend_tile(
        loc,
        np.zeros(n_k, np.int32),  # every row reaches slice 0
        np.zeros(n_k, np.int32),
        0,
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
    )
    asm = blend_tile.inspect_asm(blend_tile.signatures[0])
    if platform.machine() in ("x86_64", "AMD64"):  # AVX2 / AVX-512 packed single precision
        packed = re.findall(r"\bv(?:mul|add|sub|min|max)ps\s+%[yz]mm", asm)
    else:  # NEON: fmul v0.4s, ...
        packed = re.findall(r"\bf(?:mul|add|sub|min|max)\s+v\d+\.4s", asm)
    assert len(packed) > 20, f"the per-pair loop did not vectorise ({len(packed)} packed ops)"
    from llvmlite import binding

    if binding.get_host_cpu_features().get("avx512f", False):
        # full width: an int64 counter in the loop made LLVM fall back to 8 lanes
        wide = re.findall(r"\bv(?:mul|add|sub|min|max)ps\s+%zmm", asm)
        assert len(wide) > 20, f"the per-pair loop uses {len(wide)} 16-lane ops"



def _exp_neg_by_bit_tests(s):
    """exp_neg as it was before pow2_neg: 2**-n by one exact multiplication per bit of n."""
    sm = scalar_math
    s = min(max(s, sm.like(s, 0.0)), sm.like(s, sm._EXP_MAX))
    n = sm.as_int32(s * sm.like(s, 1.4426950408889634) + sm.like(s, 0.5))
    nf = sm.like(s, n)
    r = nf * sm.like(s, sm._LN2_HI) - s + nf * sm.like(s, sm._LN2_LO)
    p = sm.like(s, 1.0 / 5040.0)
    for c in (1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + sm.like(s, c)
    for bit, scale in ((1, 0.5), (2, 0.25), (4, 0.0625), (8, 0.00390625),
                       (16, 1.52587890625e-05), (32, 2.3283064365386963e-10)):
        p = p * (sm.like(s, scale) if n & bit else sm.like(s, 1.0))
    return p


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
