"""The training configuration: one dataclass for TOML files, ``--set`` flags and saved runs.

Every field has a default and a help string (``field.metadata["help"]``). A TOML file holds
``key = value`` lines at the top level (the file a run saves is one, with the help strings as
comments). Unknown keys are rejected with the closest valid name.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from ..constants import BACKENDS, BACKWARD_SCHEMES
from ..ranks import DIST_BACKENDS
from . import seams
from .recipes import RECIPES, recipe_keys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

INITS = ("auto", "points", "random")
# The keys that choose a variant (model kind, strategy, parallel mode): their values are the
# names registered behind the seam (seams.py), and each variant checks its own keys.
# A field set to AUTO takes the value of its strategy (see TrainConfig.resolved): the
# strategy class's CONFIG_DEFAULTS (3DGS's for default, 3DGS-MCMC's for mcmc).
AUTO = -1.0
DEVICES = ("auto", "cpu", "cuda")
CUDA_INDEX = re.compile(r"^cuda:(\d+)$")


def device_format_error(device: str) -> str | None:
    """Why ``device`` is not a valid value of the key (None when it is)."""
    if device in DEVICES or CUDA_INDEX.match(device):
        return None
    return f"device must be one of {list(DEVICES)} or 'cuda:N' (N >= 0), got {device!r}"


def is_cuda_name(device: str) -> bool:
    """Whether ``device`` names a GPU (``cuda`` or ``cuda:N``)."""
    return device == "cuda" or bool(CUDA_INDEX.match(device))


def _f(default: Any, help: str, group: str, choices: tuple[str, ...] | None = None,
       seam: str | None = None) -> Any:
    return field(default=default,
                 metadata={"help": help, "group": group, "choices": choices, "seam": seam})


def _choices(f: dataclasses.Field) -> tuple[str, ...] | None:
    """The valid values of field ``f``: its own, or the names behind its seam."""
    return seams.names(f.metadata["seam"]) if f.metadata["seam"] else f.metadata["choices"]


@dataclass
class TrainConfig:
    """Everything that decides a training run. See ``docs/training.md`` for the recipe."""

    # --- data ---
    data: str = _f(
        "",
        "dataset folder (Blender / NeRF-synthetic or COLMAP layout); empty: the built-in "
        "synthetic scene, generated once into the cache folder",
        "data",
    )
    downscale: int = _f(1, "integer factor dividing the image size", "data")
    white_background: bool = _f(
        True, "composite RGBA images on white (else black); Blender layout only", "data"
    )
    test_every: int = _f(
        -1,
        "every n-th image (by name) is a test image; 0: none; -1: the dataset's own split "
        "(Blender's test file, nerfstudio's lists or 90/10 split), else every 8th",
        "data",
    )
    masks_dir: str = _f(
        "",
        "folder of training masks, <image name>.png, black where a pixel is ignored by the "
        "loss, densification and metrics; empty: the dataset's own (COLMAP's masks/, "
        "nerfstudio's mask_path) (docs/data.md)",
        "data",
    )
    synthetic_scene: str = _f(
        "raycast",
        "built-in scene (with data empty): raycast (a textured object ray cast in NumPy, "
        "Blender layout) or garden (the bundled Mip-NeRF 360 garden Gaussians rendered along "
        "a path near its cameras, COLMAP layout with initial points; synthetic_train + "
        "synthetic_test views of 324x210, split by test_every) or exposure (the raycast "
        "scene on grey, each training photo with a gain of x0.6-1.5 and a +-0.05 offset per "
        "channel, the test views without: data/exposure.py)",
        "data",
        ("raycast", "garden", "exposure"),
    )
    synthetic_size: int = _f(200, "built-in scene: image width and height in pixels", "data")
    synthetic_train: int = _f(100, "built-in scene: number of training views", "data")
    synthetic_test: int = _f(20, "built-in scene: number of test views", "data")
    cache_dir: str = _f(
        "",
        "folder for generated data; empty: $XDG_CACHE_HOME/tilesplat or ~/.cache/tilesplat",
        "data",
    )

    # --- run ---
    run_dir: str = _f(
        "", "output folder of the run; empty: runs/<scene name> (numbered when it exists)", "run"
    )
    seed: int = _f(0, "seed of every random choice (initialisation, camera order, noise)", "run")
    steps: int = _f(3000, "number of optimisation steps", "run")
    batch_size: int = _f(
        1, "cameras per step; learning rates scale by sqrt(batch_size) as in gsplat", "run"
    )
    parallel: str = _f(
        "none",
        "training across processes (tilesplat train --nproc N, or torchrun): none; data "
        "(every rank holds all Gaussians and renders batch_size / ranks cameras of each "
        "step; gradients all-reduced); model (every rank holds a shard of the Gaussians, "
        "rendered with rasterization(distributed=True), densified locally and rebalanced); "
        "docs/distributed.md",
        "run",
        seam="parallel",
    )
    dist_backend: str = _f(
        "auto",
        "torch.distributed backend of a job of several ranks: auto (nccl when the ranks train "
        "on GPUs, one GPU each; gloo on CPUs), nccl, or gloo (CPU or CUDA tensors; lets ranks "
        "share a GPU, the bytes staged through the host); docs/distributed.md",
        "run",
        DIST_BACKENDS,
    )
    checkpoint_every: int = _f(1000, "write a checkpoint every n steps (0: only at the end)", "run")
    keep_checkpoints: int = _f(2, "how many of the newest checkpoints to keep (>= 1)", "run")
    log_every: int = _f(25, "record loss, PSNR and Gaussian count every n steps", "run")
    eval_every: int = _f(
        0, "measure the test PSNR every n steps during training (0: only at the end)", "run"
    )
    early_stop_patience: int = _f(
        0,
        "stop when the test PSNR (measured every eval_every steps) has not risen by "
        "early_stop_min_db in this many evaluations; 0: run all the steps",
        "run",
    )
    early_stop_min_db: float = _f(
        0.02, "early stop: the smallest rise of the best test PSNR that counts, in dB", "run"
    )
    save_renders: bool = _f(True, "write the test-view renders as PNG at the end", "run")
    save_ply: bool = _f(True, "write point_cloud.ply (3DGS layout) at the end", "run")
    progress: bool = _f(True, "show a progress line (steps/s, loss, PSNR, Gaussians)", "run")
    lpips: bool = _f(True, "also report LPIPS when the lpips package is importable", "run")
    viewer_port: int = _f(
        0,
        "serve a live view of the training at http://127.0.0.1:PORT while it runs "
        '(pip install "tilesplat[viewer]"; docs/viewer.md); 0: off',
        "run",
    )
    tensorboard: bool = _f(
        False,
        "write TensorBoard events to RUN/tensorboard (loss, PSNR, Gaussian count, learning "
        "rates, steps/s; the test PSNR and a few test renders every eval_every steps) for "
        'tensorboard --logdir runs/ (pip install "tilesplat[tensorboard]"; docs/training.md)',
        "run",
    )

    recipe: str = _f(
        "3dgs",
        "a preset of keys set before the others given with it: 3dgs (the paper's, as gsplat's "
        "simple trainer) or fast (coarse images first, early densification, higher rates; "
        "docs/training.md)",
        "run",
        tuple(RECIPES),
    )

    # --- model and initialisation ---
    model: str = _f(
        "3dgs",
        "3dgs (Gaussians) or 2dgs (surfels, Huang et al. 2024, as gsplat's simple_trainer_2dgs: "
        "flat third scale, rasterization_2dgs, normal and depth renders; docs/training.md)",
        "model",
        seam="model",
    )
    sh_degree: int = _f(3, "highest spherical-harmonics degree of the colours (0-4)", "model")
    sh_degree_interval: int = _f(1000, "raise the SH degree in use every n steps", "model")
    init: str = _f(
        "auto",
        "initial Gaussians: points (the dataset's point cloud), random (uniform in the scene "
        "box) or auto (points when the dataset has them)",
        "model",
        INITS,
    )
    init_file: str = _f(
        "",
        "start from the Gaussians of this file instead (train --init FILE): any splat file "
        "tilesplat reads (docs/formats.md) or a gsplat checkpoint; SH bands above sh_degree "
        "are dropped, missing ones start at zero; init and the init_* keys are then unused",
        "model",
    )
    init_points: int = _f(10_000, "number of random initial Gaussians", "model")
    init_extent: float = _f(
        1.0,
        "half-size of the random-initialisation box, in units of the half-width the cameras "
        "see at the scene centre",
        "model",
    )
    init_opacity: float = _f(
        AUTO,
        "initial opacity of every Gaussian, in (0, 1); -1: the strategy's (default 0.1, mcmc 0.5)",
        "model",
    )
    init_scale: float = _f(
        AUTO,
        "factor on the initial size (mean distance to the 3 nearest neighbours); -1: the "
        "strategy's (default 1, mcmc 0.1)",
        "model",
    )

    # --- optimisation ---
    means_lr: float = _f(1.6e-4, "Adam learning rate of the means, times the scene scale", "optim")
    means_lr_final: float = _f(
        0.01, "factor the means' rate decays to by the last step (exponentially)", "optim"
    )
    scales_lr: float = _f(5e-3, "Adam learning rate of the log-scales", "optim")
    quats_lr: float = _f(1e-3, "Adam learning rate of the quaternions", "optim")
    opacities_lr: float = _f(5e-2, "Adam learning rate of the opacity logits", "optim")
    sh0_lr: float = _f(2.5e-3, "Adam learning rate of the SH degree-0 coefficients", "optim")
    shN_lr: float = _f(2.5e-3 / 20, "Adam learning rate of the higher SH coefficients", "optim")
    ssim_lambda: float = _f(0.2, "loss = (1 - l) * L1 + l * (1 - SSIM)", "optim")
    adam_beta1: float = _f(
        0.9,
        "Adam's decay of the first moment of the Gaussians' parameters; a batch of B views "
        "uses 1 - B * (1 - value), as gsplat scales it",
        "optim",
    )
    adam_beta2: float = _f(
        0.999, "Adam's decay of the second moment (scaled for the batch like adam_beta1)", "optim"
    )
    ema_decay: float = _f(
        0.0,
        "evaluate, render and export an exponential moving average of the Gaussians' "
        "parameters, keeping this share of it each step (restarted whenever the strategy "
        "edits the Gaussians; train/averaging.py); 0: the parameters of the last step",
        "optim",
    )
    opacity_reg: float = _f(
        AUTO,
        "weight of mean(opacity) in the loss; -1: the strategy's (default 0, mcmc 0.01)",
        "optim",
    )
    scale_reg: float = _f(
        AUTO,
        "weight of mean(scale) in the loss; -1: the strategy's (default 0, mcmc 0.01)",
        "optim",
    )
    random_background: bool = _f(
        False,
        "render on a random background each step (the target is recomposited when the "
        "images have alpha) to discourage transparency",
        "optim",
    )
    resolution_start: int = _f(
        1,
        "resolution schedule: downscale factor of the first steps' images, a power of two "
        "(halved at even intervals until full resolution); 1: full resolution throughout",
        "optim",
    )
    resolution_full_at: float = _f(
        0.5,
        "resolution schedule: fraction of the steps it spans, cut into equal parts for the "
        "factors resolution_start, ..., 2, 1 (with 4: full size from 2/3 of it on)",
        "optim",
    )

    post_processing: str = _f(
        "none",
        "appearance compensation of the training images (exposure, white balance): none; "
        "bilateral_grid (a grid of affine colour transforms per training image, sliced by "
        "pixel position and luminance, as gsplat's); affine (one 3x3 matrix and offset per "
        "training image); learned with the model, applied to its renders before the loss, "
        "never to the test views (docs/training.md, Appearance compensation)",
        "optim",
        ("none", "bilateral_grid", "affine"),
    )
    bilateral_grid_shape: str = _f(
        "16,16,8",
        "bilateral_grid: cells across, down and in luminance, 'X,Y,W' (gsplat's 16,16,8)",
        "optim",
    )
    bilateral_grid_lr: float = _f(
        2e-3, "bilateral_grid: Adam learning rate of the grids, times sqrt(batch_size)", "optim"
    )
    bilateral_grid_tv: float = _f(
        10.0, "bilateral_grid: weight of the grids' total-variation loss (gsplat's 10)", "optim"
    )
    affine_lr: float = _f(
        2e-3, "affine: Adam learning rate of the colour transforms, times sqrt(batch_size)",
        "optim",
    )
    post_processing_warmup: int = _f(
        1000,
        "post_processing: the transforms' learning rate rises linearly from 1% over this many "
        "steps (gsplat's 1000), then decays exponentially to 1% by the last step",
        "optim",
    )

    normal_lambda: float = _f(
        5e-2, "2dgs: weight of the normal-consistency loss (gsplat's default; 0: off)", "optim"
    )
    normal_start: int = _f(
        7000, "2dgs: first step with the normal-consistency loss (gsplat's default)", "optim"
    )
    dist_lambda: float = _f(
        1e-2, "2dgs: weight of the depth-distortion loss (gsplat's default; 0: off)", "optim"
    )
    dist_start: int = _f(
        3000, "2dgs: first step with the depth-distortion loss (gsplat's default)", "optim"
    )

    # --- pose refinement (train/pose_opt.py) ---
    pose_opt: bool = _f(
        False,
        "learn an SE(3) correction of each training camera's pose (gsplat's pose_opt); the "
        "refined poses go to RUN/poses.json and serve render/eval of the training views",
        "optim",
    )
    pose_opt_lr: float = _f(
        1e-5,
        "pose_opt: Adam learning rate of the corrections (times sqrt(batch_size); decays "
        "to 1 % by the last step), gsplat's default",
        "optim",
    )
    pose_opt_reg: float = _f(
        1e-6, "pose_opt: Adam weight decay of the corrections, gsplat's default", "optim"
    )
    test_pose_align_steps: int = _f(
        0,
        "test-time pose alignment: Adam steps that fit each evaluated view's pose to its image "
        "with the model fixed before it is scored (train/pose_align.py); 0: the given poses",
        "optim",
    )
    test_pose_align_lr: float = _f(
        1e-3, "test-time pose alignment: Adam learning rate of each view's correction", "optim"
    )

    # --- depth prior (train/depth_loss.py) ---
    depth_loss: bool = _f(
        False,
        "pull the expected depth towards the sparse points each training image sees (COLMAP's "
        "tracks, a transforms.json's ply_file_path): inverse-depth L1, gsplat's depth_loss",
        "optim",
    )
    depth_lambda: float = _f(1e-2, "depth_loss: weight of the term, gsplat's default", "optim")
    depth_lambda_final: float = _f(
        1.0,
        "depth_loss: factor the weight decays to by the last step (exponentially; 1: "
        "constant, as gsplat)",
        "optim",
    )

    # --- densification ---
    strategy: str = _f(
        "default",
        "densification: default (3DGS clone/split/prune/reset) or mcmc (3DGS-MCMC relocation)",
        "strategy",
        seam="strategy",
    )
    refine_start: int = _f(500, "first step that densifies", "strategy")
    refine_stop: int = _f(1500, "no densification from this step on", "strategy")
    refine_every: int = _f(100, "densify every n steps", "strategy")
    reset_every: int = _f(
        3000, "default: reset opacities to 2 x prune_opacity every n steps", "strategy"
    )
    pause_refine_after_reset: int = _f(
        0, "default: skip densification for n steps after an opacity reset", "strategy"
    )
    grow_grad2d: float = _f(
        2e-4,
        "default: clone/split Gaussians whose mean view-space gradient exceeds this "
        "(about 8e-4 with absgrad)",
        "strategy",
    )
    grow_scale3d: float = _f(
        0.01, "default: clone below, split above this size (x scene scale)", "strategy"
    )
    absgrad: bool = _f(
        False, "default: grow by the absolute view-space gradient (AbsGS)", "strategy"
    )
    prune_opacity: float = _f(
        0.005, "prune (default) or relocate (mcmc) below this opacity", "strategy"
    )
    prune_scale3d: float = _f(
        0.1, "default: prune Gaussians larger than this (x scene scale) after a reset", "strategy"
    )
    cap_max: int = _f(100_000, "mcmc: the most Gaussians it grows to", "strategy")
    noise_lr: float = _f(5e5, "mcmc: position noise, times the means' learning rate", "strategy")

    # --- rendering ---
    backend: str = _f("auto", "rasterization backend: auto, torch, cpu or cuda", "render", BACKENDS)
    device: str = _f(
        "auto",
        "where the model, its optimiser and every batch live: cpu, cuda or cuda:N; auto: cuda "
        "with backend = 'cuda', or with backend = 'auto' when torch sees a GPU, else cpu; the "
        "ranks of a parallel job on cuda take cuda:LOCAL_RANK (docs/training.md, Training on "
        "a GPU)",
        "render",
    )
    backward_scheme: str = _f(
        "per_pixel", "rasterizer backward: per_pixel or per_splat", "render", BACKWARD_SCHEMES
    )
    deterministic: bool = _f(
        False,
        "bitwise-reproducible gradients and training on the cuda backend (no float atomics; "
        "more memory and time, docs/gpu.md); the cpu backend is always bit-exact",
        "render",
    )
    cuda_graph: bool = _f(
        True,
        "on cuda, replay the training step as one CUDA graph (captured again when the "
        "Gaussians, the capacity, the image size or the SH degree change; needs "
        "isect_capacity = auto); where none can be captured the step runs eagerly, and the "
        "log says why (docs/gpu.md)",
        "render",
    )
    isect_capacity: str = _f(
        "auto",
        "how the step sizes its tile-intersection lists: auto (on cuda, one process, no "
        "training feature: at a capacity, 1.15 x the largest count over the training views, "
        "so that the step reads nothing back; an overflow grows it and redoes the step) or "
        "exact (the count is read back each render; docs/gpu.md)",
        "render",
        ("auto", "exact"),
    )
    packed: bool = _f(False, "packed rasterization (less memory for sparse views)", "render")
    antialiased: bool = _f(
        False, "antialiased rasterize mode (Mip-Splatting's 2D filter)", "render"
    )
    near_plane: float = _f(0.01, "Gaussians nearer than this depth are culled", "render")
    far_plane: float = _f(1e10, "Gaussians farther than this depth are culled", "render")

    def validate(self) -> TrainConfig:
        """Checks types, choices and ranges; returns self.

        Raises:
            ValueError: listing every problem found.
        """
        errors = []
        hints = _field_types()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            want = hints[f.name]
            ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                errors.append(f"{f.name} must be {want.__name__}, got {value!r}")
            elif _choices(f) and value not in _choices(f):
                errors.append(f"{f.name} must be one of {list(_choices(f))}, got {value!r}")
            elif want is float and not math.isfinite(value) and f.name != "far_plane":
                errors.append(f"{f.name} must be finite, got {value!r}")
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))

        def need(cond: bool, msg: str) -> None:
            if not cond:
                errors.append(msg)

        for name in (
            "steps",
            "batch_size",
            "downscale",
            "synthetic_size",
            "synthetic_train",
            "keep_checkpoints",
            "log_every",
            "refine_every",
            "reset_every",
            "sh_degree_interval",
            "init_points",
            "cap_max",
        ):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(self.test_every >= -1, f"test_every must be >= -1, got {self.test_every}")
        for name in (
            "synthetic_test",
            "checkpoint_every",
            "eval_every",
            "refine_start",
            "refine_stop",
            "pause_refine_after_reset",
            "normal_start",
            "dist_start",
        ):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "means_lr",
            "scales_lr",
            "quats_lr",
            "opacities_lr",
            "sh0_lr",
            "shN_lr",
            "grow_grad2d",
            "grow_scale3d",
            "prune_opacity",
            "prune_scale3d",
            "noise_lr",
            "near_plane",
            "normal_lambda",
            "dist_lambda",
        ):
            need(getattr(self, name) >= 0.0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(0 <= self.sh_degree <= 4, f"sh_degree must be in 0..4, got {self.sh_degree}")
        r = self.resolved()  # a field at AUTO takes its strategy's value, which is valid
        for name in ("opacity_reg", "scale_reg"):
            value = getattr(self, name)
            need(value >= 0.0 or value == AUTO, f"{name} must be >= 0 or -1, got {value}")
        need(
            0.0 < r.init_opacity < 1.0,
            f"init_opacity must be in (0, 1) or -1, got {self.init_opacity}",
        )
        need(self.init_extent > 0.0, f"init_extent must be > 0, got {self.init_extent}")
        need(r.init_scale > 0.0, f"init_scale must be > 0 or -1, got {self.init_scale}")
        need(
            0.0 < self.means_lr_final <= 1.0,
            f"means_lr_final must be in (0, 1], got {self.means_lr_final}",
        )
        need(
            0.0 <= self.ssim_lambda <= 1.0, f"ssim_lambda must be in [0, 1], got {self.ssim_lambda}"
        )
        for name in ("adam_beta1", "adam_beta2"):
            beta = getattr(self, name)
            need(0.0 <= beta < 1.0, f"{name} must be in [0, 1), got {beta}")
        need(
            self.far_plane > self.near_plane,
            f"far_plane ({self.far_plane}) must exceed near_plane ({self.near_plane})",
        )
        need(self.prune_opacity < 0.5, f"prune_opacity must be < 0.5, got {self.prune_opacity}")
        need(
            0 <= self.viewer_port <= 65535,
            f"viewer_port must be in 0..65535, got {self.viewer_port}",
        )
        bad_device = device_format_error(self.device)
        if bad_device is not None:
            errors.append(bad_device)
        elif is_cuda_name(self.device):
            need(self.backend != "cpu",
                 f"backend = 'cpu' runs on CPU tensors, got device = {self.device!r}: set "
                 "backend = 'cuda' (or 'auto') to train on the GPU, or device = 'cpu'")
        if self.dist_backend == "nccl":
            need((self.device != "cpu" and self.backend not in ("cpu", "torch"))
                 or is_cuda_name(self.device),
                 f"dist_backend = 'nccl' takes CUDA tensors, got device = {self.device!r} and "
                 f"backend = {self.backend!r}: set device = 'cuda', or dist_backend = 'gloo'")
        for seam in seams.SEAMS:  # each chosen variant checks its own keys
            errors += seams.variant(seam, getattr(self, seam)).config_errors(self)
        errors += seams.feature_errors(self)  # and each training feature its own
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))
        return self

    def resolved(self) -> TrainConfig:
        """A copy in which every field at ``AUTO`` (-1) holds its strategy's value.

        The trainer runs the resolved config and saves the config as given, so that a
        resumed run with another strategy or length resolves again.
        """
        chosen = self.strategy if self.strategy in seams.names("strategy") else "default"
        recipe = seams.variant("strategy", chosen).CONFIG_DEFAULTS
        values = {name: value for name, value in recipe.items() if getattr(self, name) == AUTO}
        return dataclasses.replace(self, **values)


def _field_types() -> dict[str, type]:
    return get_type_hints(TrainConfig)


def field_names() -> list[str]:
    """The names of all config fields, in declaration order."""
    return [f.name for f in dataclasses.fields(TrainConfig)]


def _unknown_key(key: str) -> ValueError:
    close = difflib.get_close_matches(key, field_names(), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown config key {key!r}{hint}")


def _coerce(key: str, value: Any, where: str) -> Any:
    """A TOML value checked against the field's type (ints are accepted for floats)."""
    want = _field_types()[key]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, want) and not (want is int and isinstance(value, bool)):
        return value
    raise ValueError(f"{where}: {key} must be {want.__name__}, got {value!r}")


