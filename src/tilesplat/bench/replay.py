"""Replay of a training run: the trainer's own step on a run's checkpoint, arm by arm.

``--scene run:RUN_DIR`` names a run folder (its newest checkpoint) or one checkpoint file.
The checkpoint is loaded with ``weights_only=True`` and checked
(``train.rundir.checkpoint.open_checkpoint``); the run's config comes from the checkpoint and
its dataset is loaded as ``tilesplat train`` loads it.

- Timing: each arm gets its own copy of the model (parameters and Adam states, on the arm's
  device, with the arm's backend and backward scheme in the config) and one iteration is
  ``train.step.optimization.optimization_step``, the function ``tilesplat train`` runs: render the
  parameters as stored (means, log-scales, quaternions, opacity logits, SH DC and rest) for
  the cameras of the next training step, the photometric loss against the real images (and
  the run's regularisers), backward, fused Adam. Densification is not replayed: a strategy
  changes the Gaussian set, and every arm must time the same work. Iteration j is training
  step ``checkpoint step + j`` (its cameras, its SH degree, its learning rates).
  The per-stage timings of the bench use :class:`RunScene`: the checkpoint's Gaussians as
  the rasterizer sees them (scales, opacities after their activations, the stored SH
  coefficients) and the cameras of the first replayed step.
- Parity and self-noise: one trainer step on a fresh copy of the model per arm and pass,
  comparing the loss, every parameter gradient (under the checkpoint's names), the
  rasterizer's gradients (means2d, conics, colours, opacities), the rendered colours, the
  tile offsets (exactly) and the intersection order (reported, not gated: ties in depth
  may order either way).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..data.dataset import SceneDataset
from ..data.scenes import Scene
from ..sh_rgb import sh0_to_rgb
from ..train.config import TrainConfig
from ..train.models import model_kind
from ..train.models.base import sh_degree_at
from ..train.models.splats import PARAM_NAMES, restore_model
from ..train.rundir.checkpoint import RunCheckpoint, open_checkpoint
from ..train.rundir.scene import load_scene
from ..train.step.batch import Batch, CameraOrder, make_batch
from ..train.step.optimization import STEP_STAGES, StepPlan, optimization_step
from .arms import Arm
from .run_spec import run_target
from .stages import Inputs
from .timing import StageTimer
from .tolerance import across_devices, allowed_failures, compare, policy, summary, verdict

# warm-up passes, timed iterations per repeat and repeats of a run scene (issue 9)
RUN_DEFAULTS = {"warmup": 10, "iters": 50, "repeats": 3}
RASTER_GRADS = ("means2d", "conics", "colors", "opacities")
# the parts of the trainer's step, timed inside "step" on CPU arms (train.step.STEP_STAGES;
# on CUDA the synchronisations between parts would add to the step's host overhead)
STEP_PARTS = tuple(f"step_{s}" for s in STEP_STAGES)


@dataclass
class RunScene(Scene):
    """A run's Gaussians as the rasterizer sees them, for the bench's staged passes.

    Attributes:
        coeffs: [N, K, 3] the stored SH coefficients (DC and rest), returned by
            :meth:`sh_coeffs` instead of coefficients made up from ``colors``.
    """

    coeffs: Tensor | None = None

    def sh_coeffs(self, degree: int, seed: int = 0, rest_scale: float = 0.02) -> Tensor:
        k = (degree + 1) ** 2
        if self.coeffs is None or k > self.coeffs.shape[1]:
            raise ValueError(f"the run stores SH coefficients up to degree "
                             f"{_degree_of(self.coeffs)}, not {degree}")
        return self.coeffs[:, :k].to(self.means.dtype).clone()


def _degree_of(coeffs: Tensor | None) -> int:
    return -1 if coeffs is None else int(round(coeffs.shape[1] ** 0.5)) - 1


@dataclass
class Replay:
    """A run opened for replay: checkpoint, config, dataset, and the camera order."""

    run: RunCheckpoint
    cfg: TrainConfig
    dataset: SceneDataset
    order: CameraOrder
    background: Tensor  # [3]

    @property
    def name(self) -> str:
        return f"run:{self.run.run_dir} (step {self.run.step}, {self.run.n_gaussians} Gaussians)"

    def step_of(self, i: int) -> int:
        """The training step replayed as iteration ``i``."""
        return self.run.step + i

    def batch(self, i: int, device: torch.device | str) -> Batch:
        """The cameras and images of iteration ``i`` on ``device``; a random background is
        drawn from a generator seeded by the step, so that every arm gets the same one."""
        step = self.step_of(i)
        frames = [self.dataset.train[k] for k in self.order.indices(step)]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed * 1_000_003 + step)
            batch = make_batch(frames, self.background, self.cfg.random_background)
        return batch.to(device)

    def arm_config(self, arm: Arm) -> TrainConfig:
        """The run's config with the arm's backend and backward scheme."""
        return self.cfg.replace(backend=arm.backend, backward_scheme=arm.scheme)

    def scene(self) -> RunScene:
        """The Gaussians as the rasterizer sees them and the cameras of the first step."""
        p = {k: v.detach().float() for k, v in self.run.ckpt["params"].items()}
        b = self.batch(0, "cpu")
        return RunScene(
            name=self.name,
            means=p["means"].clone(),
            quats=torch.nn.functional.normalize(p["quats"], dim=-1),
            scales=torch.exp(p["scales"]),
            opacities=torch.sigmoid(p["opacities"]),
            colors=sh0_to_rgb(p["sh0"][:, 0]).clamp(0.0, 1.0),
            viewmats=b.viewmats,
            Ks=b.Ks,
            width=b.width,
            height=b.height,
            coeffs=torch.cat([p["sh0"], p["shN"]], dim=1),
        )

    def info(self) -> dict[str, Any]:
        """What the report says about the replayed run."""
        first = self.dataset.train[0]
        return {
            "run_dir": str(self.run.run_dir),
            "checkpoint": str(self.run.path),
            "step": self.run.step,
            "gaussians": self.run.n_gaussians,
            "batch_size": self.cfg.batch_size,
            "image_size": [first.width, first.height],
            "train_views": len(self.dataset.train),
            "strategy": self.cfg.strategy,
            "training_step": "train.step.optimization_step (render, loss vs the run's images, "
            "backward, fused Adam); densification is not replayed",
        }

    @property
    def sh_degree(self) -> int:
        """The SH degree of the first replayed step."""
        return sh_degree_at(self.cfg, self.step_of(0))


def open_run(spec: str) -> Replay:
    """Opens ``run:RUN_DIR`` (a run folder or a checkpoint file) and its dataset.

    Raises:
        FileNotFoundError: no such run, checkpoint or dataset.
        ValueError: an empty path, a checkpoint that is not a valid training checkpoint, or
            a run of another model than 3DGS.
    """
    run = open_checkpoint(run_target(spec))
    if run.cfg.model != "3dgs":  # the arms and captured gradients are the 3DGS rasterizer's
        raise ValueError(
            f"{run.run_dir}: --scene run: replays 3DGS runs; this run has "
            f"model = {run.cfg.model!r}"
        )
    dataset = load_scene(run.cfg, log=lambda _: None)
    if not dataset.train:
        raise ValueError(f"{run.run_dir}: the run's dataset has no training images")
    order = CameraOrder(len(dataset.train), run.cfg.batch_size, run.cfg.seed)
    background = torch.tensor(dataset.background, dtype=torch.float32)
    return Replay(run, run.cfg, dataset, order, background)


class ReplayStep:
    """One arm's copy of the model; each call is one trainer step, timed as ``step``."""

    def __init__(self, replay: Replay, arm: Arm) -> None:
        self.replay, self.arm = replay, arm
        self.device = arm.torch_device
        self.cfg = replay.arm_config(arm)
        self.params, self.optimizers = restore_model(replay.run.ckpt, self.cfg, self.device)
        self.plan = StepPlan(self.cfg, model_kind(self.cfg), float(replay.run.ckpt["scene_scale"]))
        self.i = 0

    def __call__(self, timer: StageTimer) -> None:
        batch = self.replay.batch(self.i, self.device)
        step = self.replay.step_of(self.i)
        parts = _Parts(timer) if self.device.type == "cpu" else None
        with timer.stage("step"):
            optimization_step(self.params, self.optimizers, batch, self.plan, step, clock=parts)
        self.i += 1


