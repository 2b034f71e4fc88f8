"""SSIM, PSNR and L1: checked against scikit-image and by hand."""

import math

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from tilesplat.train.step import metrics
from tilesplat.train.step.losses import l1_loss, photometric_loss, ssim, ssim_map
from tilesplat.train.step.metrics import make_lpips, psnr, ssim_metric


def _fixed_pair(h: int, w: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A smooth textured image and a noisy, shifted, contrast-changed copy, in [0, 1]."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack(
        [0.5 + 0.4 * np.sin(x / 3.0 + c) * np.cos(y / 5.0 - c) for c in range(3)], axis=-1
    )
    other = np.clip(
        0.8 * np.roll(base, 1, axis=1) + 0.1 + 0.05 * rng.standard_normal(base.shape), 0, 1
    )
    return base, other


@pytest.mark.parametrize("shape,seed", [((40, 37), 0), ((11, 11), 1), ((64, 48), 2)])
def test_ssim_matches_scikit_image(shape, seed):
    a, b = _fixed_pair(*shape, seed)
    want = structural_similarity(
        a,
        b,
        gaussian_weights=True,
        sigma=1.5,
        use_sample_covariance=False,
        data_range=1.0,
        channel_axis=-1,
    )
    got = float(ssim(torch.from_numpy(a), torch.from_numpy(b)))
    assert abs(got - want) < 1e-9, (got, want)
    # float32, batched [B, H, W, C] gives the mean of the per-image values
    got32 = ssim_metric(torch.from_numpy(a).float(), torch.from_numpy(b).float())
    assert abs(got32 - want) < 1e-5


def test_ssim_batch_is_mean_of_images():
    a0, b0 = _fixed_pair(20, 24, 3)
    a1, b1 = _fixed_pair(20, 24, 4)
    batch = ssim(torch.from_numpy(np.stack([a0, a1])), torch.from_numpy(np.stack([b0, b1])))
    single = [
        float(ssim(torch.from_numpy(a), torch.from_numpy(b))) for a, b in ((a0, b0), (a1, b1))
    ]
    assert abs(float(batch) - sum(single) / 2) < 1e-12


def test_ssim_identity_and_shapes():
    a, _ = _fixed_pair(16, 16, 5)
    t = torch.from_numpy(a)
    assert abs(float(ssim(t, t)) - 1.0) < 1e-12
    assert ssim_map(t[None], t[None]).shape == (1, 3, 6, 6)
    with pytest.raises(ValueError, match="smaller than the 11x11 window"):
        ssim(t[:8], t[:8])
    with pytest.raises(ValueError, match="differ in shape"):
        ssim(t, t[:, :15])


def test_ssim_gradient_float64():
    a, b = _fixed_pair(12, 13, 6)
    x = torch.from_numpy(a[:, :, :2]).requires_grad_()
    y = torch.from_numpy(b[:, :, :2])
    assert torch.autograd.gradcheck(lambda x: ssim(x, y), (x,), fast_mode=True)


def test_psnr_and_l1_by_hand():
    a = torch.zeros(4, 5, 3)
    b = torch.full((4, 5, 3), 0.1)
    assert psnr(a, b) == pytest.approx(20.0, abs=1e-5)  # MSE 0.01 (float32 0.1)
    assert psnr(a, a) == math.inf
    assert float(l1_loss(a, b)) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="differ in shape"):
        psnr(a, b[:, :4])


