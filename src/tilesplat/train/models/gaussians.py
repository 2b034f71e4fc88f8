"""3D Gaussians (``model = "3dgs"``, Kerbl et al. 2023), as gsplat's simple trainer renders them
with :func:`tilesplat.rasterization`: the base model kind, no extra loss terms or pictures."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from ...rendering import rasterization
from .. import seams
from .base import Cameras, ModelKind, Render, lens_args, render_args
from .splats import activated

if TYPE_CHECKING:
    from ..config import TrainConfig


@seams.register("model", "3dgs")
class Gaussians(ModelKind):
    """3D Gaussians: rendered by :func:`tilesplat.rasterization` (``distributed``: this
    rank's shard from this rank's cameras, every rank's shards composited), densified on
    ``means2d``."""

    def render(self, params: dict[str, Tensor], cams: Cameras, cfg: TrainConfig,
               sh_degree: int, *, step: int | None = None, absgrad: bool = False,
               distributed: bool = False, expected_depth: bool = False) -> Render:
        """:func:`tilesplat.rasterization` of the activated parameters (the same for
        training and evaluation; ``RGB+ED`` with ``expected_depth``; through the cameras'
        lens by 3DGUT when they have one, :func:`.base.lens_args`); the colours are not
        clamped above 1."""
        colors, alphas, info = rasterization(
            **activated(params, split_sh=True),
            **render_args(cams, cfg, sh_degree),
            absgrad=absgrad,
            rasterize_mode="antialiased" if cfg.antialiased else "classic",
            backward_scheme=cfg.backward_scheme,
            distributed=distributed,
            camera_model=cams.camera_model,
            render_mode="RGB+ED" if expected_depth else "RGB",
            **lens_args(cams),
        )
        if expected_depth:
            return Render(colors[..., :3], alphas, info, depths=colors[..., 3:4])
        return Render(colors, alphas, info)
