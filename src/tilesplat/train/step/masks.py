"""Training masks: pixels a frame's mask hides take no part in the loss, the densification
statistics or the masked metrics.

A frame's mask (``Frame.mask``, [H, W] bool, True where the pixel counts) comes from the
dataset (COLMAP's ``masks/``, nerfstudio's ``mask_path``, ``masks_dir``, or the pixels an
undistortion could not fill). A batch carries them stacked, or None when no frame of the
batch has one; every function here takes that None and then does what the trainer did
without masks, so the step and the evaluation call them unconditionally.

- Loss (as gsplat's simple trainer): the render and the target are both set to zero where the
  mask hides a pixel (``torch.where``, so a NaN in a hidden target pixel cannot leak), the L1
  is the mean over the kept pixels, and the SSIM term ``1 - SSIM`` of the two blanked images
  is divided by the kept fraction (a window of hidden pixels compares zero with zero and adds
  nothing), so that the loss keeps its scale however much is hidden.
- Densification: a Gaussian whose projected centre falls on a hidden pixel is not counted as
  seen by that camera (its radius there is set to 0, or its entry dropped when packed): it
  got no gradient from that view, and counting it would dilute its mean gradient.
- Metrics: ``masked_psnr`` is the PSNR over the kept pixels, ``masked_ssim`` the mean of the
  SSIM map over the windows centred on kept pixels, for the views that have masks; None
  (``null`` in metrics.json) when they count no pixel. The training log's PSNR of a step
  whose views' masks keep no pixel is NaN, and left out of the logged mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ...backends.torch.ssim import ssim_map
from ...constants import SSIM_SIGMA, SSIM_WINDOW
from . import losses
from .losses import ssim
from .metrics import psnr_of_mse, squared_error


def batch_masks(masks: Sequence[Tensor | None]) -> Tensor | None:
    """The masks of a batch's frames [C, H, W] bool (all-True for a frame without one), or
    None when no frame has one."""
    if all(m is None for m in masks):
        return None
    ref = next(m for m in masks if m is not None)
    return torch.stack([m if m is not None else torch.ones_like(ref) for m in masks])


def masks_to(masks: Tensor | None, device: torch.device | str) -> Tensor | None:
    """``masks`` on ``device`` (None stays None)."""
    return None if masks is None else masks.to(device)


def photometric_loss(
    render: Tensor,  # [C, H, W, 3]
    target: Tensor,  # [C, H, W, 3]
    masks: Tensor | None,  # [C, H, W] bool
    ssim_lambda: float,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """The 3DGS loss ``(1 - lambda) L1 + lambda (1 - SSIM)`` over the pixels ``masks`` keeps
    (all of them for None). Returns (loss, L1 detached)."""
    if masks is None:
        return losses.photometric_loss(render, target, ssim_lambda, backend)
    keep = masks[..., None]
    zero = torch.zeros((), dtype=render.dtype, device=render.device)
    render = torch.where(keep, render, zero)
    target = torch.where(keep, target, zero)
    kept = keep.sum().clamp_min(1) * render.shape[-1]
    l1 = (render - target).abs().sum() / kept
    if ssim_lambda == 0.0:
        return l1, l1.detach()
    share = kept / render.numel()
    loss = (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim(render, target, backend)) / share
    return loss, l1.detach()


@torch.no_grad()
def exclude_masked(info: dict[str, Any], masks: Tensor | None, key: str) -> dict[str, Any]:
    """The render meta with the (camera, Gaussian) pairs whose projected centre lies on a
    hidden pixel taken out of the densification statistics (``info`` itself for None).

    Unpacked meta: their ``radii`` are set to 0. Packed meta: their entries are dropped, and
    ``info[key]`` becomes a stand-in carrying the kept rows of its ``.grad`` (and
    ``.absgrad``).

    Raises:
        ValueError: the meta's cameras are not the batch's (a model-parallel render, whose
            meta covers every rank's cameras).
    """
    if masks is None:
        return info
    n_cams, height, width = masks.shape
    means2d = info["means2d"].detach()
    packed = "camera_ids" in info and means2d.dim() == 2
    if packed:
        cam = info["camera_ids"].long()
    else:
        if means2d.shape[0] != n_cams:
            raise ValueError(
                f"training masks need a render of the batch's {n_cams} cameras, the render "
                f"meta holds {means2d.shape[0]} (masks are not supported with parallel = "
                "'model')"
            )
        cam = torch.arange(n_cams, device=means2d.device)[:, None].expand(means2d.shape[:2])
    px = torch.floor(means2d[..., 0]).long()
    py = torch.floor(means2d[..., 1]).long()
    inside = (px >= 0) & (px < width) & (py >= 0) & (py < height)
    hidden = inside & ~masks[cam, py.clamp(0, height - 1), px.clamp(0, width - 1)]
    out = dict(info)
    if not packed:
        out["radii"] = torch.where(hidden[..., None], 0, info["radii"])
        return out
    keep = ~hidden
    for name in ("camera_ids", "gaussian_ids", "radii", "means2d", "depths", "conics",
                 "opacities"):
        if isinstance(info.get(name), Tensor) and info[name].shape[:1] == keep.shape:
            out[name] = info[name][keep]
    grads = info[key]
    stand_in = grads.detach()[keep].clone()
    stand_in.grad = None if grads.grad is None else grads.grad[keep]
    if getattr(grads, "absgrad", None) is not None:
        stand_in.absgrad = grads.absgrad[keep]
    out[key] = stand_in
    return out


@torch.no_grad()
def view_metrics(image: Tensor, target: Tensor, mask: Tensor | None
                 ) -> dict[str, float | None]:
    """``masked_psnr`` and ``masked_ssim`` of one view [H, W, 3] over the pixels ``mask``
    [H, W] keeps; empty for a view without a mask. A metric that counts no pixel (a mask
    that hides every pixel; for the SSIM, every window centre) is undefined: None."""
    if mask is None:
        return {}
    if not bool(mask.any()):
        return {"masked_psnr": None, "masked_ssim": None}
    mse = float(squared_error(image[None], target[None], mask[None]))
    smap = ssim_map(image[None].double(), target.nan_to_num(0.0)[None].double(), SSIM_WINDOW,
                    SSIM_SIGMA)  # [1, 3, h, w]
    half = SSIM_WINDOW // 2
    centre = mask[half: mask.shape[0] - half, half: mask.shape[1] - half]
    kept = smap[0].mean(0)[centre]
    return {"masked_psnr": psnr_of_mse(mse),
            "masked_ssim": float(kept.mean()) if kept.numel() else None}
