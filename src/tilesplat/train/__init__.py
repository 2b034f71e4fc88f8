"""Training: the 3DGS recipe (gsplat's simple trainer), evaluation, checkpoints, run folders.

Entry points: :func:`train_run` (new run from a :class:`TrainConfig`), :func:`resume_run`,
:func:`evaluate_run`, :func:`render_run`, and the :class:`Trainer` loop itself.

The variants a config chooses (model kind, strategy, parallel mode) sit behind seams
(``seams.py``); importing this package registers every model kind and parallel mode first.
"""

# register the variants behind the seams and the features' config checks
from . import (  # noqa: F401
    appearance,
    averaging,
    depth_loss,
    determinism,
    early_stop,
    features,
    models,
    parallel,
    pose_align,
    pose_opt,
    resolution,
    tensorboard,
)
from .config import TrainConfig, apply_overrides, config_to_toml, load_config
from .run import evaluate_run, export_ply, load_run, render_run, resume_run, train_run
from .trainer import Trainer

__all__ = [
    "TrainConfig",
    "Trainer",
    "apply_overrides",
    "config_to_toml",
    "evaluate_run",
    "export_ply",
    "load_config",
    "load_run",
    "render_run",
    "resume_run",
    "train_run",
]
