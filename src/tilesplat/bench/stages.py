"""The measured pipeline: one staged forward + backward pass, and one full training step.

The staged pass calls the public ops the way ``rasterization()`` does (unpacked) and cuts the
autograd graph between stages, so that each backward stage is timed on its own:

- ``projection``: ``fully_fused_projection`` + ``spherical_harmonics`` (colour = SH + 0.5,
  clamped at 0, as in ``rasterization``), opacities broadcast to the cameras;
- ``intersection``: ``isect_tiles_tight`` (count, fill, sort; rasterization()'s lists, the
  tiles each Gaussian's alpha-threshold ellipse reaches) + ``isect_offset_encode``;
- ``raster_forward`` / ``raster_backward``: ``rasterize_to_pixels`` on detached leaves, and its
  backward under the shared upstream gradient;
- ``projection_backward``: the backward of the projection stage (projection and SH) from the
  rasterizer's gradients to the Gaussians' parameters.

The training step is ``rasterization()`` forward, the same upstream gradient, backward, and an
Adam step (the trainer's ``FusedAdam``) over means, quats, log-scales, logit-opacities and SH
coefficients (the parametrisation a trainer uses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..data.scenes import Scene
from ..devices import to_device
from ..ops import (
    fully_fused_projection,
    isect_offset_encode,
    isect_tiles_tight,
    rasterize_to_pixels,
    spherical_harmonics,
)
from ..optimizers.fused_adam import FusedAdam
from ..rendering import rasterization
from .arms import Arm
from .timing import StageTimer

STAGES = (
    "projection",
    "intersection",
    "raster_forward",
    "raster_backward",
    "projection_backward",
)
STAGE_TITLES = {
    "projection": "projection (+SH)",
    "intersection": "intersection+sort",
    "raster_forward": "raster forward",
    "raster_backward": "raster backward",
    "projection_backward": "projection backward",
    "step": "training step",
}
PARAMS = ("means", "quats", "scales", "opacities", "sh_coeffs")


@dataclass
class Inputs:
    """One arm's copy of the scene on its device.

    Attributes:
        params: leaf values ``means`` [N,3], ``quats`` [N,4], ``scales`` [N,3],
            ``opacities`` [N], ``sh_coeffs`` [N,K,3] (no grad; each pass makes its own leaves).
        viewmats: [C,4,4]; Ks: [C,3,3].
        v_render_colors: [C,H,W,3] and v_render_alphas: [C,H,W,1]: the shared upstream gradient.
    """

    params: dict[str, Tensor]
    viewmats: Tensor
    Ks: Tensor
    width: int
    height: int
    sh_degree: int
    tile_size: int
    v_render_colors: Tensor
    v_render_alphas: Tensor


def upstream_gradient(scene: Scene, seed: int) -> tuple[Tensor, Tensor]:
    """The shared random upstream gradient (CPU): colours [C,H,W,3] and alphas [C,H,W,1]."""
    g = torch.Generator().manual_seed(seed)
    c, h, w = scene.viewmats.shape[0], scene.height, scene.width
    v_colors = torch.randn((c, h, w, 3), generator=g, dtype=torch.float64)
    v_alphas = torch.randn((c, h, w, 1), generator=g, dtype=torch.float64)
    return v_colors.to(scene.means.dtype), v_alphas.to(scene.means.dtype)


def make_inputs(scene: Scene, arm: Arm, sh_degree: int, tile_size: int,
                upstream: tuple[Tensor, Tensor]) -> Inputs:
    """Copies the scene, its SH coefficients and the upstream gradient to ``arm``'s device
    (:attr:`.arms.Arm.torch_device`)."""
    dev = arm.torch_device
    params = to_device({
        "means": scene.means.clone(),
        "quats": scene.quats.clone(),
        "scales": scene.scales.clone(),
        "opacities": scene.opacities.clone(),
        "sh_coeffs": scene.sh_coeffs(sh_degree),
    }, dev)
    viewmats, Ks, v_colors, v_alphas = to_device(
        (scene.viewmats.clone(), scene.Ks.clone(), *upstream), dev)
    return Inputs(params, viewmats, Ks, scene.width, scene.height, sh_degree, tile_size,
                  v_colors, v_alphas)


def staged_pass(inp: Inputs, arm: Arm, timer: StageTimer,
                feed: dict[str, Any] | None = None) -> dict[str, Any]:
    """One forward + backward pass, stage by stage, timed by ``timer``.

    With ``feed`` (the result of another arm's pass; used by parity) every stage sees that
    arm's inputs: intersection and rasterization run on its projection outputs, and the
    projection backward on its rasterizer gradients. So each op is compared on identical
    inputs, and a one-ulp difference at a ``ceil`` (a radius one pixel larger) does not
    cascade into every tensor downstream. The fed tensors are moved to this arm's device
    first (the other arm may run on another one: ``cpu`` against ``cuda``).

    Returns:
        dict with ``outputs`` (render_colors [C,H,W,3], render_alphas [C,H,W,1], radii [C,N,2],
        means2d [C,N,2], depths [C,N], conics [C,N,3], colors [C,N,3], isect_ids [n],
        flatten_ids [n], isect_offsets [C,TH,TW]) and ``grads`` (``v_`` + each of PARAMS, and
        the rasterizer's v_means2d, v_conics, v_colors, v_opacities [C,N]).
    """
    b, dev = arm.backend, arm.torch_device
    W, H, ts = inp.width, inp.height, inp.tile_size
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inp.params.items()}
    viewmats, Ks = inp.viewmats, inp.Ks
    C, N = viewmats.shape[0], leaves["means"].shape[0]
    with timer.stage("projection"):
        radii, means2d, depths, conics, _ = fully_fused_projection(
            leaves["means"], None, leaves["quats"], leaves["scales"], viewmats, Ks, W, H,
            packed=False, opacities=leaves["opacities"], backend=b,
        )
        campos = torch.linalg.inv_ex(viewmats).inverse[:, :3, 3]  # [C, 3], no device read
        dirs = leaves["means"][None, :, :] - campos[:, None, :]  # [C, N, 3]
        sh = leaves["sh_coeffs"][None]  # [1, N, K, 3]: shared by the cameras, as rasterization
        colors = spherical_harmonics(
            inp.sh_degree, dirs, sh, masks=(radii > 0).all(dim=-1), backend=b
        )
        colors = torch.clamp_min(colors + 0.5, 0.0)  # [C, N, 3]
        opacities = leaves["opacities"][None].expand(C, N)  # [C, N]
    own = {"radii": radii, "means2d": means2d, "depths": depths, "conics": conics,
           "colors": colors}
    if feed is not None:
        radii, means2d, depths, conics, colors = to_device(
            [feed["outputs"][k] for k in ("radii", "means2d", "depths", "conics", "colors")], dev)
    tw, th = math.ceil(W / ts), math.ceil(H / ts)
    with timer.stage("intersection"):
        _, isect_ids, flatten_ids = isect_tiles_tight(
            means2d, radii, depths, conics.detach(), opacities.detach(), ts, tw, th, W, H,
            packed=False, n_images=C, backend=b
        )
        isect_offsets = isect_offset_encode(isect_ids, C, tw, th, backend=b)
    cut = {
        "means2d": means2d.detach().requires_grad_(True),
        "conics": conics.detach().requires_grad_(True),
        "colors": colors.detach().requires_grad_(True),
        "opacities": opacities.detach().requires_grad_(True),
    }
    with timer.stage("raster_forward"):
        render_colors, render_alphas = rasterize_to_pixels(
            cut["means2d"], cut["conics"], cut["colors"], cut["opacities"], W, H, ts,
            isect_offsets, flatten_ids, backend=b, backward_scheme=arm.scheme,
        )
    with timer.stage("raster_backward"):
        torch.autograd.backward(
            [render_colors, render_alphas], [inp.v_render_colors, inp.v_render_alphas]
        )
    upstream = [_grad(cut[k]) for k in ("means2d", "conics", "colors", "opacities")]
    if feed is not None:
        upstream = to_device([feed["grads"][k] for k in ("v_means2d", "v_conics", "v_colors",
                                                         "v_raster_opacities")], dev)
    with timer.stage("projection_backward"):
        torch.autograd.backward(
            [own["means2d"], own["conics"], own["colors"], opacities], upstream
        )
    grads = {f"v_{k}": _grad(v) for k, v in leaves.items()}
    grads.update({f"v_{k}" if k != "opacities" else "v_raster_opacities": _grad(v)
                  for k, v in cut.items()})
    outputs = {
        "render_colors": render_colors.detach(),
        "render_alphas": render_alphas.detach(),
        "radii": own["radii"],
        "means2d": own["means2d"].detach(),
        "depths": own["depths"].detach(),
        "conics": own["conics"].detach(),
        "colors": own["colors"].detach(),
        "isect_ids": isect_ids,
        "flatten_ids": flatten_ids,
        "isect_offsets": isect_offsets,
    }
    return {"outputs": outputs, "grads": grads}


def _grad(t: Tensor) -> Tensor:
    return t.grad if t.grad is not None else torch.zeros_like(t)


class TrainStep:
    """A trainer's step on one arm: rasterization() forward, backward and Adam.

    The parameters live in the trainer's space, by its names (``scales`` as logs,
    ``opacities`` as logits, SH DC and rest bands as two groups ``sh0`` and ``shN``), each
    Adam group with gsplat's default learning rate.
    """

    LRS = {"means": 1.6e-4, "quats": 1e-3, "scales": 5e-3, "opacities": 5e-2,
           "sh0": 2.5e-3, "shN": 2.5e-3 / 20}

    def __init__(self, inp: Inputs, arm: Arm) -> None:
        self.inp, self.arm = inp, arm
        p = inp.params
        self.params = {
            "means": p["means"].clone(),
            "quats": p["quats"].clone(),
            "scales": torch.log(p["scales"]),
            "opacities": torch.logit(p["opacities"]),
            "sh0": p["sh_coeffs"][:, :1].clone(),
            "shN": p["sh_coeffs"][:, 1:].clone(),
        }
        for t in self.params.values():
            t.requires_grad_(True)
        self.optimizer = FusedAdam(  # as the trainer: torch's fused kernel
            [{"params": [t], "lr": self.LRS[k], "name": k} for k, t in self.params.items()],
            eps=1e-15,
        )

    def __call__(self, timer: StageTimer) -> None:
        p, inp = self.params, self.inp
        with timer.stage("step"):
            self.optimizer.zero_grad(set_to_none=True)
            render_colors, render_alphas, _ = rasterization(
                p["means"], p["quats"], torch.exp(p["scales"]),
                torch.sigmoid(p["opacities"]), torch.cat([p["sh0"], p["shN"]], dim=1),
                inp.viewmats, inp.Ks, inp.width, inp.height, sh_degree=inp.sh_degree,
                packed=False, tile_size=inp.tile_size, backend=self.arm.backend,
                backward_scheme=self.arm.scheme,
            )
            loss = (render_colors * inp.v_render_colors).sum() + (
                render_alphas * inp.v_render_alphas
            ).sum()
            loss.backward()
            self.optimizer.step()
