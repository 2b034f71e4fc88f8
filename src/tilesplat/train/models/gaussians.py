"""3D Gaussians (``model = "3dgs"``, Kerbl et al. 2023), as gsplat's simple trainer renders them
with :func:`tilesplat.rasterization`: the base model kind, no extra loss terms or pictures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from ...rendering import rasterization
from .. import seams
from ..splats import Params, activated
from .base import ModelKind, Render

if TYPE_CHECKING:
    from ..config import TrainConfig


def render_splats(
    params: Params | dict[str, Tensor],
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    cfg: TrainConfig,
    sh_degree: int,
    backgrounds: Tensor | None = None,  # [C, 3]
    absgrad: bool = False,
    distributed: bool = False,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Render the model from C cameras (with ``distributed``: this rank's shard of the
    Gaussians from this rank's cameras, every rank's shards composited, as
    ``rasterization(distributed=True)``).

    Returns:
        colors [C, H, W, 3] (not clamped above 1), alphas [C, H, W, 1], and the rasterizer's
        meta dict (``means2d``, ``radii``, ``gaussian_ids``, ``width``, ``height``, ...).
    """
    return rasterization(
        **activated(params),
        viewmats=viewmats,
        Ks=Ks,
        width=width,
        height=height,
        near_plane=cfg.near_plane,
        far_plane=cfg.far_plane,
        sh_degree=sh_degree,
        packed=cfg.packed,
        absgrad=absgrad,
        rasterize_mode="antialiased" if cfg.antialiased else "classic",
        backgrounds=backgrounds,
        backend=cfg.backend,
        backward_scheme=cfg.backward_scheme,
        distributed=distributed,
    )


@seams.register("model", "3dgs")
class Gaussians(ModelKind):
    """3D Gaussians: rendered by :func:`render_splats`, densified on ``means2d``."""

    def render(
        self,
        params: dict[str, Tensor],
        viewmats: Tensor,  # [C, 4, 4]
        Ks: Tensor,  # [C, 3, 3]
        width: int,
        height: int,
        cfg: TrainConfig,
        sh_degree: int,
        backgrounds: Tensor | None = None,  # [C, 3]
        *,
        step: int | None = None,
        absgrad: bool = False,
        distributed: bool = False,
    ) -> Render:
        """:func:`render_splats` (the same for training and evaluation)."""
        colors, alphas, info = render_splats(
            params, viewmats, Ks, width, height, cfg, sh_degree, backgrounds=backgrounds,
            absgrad=absgrad, distributed=distributed,
        )  # fmt: skip
        return Render(colors, alphas, info)
