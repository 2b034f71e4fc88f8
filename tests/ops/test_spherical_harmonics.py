"""``spherical_harmonics``: degrees 0-4 with masks and more coefficients than the degree uses,
against the reference; coefficients shared by broadcasting (rasterization's case) against
their explicit copy; coefficients that do not broadcast are refused. ``spherical_harmonics_split``
(two tensors along K, the trainer's ``sh0`` and ``shN``) gives the bits of the op on their
concatenation, and so does ``rasterization`` given the pair."""

import pytest
import torch

import tilesplat
from helpers import assert_close
from tilesplat.ops.sh import spherical_harmonics_split

from .parity import assert_parity, dtypes, simulated


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_matches_reference(backend, batch, degree):
    n = 9 if simulated(backend) else 40
    g = torch.Generator().manual_seed(degree)
    dirs = torch.randn(*batch, n, 3, generator=g) * 2  # not normalised
    coeffs = torch.randn(*batch, n, 25, 3, generator=g)
    masks = torch.rand(*batch, n, generator=g) > 0.2

    def fn(d, c, *, backend):
        return tilesplat.spherical_harmonics(degree, d, c, masks=masks, backend=backend)

    for dtype in dtypes(backend, batch):
        assert_parity(fn, [dirs.to(dtype), coeffs.to(dtype)], backend, dtype,
                      f"degree {degree} {dtype}", outputs=["colors"], inputs=["dirs", "coeffs"])


@pytest.mark.backends("torch", "cpu", "cuda")
@pytest.mark.parametrize(
    "lead, coeff_lead",
    [
        ((3, 50), (50,)),  # every camera shares the Gaussians' coefficients (rasterization)
        ((2, 3, 50), (2, 1, 50)),  # batch dims: cameras share within each batch entry
        ((2, 3, 50), (1, 3, 1)),  # two broadcast runs: expanded (copied) rows
        ((3, 50), (3, 50)),  # nothing shared
    ],
)
def test_shared_coefficients(backend, lead, coeff_lead):
    """Broadcast coefficients give what their explicit copy gives, gradients summed over the
    rows that share them."""
    if simulated(backend):  # 5 Gaussians, not 50
        lead = (*lead[:-1], 5)
        coeff_lead = (*coeff_lead[:-1], 5 if coeff_lead[-1] == 50 else 1)
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


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


@pytest.mark.backends("torch", "cpu", "cuda")
@pytest.mark.parametrize("fused", [False, True], ids=["masks", "radii+rgb"])
@pytest.mark.parametrize("degree, k0, lead, coeff_lead", [
    (3, 1, (1, 40), (40,)),  # the trainer's sh0 / shN, one camera sharing them
    (4, 4, (2, 40), (40,)),  # the split inside degree 1's coefficients, two cameras
    (2, 9, (40,), (40,)),  # nothing past the degree in the first part
    (1, 1, (2, 3, 40), (2, 1, 40)),  # batch dims
])
def test_split_coefficients_give_the_same_bits(backend, degree, k0, lead, coeff_lead, fused):
    """The colours and the gradients of dirs and of both parts are those of the op on the
    concatenated coefficients, bit for bit (culled rows included: their zero products keep
    the sign of the colour gradient); ``radii=`` and ``rgb=True`` give those of the masks
    ``(radii > 0).all(-1)`` and of ``clamp_min(colours + 0.5, 0)`` after the op (colours
    below -0.5 included)."""
    if simulated(backend):
        lead, coeff_lead = (*lead[:-1], 6), (*coeff_lead[:-1], 6)
    g = torch.Generator().manual_seed(degree + k0)
    dirs = torch.randn(*lead, 3, generator=g)
    coeffs = torch.randn(*coeff_lead, 25, 3, generator=g)
    radii = torch.randint(0, 3, (*lead, 2), generator=g, dtype=torch.int32)
    masks = (radii > 0).all(dim=-1)
    v = torch.randn(*lead, 3, generator=g)
    d1, d2 = (dirs.clone().requires_grad_(True) for _ in range(2))
    whole = coeffs.clone().requires_grad_(True)
    head = coeffs[..., :k0, :].clone().requires_grad_(True)
    rest = coeffs[..., k0:, :].clone().requires_grad_(True)
    out = tilesplat.spherical_harmonics(degree, d1, whole, masks=masks, backend=backend)
    if fused:
        assert (out < -0.5).any() and (masks[..., None] & (out > -0.5)).any()
        out = torch.clamp_min(out + 0.5, 0.0)
        out_split = spherical_harmonics_split(degree, d2, head, rest, radii=radii, rgb=True,
                                              backend=backend)
    else:
        out_split = spherical_harmonics_split(degree, d2, head, rest, masks=masks,
                                              backend=backend)
    (out * v).sum().backward()
    (out_split * v).sum().backward()
    assert _bits(out_split) == _bits(out)
    assert _bits(d2.grad) == _bits(d1.grad)
    assert _bits(head.grad) == _bits(whole.grad[..., :k0, :])
    assert _bits(rest.grad) == _bits(whole.grad[..., k0:, :])


