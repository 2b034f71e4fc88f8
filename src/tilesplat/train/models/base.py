"""The model seam: what a kind of model (``model = "3dgs"``, ``"2dgs"``, ...) gives the trainer.

Every kind stores gsplat's parameter layout (``models/splats.py``: ``means``, ``scales`` as logs,
``quats``, ``opacities`` as logits, ``sh0``, ``shN``), so the optimisers, the strategies and the
checkpoints are shared; a kind says how those parameters start, render, are regularised and are
written as a 3DGS PLY. The trainer, its step and the evaluation call these methods and never
ask which kind they hold. A new kind is one module here with a ``@register("model", NAME)``
class and its import in ``models/__init__.py`` (docs/README.md, "where things go").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ...constants import BACKWARD_SCHEMES
from ...keys import Key
from .. import seams

if TYPE_CHECKING:
    from ..config import TrainConfig

KEYS = (
    Key("sh_degree", 3, "highest spherical-harmonics degree of the colours (0-4)", ge=0, le=4),
    Key("sh_degree_interval", 1000, "raise the SH degree in use every n steps", ge=1),
    Key("backward_scheme", "per_pixel", "rasterizer backward: per_pixel or per_splat",
        choices=BACKWARD_SCHEMES),
    Key("packed", False, "packed rasterization (less memory for sparse views)"),
    Key("antialiased", False, "antialiased rasterize mode (Mip-Splatting's 2D filter)"),
    Key("near_plane", 0.01, "Gaussians nearer than this depth are culled", ge=0.0),
    Key("far_plane", 1e10, "Gaussians farther than this depth are culled", finite=False),
)


def sh_degree_at(cfg: TrainConfig, step: int) -> int:
    """The SH degree in use at ``step``: one more every ``sh_degree_interval`` steps."""
    return min(step // cfg.sh_degree_interval, cfg.sh_degree)


def plane_errors(cfg: TrainConfig) -> list[str]:
    """Why the culling planes leave no depth between them (empty when they do not)."""
    if cfg.far_plane > cfg.near_plane:
        return []
    return [f"far_plane ({cfg.far_plane}) must exceed near_plane ({cfg.near_plane})"]


seams.register_keys("rendering (train/models/base.py)", KEYS, plane_errors)


@dataclass
class Cameras:
    """C cameras of one image size, and the colours their renders are composited on.

    Attributes:
        viewmats: [C, 4, 4] world-to-camera; Ks: [C, 3, 3] intrinsics.
        backgrounds: [C, 3], or None for black.
        camera_model: the rasterizer's ``camera_model`` of all C (``pinhole`` or ``fisheye``).
        lens: the capture's own lens of each camera (``camera_mode = "native"``): gsplat's
            ``radial_coeffs`` [C, 6] (pinhole) or [C, 4] (fisheye), ``tangential_coeffs``
            [C, 2], ``thin_prism_coeffs`` [C, 4] by keyword (``data/lens.py``), rendered through
            3DGUT (:func:`lens_args`); None: the plain camera of ``Ks``.
    """

    viewmats: Tensor
    Ks: Tensor
    width: int
    height: int
    backgrounds: Tensor | None
    camera_model: str = field(default="pinhole", kw_only=True)
    lens: dict[str, Tensor] | None = field(default=None, kw_only=True)


def lens_to(lens: dict[str, Tensor] | None, device: torch.device | str
            ) -> dict[str, Tensor] | None:
    """The cameras' lens coefficients on ``device``."""
    return None if lens is None else {k: v.to(device) for k, v in lens.items()}


def lens_args(cams: Cameras) -> dict[str, Any]:
    """``rasterization``'s keywords that render ``cams`` through their lens: 3DGUT (the
    unscented-transform projection and the rasterizer that evaluates each Gaussian in 3D
    along the pixel's ray, ``with_ut`` and ``with_eval3d``) with the coefficients; none for
    cameras without one."""
    if cams.lens is None:
        return {}
    return {"with_ut": True, "with_eval3d": True, **cams.lens}


def render_args(cams: Cameras, cfg: TrainConfig, sh_degree: int) -> dict[str, Any]:
    """The keyword arguments every kind's rasterizer takes alike from the cameras and the
    config (``rasterization`` and ``rasterization_2dgs``)."""
    return {
        "viewmats": cams.viewmats, "Ks": cams.Ks, "width": cams.width, "height": cams.height,
        "near_plane": cfg.near_plane, "far_plane": cfg.far_plane, "sh_degree": sh_degree,
        "packed": cfg.packed, "backgrounds": cams.backgrounds, "backend": cfg.backend,
    }  # fmt: skip


@dataclass
class Render:
    """What one render of C cameras gives.

    Attributes:
        colors: [C, H, W, 3] (not clamped above 1).
        alphas: [C, H, W, 1].
        info: the rasterizer's meta (``means2d`` or ``gradient_2dgs``, ``radii``, ``width``, ...).
        depths: [C, H, W, 1] the expected z-depth when the render was asked for it
            (``expected_depth``), else None (or the kind's own depth render).
    """

    colors: Tensor
    alphas: Tensor
    info: dict[str, Any]
    depths: Tensor | None = field(default=None, kw_only=True)


class ModelKind:
    """A kind of model behind the trainer's ``model`` key (the base: no extra loss terms, no
    extra renders, parameters initialised and exported as they are)."""

    # the key of the render meta whose gradient densification reads (DefaultStrategy's
    # key_for_gradient)
    gradient_key: ClassVar[str] = "means2d"

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        """Why ``cfg`` cannot train this kind: one message per key (empty when it can)."""
        return []

    def init(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """The kind's initial parameters from 3DGS ones (``init.init_params``)."""
        return params

    def render(self, params: dict[str, Tensor], cams: Cameras, cfg: TrainConfig,
               sh_degree: int, *, step: int | None = None, absgrad: bool = False,
               distributed: bool = False, expected_depth: bool = False) -> Render:
        """Render the model from the C cameras ``cams`` at ``sh_degree``: for training
        ``step`` (``absgrad`` on the screen-space means; ``distributed``: this rank's shard,
        as ``rasterization(distributed=True)``), or with ``step = None`` for evaluation;
        ``expected_depth``: also the expected depth, in :attr:`Render.depths` (a feature's
        loss reads it, ``Feature.needs_expected_depth``)."""
        raise NotImplementedError(f"{type(self).__name__}.render")

    def phase(self, cfg: TrainConfig, step: int) -> tuple:
        """What of the training step at ``step`` depends on ``step`` beyond the SH degree
        (which loss terms and renders are on): a CUDA graph of the step is captured again
        when it changes (``train/step/cuda_graph.py``). The base: nothing."""
        return ()

    def regularisation(self, out: Render, cfg: TrainConfig, step: int) -> Tensor | None:
        """The kind's loss terms at ``step`` on the render ``out`` (a scalar tensor), or None
        when none is active."""
        return None

    def export(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """The parameters as a 3DGS PLY holds them (tensors on the CPU, not copied when
        unchanged)."""
        return params

    def write_renders(self, folder: Path, name: str, out: Render) -> None:
        """Write the kind's own pictures of camera 0 of the evaluation render ``out`` beside
        the colour render ``folder/name`` (none for the base)."""