def config_from_dict(
    values: dict[str, Any], base: TrainConfig | None = None, where: str = "config"
) -> TrainConfig:
    """A validated config: ``base`` (default: the defaults) updated by ``values``.

    Raises:
        ValueError: an unknown key (with the closest valid name), a wrong type or range.
    """
    updates = {}
    for key, value in values.items():
        if key not in _field_types():
            if isinstance(value, dict):
                raise ValueError(
                    f"{where}: tables are not used; write the keys of [{key}] at the top level"
                )
            err = _unknown_key(key)
            raise ValueError(f"{where}: {err}") from None
        updates[key] = _coerce(key, value, where)
    base = base or TrainConfig()
    if "recipe" in updates and updates["recipe"] in RECIPES:  # its keys first, then the rest
        base = dataclasses.replace(base, **recipe_table(updates["recipe"]))
    return dataclasses.replace(base, **updates).validate()


def recipe_table(name: str) -> dict[str, Any]:
    """The keys recipe ``name`` sets: its table, and for ``3dgs`` the defaults of every key
    another recipe sets (:mod:`.recipes`)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return {key: RECIPES[name].get(key, defaults[key]) for key in sorted(recipe_keys())}


def load_config(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """Read a TOML config file over ``base`` (default: the defaults) and validate it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not valid TOML, or an invalid key or value (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a valid TOML file ({exc})") from exc
    return config_from_dict(values, base, where=str(path))


def _parse_flag_value(key: str, text: str) -> Any:
    want = _field_types()[key]
    if want is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"--set {key}: expected true or false, got {text!r}")
    if want is str:
        return text
    try:
        return want(text) if want is float else int(text.replace("_", ""))
    except ValueError:
        raise ValueError(f"--set {key}: expected {want.__name__}, got {text!r}") from None


