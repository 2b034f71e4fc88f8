"""A view of more pixels than the evaluation's budgets, scored in strips
(``eval_tile_pixels``) and rendered in crops (``eval_crop_pixels``), so that the float64
temporaries of the metrics, and the rasterizer's buffers where asked, are those of a part
and not of the view: scoring a 1500x1000 view whole raised the peak RSS by 252 MB (176 bytes
a pixel, ~1 GB at 3000x2000), in strips of 262,144 pixels by 48 MB, in 5.3 s against 9.1 s.

- Scores (:func:`strip_scores`): row strips of the render and the image, each strip taking
  the SSIM window's rows below it (``SSIM_WINDOW - 1``, the overlap), so that every window of
  the whole view's SSIM map (no padding, ``backends/torch/ssim.py``) lies in exactly one
  strip. PSNR, SSIM (the fused op's float64 mean of a strip's windows times their count),
  the colour fit's normal equations and the masked numbers are sums over the strips, and
  equal the whole view's (:func:`.evaluate.view_scores`) up to float64 summation order (a
  NaN in the image stops both, as the SSIM op refuses it). The colour fit takes two
  passes: the normal equations, then the fitted render's error and SSIM.
- Render (:func:`render_in_crops`): the camera cut into crops on the rasterizer's 16-pixel
  tile grid, each the same camera with its principal point moved by the crop's corner and
  the crop's size, so that every pixel sees the ray it sees in the whole render. Its pixels
  equal the whole render's within float32 rounding, except where a Gaussian centred beyond
  the crop's field of view widened by 15% of its size on each side reaches into it: the
  pinhole projection clamps its Jacobian to that widened field (3DGS's and gsplat's
  contract), the crop's and not the image's, so its footprint differs (0.019 at most on a
  300x200 room view of the initial Gaussians, in crops of 4096 pixels). Hence opt-in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from ...backends.torch.ssim import ssim_map
from ...constants import SSIM_SIGMA, SSIM_WINDOW
from ...data.dataset import Frame
from ..step.metrics import colour_weights, psnr_of_mse, quadratic_features, ssim_metric

TILE = 16  # crops start on the rasterizer's tile grid (its tile size)


def crops(width: int, height: int, budget: int) -> list[tuple[int, int, int, int]]:
    """The crops ``(x0, y0, w, h)`` that cover a ``width`` x ``height`` view: the whole view
    when it has at most ``budget`` pixels, else bands of whole tile rows of at most
    ``budget`` pixels (a band of one tile row is cut into columns when it is wider)."""
    if width * height <= budget:
        return [(0, 0, width, height)]
    rows = max(TILE, budget // width // TILE * TILE)
    cols = width if rows * width <= budget else max(TILE, budget // rows // TILE * TILE)
    return [(x0, y0, min(cols, width - x0), min(rows, height - y0))
            for y0 in range(0, height, rows) for x0 in range(0, width, cols)]


def crop_frame(frame: Frame, x0: int, y0: int, width: int, height: int) -> Frame:
    """``frame``'s camera cut to the crop at ``(x0, y0)`` of ``width`` x ``height``: its
    principal point moved by the corner (pinhole and fisheye alike), its pixels shared."""
    K = frame.K.clone()
    K[0, 2] -= x0
    K[1, 2] -= y0
    return dataclasses.replace(frame, K=K, width=width, height=height)


def render_in_crops(render: Callable[[Frame], Tensor], frame: Frame, budget: int) -> Tensor:
    """[H, W, C] the view assembled from ``render(crop)`` [h, w, C] of each crop of
    :func:`crops`, on the device and in the dtype of the crops' renders."""
    out: Tensor | None = None
    for x0, y0, w, h in crops(frame.width, frame.height, budget):
        part = render(crop_frame(frame, x0, y0, w, h))
        if out is None:
            out = part.new_empty((frame.height, frame.width, part.shape[-1]))
        out[y0:y0 + h, x0:x0 + w] = part
        del part
    assert out is not None
    return out


