"""Training: the 3DGS recipe (gsplat's simple trainer), evaluation, checkpoints, run folders.

Entry points: :func:`train_run` (new run from a :class:`TrainConfig`), :func:`resume_run`,
:func:`evaluate_run`, :func:`render_run`, and the :class:`Trainer` loop itself.

The variants a config chooses (model kind, strategy, parallel mode) sit behind seams
(``seams.py``); importing this package registers every model kind and parallel mode first.
"""

# every room registers its variants and config keys on import; this order is the order of the
# keys in --list-keys, the saved config.toml and docs/config.md
from . import config, features, models, parallel, recipes  # noqa: F401  (what trains, the strategies, the run)  # noqa: F401
from .config import TrainConfig, apply_overrides, config_to_toml, load_config
from .loop import run, tensorboard, trainer  # noqa: F401
from .loop.run import evaluate_run, load_run, render_run, resume_run, train_run
from .loop.trainer import Trainer
from .models import init, splats  # noqa: F401  (the initial Gaussians, their optimisers)
from .rundir import (
    outputs,  # noqa: F401
    scene,  # noqa: F401  (the data)
)
from .rundir.outputs import export_ply
from .step import (  # noqa: F401
    capacity,
    cuda_graph,
    determinism,
    device,
    optimization,  # noqa: F401  (the loss)
)

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
