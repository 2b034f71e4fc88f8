"""Pose refinement (``pose_opt = true``): a learned SE(3) correction of each training camera.

The design of gsplat's ``CameraOptModule`` (its simple trainer's ``pose_opt``): one correction
per training image, zero at the start (the given pose), its own Adam with weight decay
``pose_opt_reg`` pulling it back to the given pose, its rate ``pose_opt_lr`` times
sqrt(batch_size) decaying exponentially to 1 % by the last step. The correction of camera i
is ``D_i = [R(w_i) | t_i]``, a rotation by the axis-angle vector ``w_i`` and a translation
``t_i``, both in the camera's own frame: the step renders ``D_i @ viewmat_i`` (world-to-camera).
Its gradient comes through the rasterizer's ``viewmats`` gradient, which every backend
computes (``torch``, ``cpu`` and ``cuda``: the projection's VJP returns ``v_viewmats``).

Two departures from gsplat, both measured on the room capture (docs/training.md):

- **The rate scales with the run**: ``pose_opt_lr`` is the rate for a run of
  ``pose_opt_lr_steps`` steps (30,000, gsplat's), multiplied by ``pose_opt_lr_steps / steps``
  (at most 100: a run under 300 steps gets the 300-step rate).
  How far Adam can move a camera is about rate x steps, and how far it must move does not
  depend on the run's length: gsplat's 1e-5 moved the cameras too little in 300 steps
  (mean error 0.76 -> 0.62 degrees at 1.5e-4); the scaled 1e-3 moves them 0.76 -> 0.33.
- **The mean correction is removed** after every step (``pose_opt_zero_mean``, in the
  cameras' own frames): the fit pulls every camera the same way, a pitch about its own x
  axis with a shift down and forward, from perfect poses too (0.28 degrees at 1e-3 and
  0.6 dB lost). The pull is no wrong gradient (the reference's ``viewmats`` gradient is the
  float64 finite difference) and no pixel-centre offset (rolled 180 degrees, with the images
  turned, every camera is pulled the other way in its own frame: the pull follows the
  scene, not the image axes; every camera sees the floor below): it is the model's bias,
  which a shared correction would learn as pose error. Independent pose errors have a zero
  mean; what the removal leaves of them is their sample mean (about their size /
  sqrt(N)). The removal also holds the scene from drifting as a whole along the ring's
  shared directions (its scale, its turn about the vertical).

Where it runs: on the training device, a [N, 6] tensor and a 4x4 product per camera of the
step, nothing per Gaussian. In a data-parallel job (``parallel = "data"``) each rank renders
its share of the batch, so the corrections' gradients are averaged over the ranks (as the
Gaussians' are) before every rank takes the same Adam step. A model-parallel job is refused:
each rank there projects its shard into every camera, so each rank would hold only a part of
a camera's gradient and would need its own reduction, which is not built.

What it writes: ``poses.json`` in the run folder (:func:`write_poses`), the refined and the
given world-to-camera matrix of every training image, by name. ``tilesplat render`` and
``tilesplat eval`` of the training views use the refined poses of the run's checkpoint
(:meth:`PoseRefinement.trained_views`); test views keep their given poses, as gsplat's
evaluation does, unless test-time alignment is asked for (``test_pose_align_steps``,
:mod:`.pose_align`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ...io.atomic import atomic_write_bytes
from ...keys import Key
from .base import Feature, register_feature, restore_learned

if TYPE_CHECKING:
    from ...data.dataset import SceneDataset
    from ..config import TrainConfig
    from ..models.base import Cameras

POSES_FILE = "poses.json"
POSES_FORMAT = "tilesplat-poses-1"
FINAL_LR_FACTOR = 0.01  # gsplat: ExponentialLR with gamma = 0.01 ** (1 / max_steps)


def axis_angle_to_matrix(w: Tensor) -> Tensor:
    """Rotation matrices [N, 3, 3] of axis-angle vectors ``w`` [N, 3] (Rodrigues' formula).

    Near zero angle the coefficients sin(a)/a and (1 - cos(a))/a^2 take their Taylor series,
    so that the value and the gradient at w = 0 (where every correction starts) are exact.
    """
    a2 = (w * w).sum(-1, keepdim=True)[..., None]  # [N, 1, 1]
    small = a2 < 1e-8
    safe = torch.where(small, torch.ones_like(a2), a2)
    a = safe.sqrt()
    s = torch.where(small, 1.0 - a2 / 6.0, torch.sin(a) / a)
    c = torch.where(small, 0.5 - a2 / 24.0, (1.0 - torch.cos(a)) / safe)
    zero = torch.zeros_like(w[:, 0])
    k = torch.stack([zero, -w[:, 2], w[:, 1],
                     w[:, 2], zero, -w[:, 0],
                     -w[:, 1], w[:, 0], zero], dim=-1).reshape(-1, 3, 3)  # [w]x
    eye = torch.eye(3, dtype=w.dtype, device=w.device).expand_as(k)
    return eye + s * k + c * (k @ k)


def correction_matrices(deltas: Tensor) -> Tensor:
    """[N, 4, 4] corrections ``[R(w) | t]`` of ``deltas`` [N, 6] = (t [3], w [3])."""
    n = deltas.shape[0]
    out = torch.zeros((n, 4, 4), dtype=deltas.dtype, device=deltas.device)
    out[:, :3, :3] = axis_angle_to_matrix(deltas[:, 3:])
    out[:, :3, 3] = deltas[:, :3]
    out[:, 3, 3] = 1.0
    return out


# the most the run-length scaling multiplies the rate by: a run shorter than
# pose_opt_lr_steps / MAX_SCALE (300 steps by default) gets the rate of that length, not one
# that grows without bound (a 12-step run would get 2,500 x gsplat's)
MAX_SCALE = 100.0


def lr_of(cfg: TrainConfig) -> float:
    """The corrections' first-step rate: ``pose_opt_lr * sqrt(batch_size)``, times
    ``pose_opt_lr_steps / steps`` (at most MAX_SCALE) unless ``pose_opt_lr_steps`` is 0."""
    scale = min(cfg.pose_opt_lr_steps / cfg.steps, MAX_SCALE) if cfg.pose_opt_lr_steps else 1.0
    return cfg.pose_opt_lr * math.sqrt(cfg.batch_size) * scale


def _write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode("utf-8"))


def write_poses(path: Path, names: list[str], refined: Tensor, given: Tensor) -> Path:
    """Write ``poses.json``: ``format``, ``convention`` and per training image its ``name``,
    ``viewmat`` (refined) and ``given_viewmat``, [4, 4] world-to-camera in OpenCV axes (the
    frames' convention, ``data/frames.py``) as nested lists. Atomic. Returns ``path``."""
    frames = [{"name": n, "viewmat": r.tolist(), "given_viewmat": g.tolist()}
              for n, r, g in zip(names, refined.double(), given.double(), strict=True)]
    _write_json(path, {
        "format": POSES_FORMAT,
        "convention": "world-to-camera 4x4, OpenCV axes (x right, y down, z forward)",
        "frames": frames,
    })
    return path


@register_feature
class PoseRefinement(Feature):
    """Per-training-camera SE(3) corrections (``pose_opt``), see the module docstring.

    Attributes:
        deltas: [N, 6] the corrections (t, w) of the N training images, a leaf tensor.
        given: [N, 4, 4] the given world-to-camera matrices (float32, CPU).
    """

    name = "pose_opt"
    SWITCH = "pose_opt"
    WHOLE_MODEL = "each rank would hold a part of every camera's gradient"
    KEYS: ClassVar[tuple[Key, ...]] = (
        Key("pose_opt", False, "learn an SE(3) correction of each training camera's pose "
            "(gsplat's pose_opt); the refined poses go to RUN/poses.json and serve render/eval "
            "of the training views"),
        Key("pose_opt_lr", 1e-5, "pose_opt: Adam learning rate of the corrections for a run "
            "of pose_opt_lr_steps steps (times sqrt(batch_size); decays to 1 % by the last step), "
            "gsplat's default", ge=0.0),
        Key("pose_opt_lr_steps", 30_000, "pose_opt: the run length pose_opt_lr is meant for "
            "(gsplat's 30,000 steps): the rate is scaled by pose_opt_lr_steps / steps, so that "
            "a run of any length can move the cameras as far (at most 100x); 0: not scaled", ge=0),
        Key("pose_opt_reg", 1e-6, "pose_opt: Adam weight decay of the corrections, gsplat's "
            "default", ge=0.0),
        Key("pose_opt_zero_mean", True, "pose_opt: remove the mean correction (in the cameras' "
            "own frames) after every step, so that a pull all cameras share is not learned"),
    )

    def __init__(self, cfg: TrainConfig, dataset: SceneDataset, device: torch.device) -> None:
        self.names = [f.name for f in dataset.train]
        self.given = torch.stack([f.viewmat.float() for f in dataset.train])
        self.deltas = torch.zeros((len(self.names), 6), device=device, requires_grad=True)
        self.base_lr = lr_of(cfg)
        self.gamma = FINAL_LR_FACTOR ** (1.0 / cfg.steps)
        self.optimizer = torch.optim.Adam([self.deltas], lr=self.base_lr,
                                          weight_decay=cfg.pose_opt_reg)
        self.zero_mean = cfg.pose_opt_zero_mean and len(self.names) > 1

    # --- the step ------------------------------------------------------------------------

    def cameras(self, batch: Cameras, step: int) -> Cameras:
        """The batch with each camera's correction applied: ``D_i @ viewmat_i``."""
        views = getattr(batch, "views", None)
        if views is None:
            return batch
        fix = correction_matrices(self.deltas[views])
        return dataclasses.replace(batch, viewmats=fix @ batch.viewmats)

    def parameters(self) -> list[Tensor]:
        """The corrections (each rank of a data-parallel job renders its share of the batch:
        their gradients are averaged over the ranks, as the Gaussians' are)."""
        return [self.deltas]

    def optimizer_step(self, step: int) -> None:
        """One Adam step at the rate of ``step`` (:func:`lr_of` times ``gamma ** step``), then
        the mean correction removed (``pose_opt_zero_mean``)."""
        if self.deltas.grad is None:
            return
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self.gamma**step
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.zero_mean:
            with torch.no_grad():
                self.deltas -= self.deltas.mean(0, keepdim=True)

    # --- what it learned -----------------------------------------------------------------

    def refined_viewmats(self) -> Tensor:
        """[N, 4, 4] float32 on the CPU: the training images' refined world-to-camera."""
        with torch.no_grad():
            fix = correction_matrices(self.deltas.detach().double().cpu())
            return (fix @ self.given.double()).float()

    def state_dict(self) -> dict[str, Any]:
        adam = self.optimizer.state_dict()
        state = {k: {n: v.detach().cpu().clone() if isinstance(v, Tensor) else v
                     for n, v in s.items()} for k, s in adam["state"].items()}
        return {"deltas": self.deltas.detach().cpu().clone(),
                "adam": {"state": state, "param_groups": adam["param_groups"]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_learned("pose_opt: the corrections", self.deltas, state.get("deltas"),
                        self.optimizer, state.get("adam"))

    def write(self, run_dir: Path) -> None:
        """``run_dir/poses.json`` (:func:`write_poses`)."""
        write_poses(Path(run_dir) / POSES_FILE, self.names, self.refined_viewmats(), self.given)

    def trained_views(self, dataset: SceneDataset) -> SceneDataset:
        """``dataset`` with its training frames at their refined poses (test frames as
        given)."""
        refined = self.refined_viewmats()
        train = [dataclasses.replace(f, viewmat=v) for f, v in zip(dataset.train, refined,
                                                                   strict=True)]
        return dataclasses.replace(dataset, train=train)
