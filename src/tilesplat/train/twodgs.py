"""The trainer's 2DGS mode (``model = "2dgs"``): surfels trained the way gsplat 1.5.3's
``examples/simple_trainer_2dgs.py`` and the 2DGS paper (Huang et al. 2024) train them.

What differs from the 3DGS recipe, and only that, lives here:

- Surfels keep gsplat's parameter layout (``scales`` [N, 3] as logs) so that the strategies,
  optimisers and checkpoints are the 3DGS ones; the rasterizer ignores the third scale. It is
  held flat, ``FLAT_RATIO`` times the smaller in-plane scale, from initialisation on (gsplat
  starts it equal to the others; flat keeps it out of the split's samples and of the
  ``grow_scale3d`` / ``prune_scale3d`` maxima) and again when a PLY is written, so the file is
  a valid 3DGS PLY of thin discs that any 3DGS reader and viewer opens.
- Rendering is :func:`tilesplat.rasterization_2dgs` in ``RGB+D`` mode (``RGB+ED`` for the
  test renders, as gsplat's evaluation); densification reads ``meta["gradient_2dgs"]``.
- The loss adds gsplat's normal-consistency term (rendered normals against the normals of
  the rendered depth, weighted by the detached alpha) from ``normal_start`` on and the mean
  depth distortion from ``dist_start`` on.
- The test renders also write ``normal/``, ``normal_from_depth/`` and ``depth/`` PNGs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..io.images import write_png
from ..variants import rasterization_2dgs
from .splats import activated

if TYPE_CHECKING:
    from .config import TrainConfig

# Third scale of a surfel / its smaller in-plane scale: thin enough that a 3DGS renderer
# draws a disc, thick enough that exp(log-scale) stays a normal float32.
FLAT_RATIO = 1e-3
# Pixels at least this opaque get a depth colour and a unit normal in the PNGs.
OPAQUE = 0.5
# Colour-map anchors (viridis-like, dark = near, bright = far) at 0, 1/4, 1/2, 3/4, 1.
_COLORMAP = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64
) / 255.0
RENDER_FOLDERS = ("normal", "normal_from_depth", "depth")


def unsupported_with_2dgs(cfg: TrainConfig) -> list[str]:
    """Why ``cfg`` cannot run in 2DGS mode: one message per key (empty when it can)."""
    bad = []
    if cfg.strategy != "default":
        bad.append(
            f"strategy must be 'default' with model = '2dgs' (gsplat's 2DGS trainer densifies "
            f"with DefaultStrategy on gradient_2dgs), got {cfg.strategy!r}"
        )
    if cfg.parallel != "none":
        bad.append(
            f"parallel must be 'none' with model = '2dgs' (the data-parallel exchange "
            f"carries 3DGS metadata), got {cfg.parallel!r}"
        )
    if cfg.backward_scheme != "per_pixel":
        bad.append(
            f"backward_scheme must be 'per_pixel' with model = '2dgs' (the 2DGS rasterizer "
            f"has one backward, per pixel), got {cfg.backward_scheme!r}"
        )
    if cfg.antialiased:
        bad.append(
            "antialiased must be false with model = '2dgs' (rasterization_2dgs has no "
            "antialiased mode), got True"
        )
    return bad


def flatten_scales(log_scales: Tensor) -> Tensor:
    """Log-scales [N, 3] with the third set to log(``FLAT_RATIO`` x the smaller of the two
    in-plane scales); a new tensor."""
    out = log_scales.detach().clone()
    out[:, 2] = torch.minimum(out[:, 0], out[:, 1]) + math.log(FLAT_RATIO)
    return out


def make_surfels(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Initial 3DGS parameters (``init.init_params``) as surfels: the third scale flat."""
    return {**tensors, "scales": flatten_scales(tensors["scales"])}


@dataclass
class SurfelRender:
    """What one 2DGS render of C cameras gives.

    Attributes:
        colors: [C, H, W, 3] (not clamped); alphas: [C, H, W, 1].
        depths: [C, H, W, 1], accumulated (``RGB+D``) or expected (``RGB+ED``) z-depth.
        normals: [C, H, W, 3] world-space rendered normals (alpha-weighted sums).
        normals_from_depth: [C, H, W, 3] world-space normals of the depth map (unit length
            inside, zero on the one-pixel border).
        distort: [C, H, W, 1] depth distortion (zero unless rendered with ``distloss``).
        median: [C, H, W, 1] median depth.
        info: the rasterizer's meta (``gradient_2dgs``, ``radii``, ``width``, ...).
    """

    colors: Tensor
    alphas: Tensor
    depths: Tensor
    normals: Tensor
    normals_from_depth: Tensor
    distort: Tensor
    median: Tensor
    info: dict[str, Any]


