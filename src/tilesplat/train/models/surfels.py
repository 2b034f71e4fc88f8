"""Surfels (``model = "2dgs"``): trained the way gsplat 1.5.3's
``examples/simple_trainer_2dgs.py`` and the 2DGS paper (Huang et al. 2024) train them.

What differs from 3D Gaussians, and only that, lives here:

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
- The test renders also write ``normal/``, ``normal_from_depth/`` and ``depth/`` PNGs
  (:mod:`.surfel_pictures`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from ...keys import Key
from ...rendering.surfels import rasterization_2dgs
from .. import seams
from ..parallel.base import several_ranks
from .base import Cameras, ModelKind, Render, render_args
from .splats import activated
from .surfel_pictures import write_surfel_renders

if TYPE_CHECKING:
    from ..config import TrainConfig

# Third scale of a surfel / its smaller in-plane scale: thin enough that a 3DGS renderer
# draws a disc, thick enough that exp(log-scale) stays a normal float32.
FLAT_RATIO = 1e-3


def flatten_scales(log_scales: Tensor) -> Tensor:
    """Log-scales [N, 3] with the third set to log(``FLAT_RATIO`` x the smaller of the two
    in-plane scales); a new tensor."""
    out = log_scales.detach().clone()
    out[:, 2] = torch.minimum(out[:, 0], out[:, 1]) + math.log(FLAT_RATIO)
    return out


@dataclass
class SurfelRender(Render):
    """What one 2DGS render of C cameras gives, beyond :class:`.base.Render`.

    Attributes:
        depths: [C, H, W, 1], accumulated (``RGB+D``) or expected (``RGB+ED``) z-depth (the
            base's field, always set here).
        normals: [C, H, W, 3] world-space rendered normals (alpha-weighted sums).
        normals_from_depth: [C, H, W, 3] world-space normals of the depth map (unit length
            inside, zero on the one-pixel border).
        distort: [C, H, W, 1] depth distortion (zero unless rendered with ``distloss``).
        median: [C, H, W, 1] median depth.
    """

    normals: Tensor
    normals_from_depth: Tensor
    distort: Tensor
    median: Tensor


def render_surfels(
    params: dict[str, Tensor],
    cams: Cameras,
    cfg: TrainConfig,
    sh_degree: int,
    absgrad: bool = False,
    distloss: bool = False,
    expected_depth: bool = False,
) -> SurfelRender:
    """Render the surfels from the C cameras ``cams`` with :func:`tilesplat.rasterization_2dgs`
    (``RGB+ED`` with ``expected_depth``, else ``RGB+D``).

    Raises:
        ValueError: the cameras are not pinhole (rasterization_2dgs has no fisheye).
    """
    if cams.camera_model != "pinhole" or cams.lens is not None:
        raise ValueError(
            f"model = '2dgs' renders undistorted pinhole cameras only, the dataset has "
            f"{cams.camera_model} cameras" + (" with a lens" if cams.lens is not None else "")
            + ": train it with model = '3dgs'"
        )
    renders, alphas, normals, from_depth, distort, median, info = rasterization_2dgs(
        **activated(params),
        **render_args(cams, cfg, sh_degree),
        render_mode="RGB+ED" if expected_depth else "RGB+D",
        absgrad=absgrad,
        distloss=distloss,
    )
    return SurfelRender(
        colors=renders[..., :3],
        alphas=alphas,
        info=info,
        depths=renders[..., 3:4],
        normals=normals,
        normals_from_depth=from_depth.reshape(normals.shape),  # gsplat squeezes C = 1
        distort=distort,
        median=median,
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


@seams.register("model", "2dgs")
class Surfels(ModelKind):
    """2D Gaussians (surfels): flat third scale, rasterization_2dgs, normal and depth terms."""

    gradient_key = "gradient_2dgs"
    KEYS: ClassVar[tuple[Key, ...]] = (
        Key("normal_lambda", 5e-2, "2dgs: weight of the normal-consistency loss (gsplat's "
            "default; 0: off)", ge=0.0),
        Key("normal_start", 7000, "2dgs: first step with the normal-consistency loss (gsplat's "
            "default)", ge=0),
        Key("dist_lambda", 1e-2, "2dgs: weight of the depth-distortion loss (gsplat's default; "
            "0: off)", ge=0.0),
        Key("dist_start", 3000, "2dgs: first step with the depth-distortion loss (gsplat's "
            "default)", ge=0),
    )

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        """What gsplat's 2DGS trainer and ``rasterization_2dgs`` do not have: another
        strategy, parallel training, the per-splat backward, the antialiased mode, the
        capture's own lens (3DGUT)."""
        bad = []
        if cfg.strategy != "default":
            bad.append(
                f"strategy must be 'default' with model = '2dgs' (gsplat's 2DGS trainer "
                f"densifies with DefaultStrategy on gradient_2dgs), got {cfg.strategy!r}"
            )
        if several_ranks(cfg):
            bad.append(
                f"parallel must be 'none' with model = '2dgs' (the data-parallel exchange "
                f"carries 3DGS metadata), got {cfg.parallel!r}"
            )
        if cfg.backward_scheme != "per_pixel":
            bad.append(
                f"backward_scheme must be 'per_pixel' with model = '2dgs' (the 2DGS "
                f"rasterizer has one backward, per pixel), got {cfg.backward_scheme!r}"
            )
        if cfg.antialiased:
            bad.append(
                "antialiased must be false with model = '2dgs' (rasterization_2dgs has no "
                "antialiased mode), got True"
            )
        if cfg.camera_mode == "native":
            bad.append(
                "camera_mode must be 'undistort' with model = '2dgs' (rasterization_2dgs has "
                "no 3DGUT path to render a capture through its own lens), got 'native'"
            )
        return bad

    def init(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """The initial 3DGS parameters with the third scale flat."""
        return {**params, "scales": flatten_scales(params["scales"])}

    def render(self, params: dict[str, Tensor], cams: Cameras, cfg: TrainConfig,
               sh_degree: int, *, step: int | None = None, absgrad: bool = False,
               distributed: bool = False, expected_depth: bool = False) -> SurfelRender:
        """:func:`render_surfels`: in ``RGB+D`` with the distortion from ``dist_start`` on for
        training (``RGB+ED`` with ``expected_depth``), in ``RGB+ED`` for evaluation
        (``step = None``). ``distributed`` is refused by the config (:meth:`config_errors`)."""
        if distributed:
            raise ValueError("model = '2dgs' does not render distributed (parallel = 'none')")
        evaluation = step is None
        distloss = not evaluation and distortion_active(cfg, step)
        return render_surfels(params, cams, cfg, sh_degree, absgrad=absgrad, distloss=distloss,
                              expected_depth=evaluation or expected_depth)

    def phase(self, cfg: TrainConfig, step: int) -> tuple:
        """The normal and distortion terms switch on at their start steps."""
        return (normal_active(cfg, step), distortion_active(cfg, step))

    def regularisation(self, out: Render, cfg: TrainConfig, step: int) -> Tensor | None:
        """The normal-consistency term from ``normal_start`` on and the mean distortion from
        ``dist_start`` on (weighted by ``normal_lambda`` and ``dist_lambda``)."""
        assert isinstance(out, SurfelRender)
        terms = []
        if normal_active(cfg, step):
            terms.append(
                cfg.normal_lambda
                * normal_consistency(out.normals, out.normals_from_depth, out.alphas)
            )
        if distortion_active(cfg, step):
            terms.append(cfg.dist_lambda * out.distort.mean())
        return sum(terms[1:], terms[0]) if terms else None

    def export(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """The third scale flat (:func:`flatten_scales`), so that 3DGS readers draw thin
        discs."""
        return {**params, "scales": flatten_scales(params["scales"])}

    def write_renders(self, folder: Path, name: str, out: Render) -> None:
        """``normal/``, ``normal_from_depth/`` and ``depth/`` PNGs of camera 0."""
        assert isinstance(out, SurfelRender)
        write_surfel_renders(folder, name, out.alphas, out.normals, out.normals_from_depth,
                             out.depths)