class RunWorkload:
    """A run as the bench measures it (:class:`.workload.Workload`): the staged passes on the
    checkpoint's Gaussians (:meth:`Replay.scene`) and the trainer's step per arm, with the
    run's SH degree, tile size 16 (what the trainer renders with) and :data:`RUN_DEFAULTS`."""

    counts = RUN_DEFAULTS

    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def settings(self, sh_degree: int, tile_size: int) -> tuple[int, int]:
        return self.replay.sh_degree, 16

    def load(self, dtype: torch.dtype) -> Scene:
        return self.replay.scene().to(dtype=dtype)

    def make_step(self, inp: Inputs, arm: Arm) -> ReplayStep:
        return ReplayStep(self.replay, arm)

    def step_parts(self, arms: list[Arm]) -> tuple[str, ...]:
        # the trainer step's render, loss, backward, Adam: timed apart on CPU arms only
        return STEP_PARTS if all(a.torch_device.type == "cpu" for a in arms) else ()

    def scene_info(self) -> dict[str, Any]:
        return {"run": self.replay.info()}


class _Parts:
    """Times the trainer step's parts as ``step_render``, ``step_loss``, ... on ``timer``."""

    def __init__(self, timer: StageTimer) -> None:
        self.timer = timer

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.timer.stage(f"step_{name}")


