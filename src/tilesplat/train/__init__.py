"""Training: the 3DGS recipe (gsplat's simple trainer), evaluation, checkpoints, run folders.

Entry points: :func:`train_run` (new run from a :class:`TrainConfig`), :func:`resume_run`,
:func:`evaluate_run`, :func:`render_run`, and the :class:`Trainer` loop itself.

The package is six rooms (docs/architecture.md, "The trainer's house"): ``loop/``, ``rundir/``,
``step/``, ``features/``, ``models/``, ``parallel/``, over the base modules ``config``,
``seams`` and ``recipes``. The variants a config chooses (recipe, parallel mode, model kind,
strategy) sit behind seams (``seams.py``), and every module declares its own config keys.
"""

# Every room registers its variants and config keys when imported, in this order, which is
# the order of the keys in --list-keys, the saved config.toml and docs/config.md.
# isort: off
from . import config, recipes  # noqa: F401  (what trains, the strategies, the run's keys)
from .rundir import scene  # noqa: F401  (the data)
from .models import init, splats  # noqa: F401  (the initial Gaussians, their optimisers)
from .step import optimization  # noqa: F401  (the loss)
from . import features, models, parallel  # noqa: F401
from .step import capacity, cuda_graph, determinism, device  # noqa: F401
from .loop import run, tensorboard, trainer  # noqa: F401
from .rundir import outputs  # noqa: F401
# isort: on

from .config import TrainConfig, apply_overrides, config_to_toml, load_config
from .loop.run import evaluate_run, load_run, render_run, resume_run, train_run
from .loop.trainer import Trainer
from .rundir.outputs import export_ply

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