def _strips(height: int, width: int, budget: int) -> list[tuple[int, int]]:
    """Row ranges ``[y0, y1)`` of at most ``budget`` pixels each (at least a window tall)."""
    rows = max(SSIM_WINDOW, budget // max(width, 1))
    return [(y0, min(height, y0 + rows)) for y0 in range(0, height, rows)]


def _ssim_sum(a: Tensor, b: Tensor, y0: int, y1: int) -> float:
    """The sum of rows ``[y0, y1)`` of the SSIM map of the whole images a, b [H, W, 3], by the
    fused SSIM op in float64 (:func:`..step.metrics.ssim_metric`, the whole view's) over the
    image rows those windows cover: their mean times their count."""
    end = min(y1, a.shape[0] - SSIM_WINDOW + 1)
    if end <= y0:
        return 0.0
    rows = slice(y0, end + SSIM_WINDOW - 1)
    count = 3 * (end - y0) * (a.shape[1] - SSIM_WINDOW + 1)
    return ssim_metric(a[rows], b[rows]) * count


def _ssim_rows(a: Tensor, b: Tensor, y0: int, y1: int) -> Tensor | None:
    """Rows ``[y0, y1)`` of the SSIM map [3, h, w] of the whole images a, b [H, W, 3] (the
    map's row y is the window over image rows y .. y + SSIM_WINDOW - 1), in float64; None
    when the map has none of them."""
    end = min(y1, a.shape[0] - SSIM_WINDOW + 1)
    if end <= y0:
        return None
    rows = slice(y0, end + SSIM_WINDOW - 1)
    return ssim_map(a[rows][None].double(), b[rows][None].double(), SSIM_WINDOW, SSIM_SIGMA)[0]


@torch.no_grad()
def strip_scores(image: Tensor, target: Tensor, mask: Tensor | None, budget: int
                 ) -> dict[str, float | None]:
    """``psnr``, ``ssim``, ``cc_psnr``, ``cc_ssim`` (and with a mask ``masked_psnr``,
    ``masked_ssim``) of the render ``image`` [H, W, 3] against ``target`` [H, W, 3], as
    :func:`.evaluate.view_scores` computes them on the whole view, over strips of at most
    ``budget`` pixels (plus the SSIM window's overlap). ``mask``: [H, W] bool or None."""
    height, width = image.shape[:2]
    strips = _strips(height, width, budget)
    map_size = 3 * max(height - SSIM_WINDOW + 1, 0) * max(width - SSIM_WINDOW + 1, 0)
    dev = image.device
    sq = torch.zeros((), dtype=torch.float64, device=dev)
    ssim_sum = 0.0
    gram = torch.zeros(10, 10, dtype=torch.float64, device=dev)
    rhs = torch.zeros(10, 3, dtype=torch.float64, device=dev)
    masked = [torch.zeros_like(sq) for _ in range(4)]  # squared error, kept, SSIM, centres
    half = SSIM_WINDOW // 2
    for y0, y1 in strips:
        x, y = image[y0:y1].double(), target[y0:y1].double()
        sq += ((x - y) ** 2).sum()
        a = quadratic_features(x.reshape(-1, 3))
        gram += a.T @ a
        rhs += a.T @ (y - x).reshape(-1, 3)
        ssim_sum += _ssim_sum(image, target, y0, y1)
        if mask is not None:  # the masked SSIM needs the map (as view_metrics reads it)
            keep = mask[y0:y1, :, None]
            masked[0] += torch.where(keep, (x - y) ** 2, 0.0).sum()
            masked[1] += keep.sum() * 3
            smap = _ssim_rows(image, target.nan_to_num(0.0), y0, y1)
            if smap is not None:
                centre = mask[y0 + half:y0 + half + smap.shape[1], half:width - half]
                masked[2] += smap.mean(0)[centre].sum()
                masked[3] += centre.sum()
        del x, y, a
    n = float(height * width * 3)
    out: dict[str, float | None] = {"psnr": psnr_of_mse(float(sq) / n),
                                    "ssim": ssim_sum / map_size}
    out.update(cc_psnr=out["psnr"], cc_ssim=out["ssim"])  # unless the fit lowers the error
    out.update(_colour_fit(image, target, gram, rhs, float(sq), strips, map_size))
    if mask is not None:
        if not bool(mask.any()):
            out.update(masked_psnr=None, masked_ssim=None)
        else:
            out["masked_psnr"] = psnr_of_mse(float(masked[0]) / float(masked[1]))
            out["masked_ssim"] = float(masked[2]) / float(masked[3]) if masked[3] else None
    return out


def _colour_fit(image: Tensor, target: Tensor, gram: Tensor, rhs: Tensor, sq: float,
                strips: list[tuple[int, int]], map_size: int) -> dict[str, float]:
    """``cc_psnr`` and ``cc_ssim`` from the normal equations summed over the strips, as
    :func:`..step.metrics.color_correct` fits them on the whole view (the render itself
    when the fit does not lower the error)."""
    height, width = image.shape[:2]
    weights = colour_weights(gram, rhs, height * width)
    fit_sq = cc_sq = cc_ssim = 0.0
    for y0, y1 in strips:
        rows = slice(y0, min(height, y1 + SSIM_WINDOW - 1))  # the strip and its overlap
        x = image[rows].double().reshape(-1, 3)
        fitted = (quadratic_features(x) @ weights).clamp(0.0, 1.0).reshape(-1, width, 3)
        own = y1 - y0
        t = target[y0:y1].double()
        fit_sq += float(((fitted[:own] - t) ** 2).sum())
        corrected = fitted.to(image.dtype)  # the whole view's fit is scored as the render's
        cc_sq += float(((corrected[:own].double() - t) ** 2).sum())
        cc_ssim += _ssim_sum(corrected, target[rows], 0, own)
        del x, fitted, corrected, t
    if fit_sq >= sq:
        return {}  # no better than the render: the caller's psnr and ssim stand
    return {"cc_psnr": psnr_of_mse(cc_sq / (height * width * 3)), "cc_ssim": cc_ssim / map_size}