def render_surfels(
    params: dict[str, Tensor],
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    cfg: TrainConfig,
    sh_degree: int,
    backgrounds: Tensor | None = None,  # [C, 3]
    absgrad: bool = False,
    distloss: bool = False,
    expected_depth: bool = False,
) -> SurfelRender:
    """Render the surfels from C cameras with :func:`tilesplat.rasterization_2dgs`."""
    renders, alphas, normals, from_depth, distort, median, info = rasterization_2dgs(
        **activated(params),
        viewmats=viewmats,
        Ks=Ks,
        width=width,
        height=height,
        near_plane=cfg.near_plane,
        far_plane=cfg.far_plane,
        sh_degree=sh_degree,
        packed=cfg.packed,
        backgrounds=backgrounds,
        render_mode="RGB+ED" if expected_depth else "RGB+D",
        absgrad=absgrad,
        distloss=distloss,
        backend=cfg.backend,
    )
    return SurfelRender(
        colors=renders[..., :3],
        alphas=alphas,
        depths=renders[..., 3:4],
        normals=normals,
        normals_from_depth=from_depth.reshape(normals.shape),  # gsplat squeezes C = 1
        distort=distort,
        median=median,
        info=info,
    )


def normal_active(cfg: TrainConfig, step: int) -> bool:
    """Whether ``step`` adds the normal-consistency loss."""
    return cfg.normal_lambda > 0.0 and step >= cfg.normal_start


def distortion_active(cfg: TrainConfig, step: int) -> bool:
    """Whether ``step`` adds the depth-distortion loss (and so renders it)."""
    return cfg.dist_lambda > 0.0 and step >= cfg.dist_start


def normal_consistency(
    normals: Tensor,  # [C, H, W, 3]
    normals_from_depth: Tensor,  # [C, H, W, 3]
    alphas: Tensor,  # [C, H, W, 1]
) -> Tensor:
    """Mean of 1 - n . (alpha n_depth) over pixels (alpha detached, as gsplat): 0 where the
    rendered normals agree with the surface the depth map describes. Returns []."""
    return (1.0 - (normals * normals_from_depth * alphas.detach()).sum(dim=-1)).mean()


def surfel_regularisation(out: SurfelRender, cfg: TrainConfig, step: int) -> Tensor | None:
    """The 2DGS loss terms active at ``step`` (a scalar tensor), or None when none is."""
    terms = []
    if normal_active(cfg, step):
        terms.append(
            cfg.normal_lambda * normal_consistency(out.normals, out.normals_from_depth, out.alphas)
        )
    if distortion_active(cfg, step):
        terms.append(cfg.dist_lambda * out.distort.mean())
    return sum(terms[1:], terms[0]) if terms else None


def colormap(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A colour picture [H, W, 3] in [0, 1] of ``values`` [H, W] where ``mask`` [H, W] holds,
    scaled to their min..max there; black elsewhere."""
    out = np.zeros((*values.shape, 3))
    if not mask.any():
        return out
    v = values[mask]
    lo, hi = float(v.min()), float(v.max())
    t = (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)
    xs = np.linspace(0.0, 1.0, len(_COLORMAP))
    out[mask] = np.stack([np.interp(t, xs, _COLORMAP[:, c]) for c in range(3)], axis=-1)
    return out


def unit_normals(normals: Tensor, alphas: Tensor) -> Tensor:
    """Rendered normals [..., 3] scaled to unit length where alpha [..., 1] >= ``OPAQUE``,
    zero elsewhere."""
    unit = torch.nn.functional.normalize(normals, dim=-1)
    return torch.where(alphas >= OPAQUE, unit, torch.zeros_like(unit))


def write_surfel_renders(folder: Path, name: str, out: SurfelRender) -> None:
    """Write camera 0 of ``out`` as ``folder/{normal,normal_from_depth,depth}/name`` PNGs
    (atomically): normals as 0.5 + 0.5 n (grey where transparent), the depth colour-mapped
    over the opaque pixels (black elsewhere)."""
    alpha = out.alphas[0].detach()
    mask = (alpha[..., 0] >= OPAQUE).cpu().numpy()
    pictures = {
        "normal": 0.5 + 0.5 * unit_normals(out.normals[0].detach(), alpha),
        "normal_from_depth": 0.5 + 0.5 * out.normals_from_depth[0].detach() * (alpha >= OPAQUE),
        "depth": colormap(out.depths[0, ..., 0].detach().cpu().numpy().astype(np.float64), mask),
    }
    for sub, image in pictures.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        write_png(folder / sub / name, image)