def test_split_coefficients_are_checked():
    with pytest.raises(ValueError, match=r"K0 \+ K1 = 3"):
        spherical_harmonics_split(1, torch.ones(5, 3), torch.ones(5, 1, 3), torch.ones(5, 2, 3))
    with pytest.raises(ValueError, match="rest"):
        spherical_harmonics_split(1, torch.ones(5, 3), torch.ones(5, 1, 3), torch.ones(4, 3, 3))
    with pytest.raises(ValueError, match=r"expected radii \[\.\.\., 2\]"):
        spherical_harmonics_split(1, torch.ones(5, 3), torch.ones(5, 1, 3), torch.ones(5, 3, 3),
                                  radii=torch.ones(5, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="masks of dtype bool"):
        tilesplat.spherical_harmonics(1, torch.ones(5, 3), torch.ones(5, 4, 3),
                                      masks=torch.ones(5, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="radii of dtype int32 or int64"):
        spherical_harmonics_split(1, torch.ones(5, 3), torch.ones(5, 1, 3), torch.ones(5, 3, 3),
                                  radii=torch.ones(5, 2))


@pytest.mark.backends("torch", "cpu")
@pytest.mark.parametrize("packed", [False, True])
def test_rasterization_of_the_pair_gives_the_same_bits(backend, packed):
    """``rasterization(colors=(sh0, shN), sh_degree=3)`` renders and differentiates as the
    concatenated coefficients do, bit for bit."""
    g = torch.Generator().manual_seed(5)
    n = 60
    means = torch.randn(n, 3, generator=g) * 0.6
    means[:, 2] += 3.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.2 + 0.02
    opacities = torch.rand(n, generator=g)
    sh = torch.randn(n, 16, 3, generator=g) * 0.5
    viewmats = torch.eye(4).expand(2, 4, 4).clone()
    viewmats[1, 0, 3] = 0.3
    Ks = torch.tensor([[40.0, 0.0, 16.0], [0.0, 40.0, 12.0], [0.0, 0.0, 1.0]]).expand(2, 3, 3)
    v = torch.randn(2, 24, 32, 3, generator=g)
    got = []
    for split in (False, True):
        m = means.clone().requires_grad_(True)
        sh0 = sh[:, :1].clone().requires_grad_(True)
        shN = sh[:, 1:].clone().requires_grad_(True)
        colors = (sh0, shN) if split else torch.cat([sh0, shN], 1)
        img, _, _ = tilesplat.rasterization(m, quats, scales, opacities, colors, viewmats, Ks,
                                            32, 24, sh_degree=3, packed=packed, backend=backend)
        (img * v).sum().backward()
        got.append([img, m.grad, sh0.grad, shN.grad])
    assert got[0][2].abs().sum() > 0
    for name, a, b in zip(("render", "v_means", "v_sh0", "v_shN"), *got, strict=True):
        assert _bits(a) == _bits(b), name


def test_coefficients_must_broadcast():
    with pytest.raises(ValueError, match=r"leading dims broadcastable to dirs' \[3, 50\]"):
        tilesplat.spherical_harmonics(1, torch.ones(3, 50, 3), torch.ones(2, 50, 4, 3))


def test_kernel_factors_are_gsplats_in_float32():
    """The native kernels' factors are made from the one table in ``constants`` (some as
    products); each has the float32 value of the digits gsplat's CUDA kernels write, so a
    float32 kernel computes what it computed when it wrote those digits itself."""
    import numpy as np

    from tilesplat.backends.shared.sh import _SH

    gsplat_digits = (
        0.2820947917738781, 0.48860251190292, 1.092548430592079, 0.5462742152960395,
        0.9461746957575601, 0.3153915652525201, 2.285228997322329, 0.4570457994644658,
        1.445305721320277, 0.5900435899266435, 1.865881662950577, 1.119528997770346,
        4.683325804901025, 2.007139630671868, 3.31161143515146, 0.47308734787878,
        1.770130769779931, 0.6258357354491763, 1.984313483298443, 1.006230589874905,
    )  # fmt: skip
    ours = np.array(_SH, np.float32)
    assert ours.tobytes() == np.array(gsplat_digits, np.float32).tobytes()
    assert np.allclose(_SH, gsplat_digits, rtol=1e-15, atol=0)