def test_l1_gradient_is_autograds_bit_for_bit():
    """The L1's one-pass gradient is autograd's of (a - b).abs().mean(): ties (sign 0), a -0
    against a +0, and both inputs' gradients, in float32 and float64."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64):
        a = torch.rand(2, 9, 7, 3, generator=g, dtype=dtype)
        b = torch.rand(2, 9, 7, 3, generator=g, dtype=dtype)
        a[0, 0, :4] = b[0, 0, :4]
        a[1, 1, 1, 0], b[1, 1, 1, 0] = -0.0, 0.0
        grads = []
        for fn in (lambda x, y: (x - y).abs().mean(), l1_loss):
            x, y = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
            loss = fn(x, y)
            (loss * 0.37).backward()
            grads.append([loss, x.grad, y.grad])
        for want, got in zip(*grads, strict=True):
            assert want.detach().numpy().tobytes() == got.detach().numpy().tobytes()


def test_photometric_loss_weights():
    a, b = (torch.from_numpy(x).float() for x in _fixed_pair(16, 16, 7))
    loss, l1 = photometric_loss(a[None], b[None], 0.2)
    want = 0.8 * float(l1_loss(a, b)) + 0.2 * (1 - float(ssim(a, b)))
    assert float(loss) == pytest.approx(want, rel=1e-6)
    loss0, _ = photometric_loss(a[None], b[None], 0.0)
    assert float(loss0) == pytest.approx(float(l1), rel=1e-7)


def test_lpips_is_optional():
    try:
        import lpips  # noqa: F401
    except ImportError:
        assert make_lpips() is None
        return
    score = make_lpips()
    if score is not None:  # weights may be unavailable offline
        a = torch.rand(32, 32, 3)
        assert score(a, a) < 1e-6


def _squared_error_by_hand(render, target, masks):
    """The mean over the kept pixels in numpy float64, pixel by pixel of the mask."""
    r, t = render.numpy().astype(np.float64), target.numpy().astype(np.float64)
    sq = (r - t) ** 2
    if masks is None:
        return sq.mean()
    keep = masks.numpy()
    return sq[keep].sum() / (keep.sum() * r.shape[-1]) if keep.any() else math.nan


@pytest.mark.parametrize("part", [1, 7, 1 << 16, "kernel"])
@pytest.mark.parametrize("shape", [(1, 13, 17, 3), (2, 9, 31, 3), (1, 1, 1, 1)])
def test_squared_error_in_parts_is_the_float64_mean(monkeypatch, part, shape):
    """The CPU kernel and torch's parts (one pixel, a size that leaves a remainder, the
    default) give the float64 mean of every element, or of the kept pixels; a NaN target
    under a hidden pixel stays out; a mask that keeps nothing gives NaN; float64 images
    too."""
    if part == "kernel":
        part = 1 << 16
    else:  # torch's parts, which other dtypes and devices take
        monkeypatch.setattr(metrics, "_one_pass", lambda *a: False)
    monkeypatch.setattr(metrics, "CPU_PART_PIXELS", part)
    gen = torch.Generator().manual_seed(sum(shape) + part)
    render = torch.rand(shape, generator=gen)
    target = torch.rand(shape, generator=gen)
    masks = torch.rand(shape[:-1], generator=gen) > 0.4
    masks.view(-1)[0] = True
    target_nan = target.clone()
    target_nan[~masks] = math.nan
    for r, t, m in [(render, target, None), (render, target_nan, masks),
                    (render.double(), target.double(), masks)]:
        got = metrics.squared_error(r, t, m)
        assert got.dtype == torch.float64 and got.shape == ()
        assert float(got) == pytest.approx(_squared_error_by_hand(r, t, m), rel=1e-12)
    none_kept = metrics.squared_error(render, target, torch.zeros_like(masks))
    assert math.isnan(float(none_kept))
    assert float(metrics.squared_error(render, render)) == 0.0


def test_squared_error_of_no_pixels_and_of_other_shapes():
    empty = torch.zeros(1, 0, 5, 3)
    assert math.isnan(float(metrics.squared_error(empty, empty)))
    with pytest.raises(ValueError, match="differ in shape"):
        metrics.squared_error(torch.zeros(1, 4, 4, 3), torch.zeros(1, 4, 5, 3))


def _colour_fit_by_hand(render, target):
    """The quadratic colour fit of the whole view in numpy float64 (one pass, no parts): the
    fitted image, its squared error and the render's."""
    x = render.reshape(-1, 3).numpy().astype(np.float64)
    y = target.reshape(-1, 3).numpy().astype(np.float64)
    i, j = np.triu_indices(3)
    a = np.concatenate([x[:, i] * x[:, j], x, np.ones((len(x), 1))], axis=1)
    identity = np.zeros((10, 3))
    identity[6:9] = np.eye(3)
    gram = a.T @ a + metrics.CC_RIDGE * len(a) * np.eye(10)
    fitted = np.clip(a @ (identity + np.linalg.solve(gram, a.T @ (y - x))), 0.0, 1.0)
    return fitted.reshape(render.shape), ((fitted - y) ** 2).sum(), ((x - y) ** 2).sum()


@pytest.mark.parametrize("part", [1, 7, 1 << 13])
@pytest.mark.parametrize("shape", [(13, 17, 3), (97, 91, 3)])
def test_the_colour_fit_in_parts_is_the_whole_views(monkeypatch, part, shape):
    """The CPU's parts (one pixel, a size that leaves a remainder, the default, a view of
    more pixels than the default) fit the same polynomial as one float64 pass over the view;
    a render equal to its image comes back as it is."""
    monkeypatch.setattr(metrics, "CC_PART_PIXELS", part)
    gen = torch.Generator().manual_seed(sum(shape) + part)
    render = torch.rand(shape, generator=gen)
    # a colour cast and noise: the fit has something to correct, and it clamps at 1
    target = (render * torch.tensor([0.8, 1.1, 0.9]) + 0.05
              + 0.02 * torch.randn(shape, generator=gen)).clamp(0.0, 1.0)
    want, fit_sq, plain_sq = _colour_fit_by_hand(render, target)
    assert fit_sq < plain_sq
    got = metrics.color_correct(render, target)
    assert got.dtype == torch.float32 and got.shape == render.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-6)
    assert metrics.color_correct(render, render) is render