def trainer_pass(replay: Replay, arm: Arm, i: int = 0) -> dict[str, Any]:
    """One trainer step of iteration ``i`` on a fresh copy of the model; what parity compares.

    Returns:
        dict with ``outputs`` (loss [1], render_colors [C,H,W,3], isect_offsets [C,TH,TW],
        flatten_ids [n]) and ``grads`` (``v_`` + each parameter name of the checkpoint, and
        ``v_raster_`` + means2d [C,N,2], conics [C,N,3], colors [C,N,3], opacities [C,N]),
        all on the CPU.
    """
    cfg = replay.arm_config(arm)
    params, optimizers = restore_model(replay.run.ckpt, cfg, arm.torch_device)
    captured: dict[str, Any] = {}

    def keep_raster_grads(step: int, info: dict[str, Any]) -> None:
        for k in RASTER_GRADS:
            info[k].retain_grad()

    def capture(step: int, info: dict[str, Any]) -> None:
        for k in PARAM_NAMES:
            captured[f"v_{k}"] = _cpu(params[k].grad, params[k])
        for k in RASTER_GRADS:
            captured[f"v_raster_{k}"] = _cpu(info[k].grad, info[k])

    plan = StepPlan(cfg, model_kind(cfg), float(replay.run.ckpt["scene_scale"]),
                    before_backward=keep_raster_grads, after_backward=capture)
    res = optimization_step(params, optimizers, replay.batch(i, arm.torch_device), plan,
                            replay.step_of(i))
    outputs = {
        "loss": res.loss.reshape(1).cpu(),
        "render_colors": res.colors.cpu(),
        "isect_offsets": res.info["isect_offsets"].cpu(),
        "flatten_ids": res.info["flatten_ids"].cpu(),
    }
    return {"outputs": outputs, "grads": captured}


def _cpu(grad: Tensor | None, like: Tensor) -> Tensor:
    g = grad if grad is not None else torch.zeros_like(like)
    return g.detach().cpu().clone()


# --- parity and self-noise on a run ---------------------------------------------------------