def apply_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """``cfg`` with ``key=value`` overrides (as given to ``--set``) applied and validated."""
    values = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        if key not in _field_types():
            raise _unknown_key(key)
        values[key] = _parse_flag_value(key, text)
    return config_from_dict(values, cfg, where="--set")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


def config_to_toml(cfg: TrainConfig) -> str:
    """The config as a TOML document, every key preceded by its help string."""
    lines = ["# tilesplat training config: tilesplat train --config THIS_FILE", ""]
    group = None
    for f in dataclasses.fields(cfg):
        if f.metadata["group"] != group:
            group = f.metadata["group"]
            lines += ([""] if len(lines) > 2 else []) + [f"# === {group} ==="]
        lines.append(f"# {f.metadata['help']}")
        lines.append(f"{f.name} = {_toml_value(getattr(cfg, f.name))}")
    return "\n".join(lines) + "\n"


def save_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write ``cfg`` as TOML to ``path`` (atomically)."""
    from .checkpoint import atomic_write_bytes

    return atomic_write_bytes(Path(path), config_to_toml(cfg).encode("utf-8"))


def describe_fields() -> str:
    """One line per field: name, type, default and help (for ``--help`` texts and docs)."""
    out = []
    for f in dataclasses.fields(TrainConfig):
        t = _field_types()[f.name].__name__
        out.append(f"  {f.name} ({t}, default {_toml_value(f.default)}): {f.metadata['help']}")
    return "\n".join(out)