def compare_passes(res_a: dict[str, Any], res_b: dict[str, Any], atol: float,
                   rtol: float, cross_device: bool = False) -> list[dict[str, Any]]:
    """One row per compared tensor of two trainer passes, under the parity policy of
    :mod:`.tolerance` (failing elements allowed per tensor across device types; tile offsets
    exact); the intersection-order row is reported and not gated."""
    rows = []
    for kind, group in (("output", "outputs"), ("gradient", "grads")):
        for name, a in res_a[group].items():
            b = res_b[group].get(name)
            if b is None:
                row = {"name": name, "kind": kind, "passed": False, "note": "missing in one arm"}
            elif name == "flatten_ids":
                row = {"name": "intersection order (flatten_ids)", "kind": kind,
                       **_order_row(a, b)}
            elif name == "isect_offsets":  # integers: exactly, on any devices
                row = {"name": name, "kind": kind, **compare(a, b, atol=0.0, rtol=0.0)}
            else:
                allowed = allowed_failures(name, a.numel(), cross_device)
                row = {"name": name, "kind": kind, **compare(a, b, atol, rtol, allowed)}
            row["verdict"] = verdict(row)
            rows.append(row)
    return rows


def _order_row(a: Tensor, b: Tensor) -> dict[str, Any]:
    """The intersection order, reported and not gated (ties in depth may order either way)."""
    row: dict[str, Any] = {"numel_a": int(a.numel()), "numel_b": int(b.numel()),
                           "shape_a": list(a.shape), "shape_b": list(b.shape),
                           "max_abs": None, "max_rel": None, "max_rel_where_abs_fails": None,
                           "gated": False, "passed": True}
    if a.shape != b.shape:
        row.update(n_fail=None, note="lengths differ")
        return row
    moved = int((a != b).sum())
    row.update(n_fail=moved, note=f"{moved} of {a.numel()} positions differ")
    return row


def run_parity_on_run(replay: Replay, arm_a: Arm, arm_b: Arm, atol: float, rtol: float,
                      hook: Any = None) -> dict[str, Any]:
    """Parity of two arms on one trainer step of the run (see the module docstring)."""
    results = []
    for arm in (arm_a, arm_b):
        res = trainer_pass(replay, arm)
        if hook is not None:
            hook(arm.spec, res)
        results.append(res)
    across = across_devices(arm_a, arm_b)
    rows = compare_passes(results[0], results[1], atol, rtol, cross_device=across)
    return {
        "kind": "parity",
        "arms": [arm_a.spec, arm_b.spec],
        "scene": replay.name,
        "sh_degree": replay.sh_degree,
        "atol": atol,
        "rtol": rtol,
        "cross_device": across,
        "policy": policy(across),
        "elements_compared": sum(r.get("numel_a", 0) for r in rows if r.get("gated", True)),
        "tensors": rows,
        "summary": summary(rows),
        "passed": all(r["passed"] for r in rows if r.get("gated", True)),
    }


def run_self_noise_on_run(replay: Replay, arms: list[Arm], k: int,
                          hook: Any = None) -> dict[str, Any]:
    """K trainer passes of each arm, each on a fresh copy of the model: per gradient (and
    the loss), the max difference to the first pass."""
    if k < 2:
        raise ValueError(f"self-noise needs K >= 2 passes, got {k}")
    out = []
    for arm in arms:
        first: dict[str, Tensor] = {}
        rows: dict[str, dict[str, Any]] = {}
        for _ in range(k):
            res = trainer_pass(replay, arm)
            if hook is not None:
                hook(arm.spec, res)
            got = {"loss": res["outputs"]["loss"], **res["grads"]}
            if not first:
                first = got
                rows = {n: {"max_abs": 0.0, "max_rel": 0.0, "bitwise_identical": True}
                        for n in got}
                continue
            for name, g in got.items():
                c = compare(first[name], g, atol=0.0, rtol=0.0)
                r = rows[name]
                r["max_abs"] = max(r["max_abs"], c["max_abs"] or 0.0)
                r["max_rel"] = max(r["max_rel"], c["max_rel"] or 0.0)
                r["bitwise_identical"] &= bool(torch.equal(first[name], g))
        out.append({"arm": arm.spec, "passes": k, "grads": rows,
                    "max_rel": max(r["max_rel"] for r in rows.values()),
                    "bitwise_identical": all(r["bitwise_identical"] for r in rows.values())})
    return {"kind": "self_noise", "scene": replay.name, "passes": k,
            "sh_degree": replay.sh_degree, "arms": out}
