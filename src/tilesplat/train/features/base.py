"""The feature seam: training features that act around the render of each step.

A feature is switched on by its own config keys (``post_processing``, ``pose_opt``,
``depth_loss``, ...) and may hold learned state of its own, for instance one colour transform
or one pose correction per training image. The trainer builds every registered feature that
its config switches on (:meth:`Feature.from_config` returns None when it is off) and the step
(:func:`.step.optimization_step`) calls them in registration order, at four points:

1. :meth:`Feature.cameras`: the batch's cameras before the render (a pose correction);
2. :meth:`Feature.colors`: the rendered colours before the loss (an exposure transform);
3. :meth:`Feature.loss`: a loss term of the render (a regulariser, a depth prior);
4. :meth:`Feature.optimizer_step`: after backward, with the Gaussians' Adam steps (the
   feature's own optimiser and learning-rate schedule).

The trainer saves :meth:`Feature.state_dict` in its checkpoints under ``features`` (tensors on
the CPU, loadable with ``weights_only=True``), restores it on resume and calls
:meth:`Feature.write` when it writes a checkpoint, so that the run folder holds what the
feature learned (refined poses, ...). Renders and evaluations of a run see the dataset through
:meth:`Feature.trained_views` of its features (the training views at their refined poses, ...;
:func:`checkpoint_features` rebuilds them from a checkpoint). The base class is the identity at
every point.

A feature registers with ``@register_feature`` where it is defined, and its module is imported
by ``train/features/__init__.py``. It declares its config keys as :attr:`Feature.KEYS` (joined
to the config's table, :mod:`..seams`); :meth:`Feature.config_errors` checks what their ranges
cannot say, for every registered feature whether it is on or not (a parallel mode it does not
support, say). Its learned tensors (:meth:`Feature.parameters`) have their gradients combined
over the ranks of a data-parallel job by the parallel mode, with the Gaussians'.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import Tensor

from ...keys import Key
from .. import seams
from ..parallel.base import needs_whole_model

if TYPE_CHECKING:
    from ...data.dataset import SceneDataset
    from ..config import TrainConfig
    from ..models.base import Cameras, Render

F = TypeVar("F", bound="type[Feature]")


class Feature:
    """A training feature around the render; the base is the identity at every point.

    ``batch`` in the hooks is the step's :class:`.step.Batch` (cameras, targets, masks and
    ``views``: the training-image index of each camera, [C] long on the training device); a
    feature with per-image state indexes its state with ``batch.views``. (Typed as its base
    :class:`.models.base.Cameras` here: ``step`` imports this module.)
    """

    # the name of its state in checkpoints (and in messages)
    name: ClassVar[str] = "feature"
    # whether its loss reads the render's expected depth (Render.depths): the step then
    # asks the model kind for it (render_mode "RGB+ED")
    needs_expected_depth: ClassVar[bool] = False
    # its config keys (joined to the table when it registers)
    KEYS: ClassVar[tuple[Key, ...]] = ()
    # the bool key that switches it on (then from_config builds ``cls(cfg, dataset, device)``)
    SWITCH: ClassVar[str | None] = None
    # why it needs every Gaussian in each rank (a model-parallel job is refused), or None
    WHOLE_MODEL: ClassVar[str | None] = None

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        """Why ``cfg``'s keys of this feature are wrong: one message per key (empty when
        they are right or the feature is off). The base refuses a parallel mode that shards
        the model when the feature is on and needs the whole model."""
        if cls.WHOLE_MODEL is None or not cls.is_on(cfg):
            return []
        return needs_whole_model(cfg, str(cls.SWITCH), cls.WHOLE_MODEL)

    @classmethod
    def is_on(cls, cfg: TrainConfig) -> bool:
        """Whether ``cfg`` switches the feature on (the base: its :attr:`SWITCH` key)."""
        return cls.SWITCH is not None and bool(getattr(cfg, cls.SWITCH))

    @classmethod
    def from_config(
        cls, cfg: TrainConfig, dataset: SceneDataset, device: torch.device
    ) -> Feature | None:
        """The feature for a run of ``cfg`` on ``dataset`` (``dataset.train`` are the views
        that ``views`` index), its state on ``device``; None when ``cfg`` leaves it off."""
        return cls(cfg, dataset, device) if cls.is_on(cfg) else None  # type: ignore[call-arg]

    def cameras(self, batch: Cameras, step: int) -> Cameras:
        """The batch the step renders (before the render; the base returns it unchanged)."""
        return batch

    def colors(self, colors: Tensor, batch: Cameras, step: int) -> Tensor:
        """The colours the loss compares with the targets: ``colors`` [C, H, W, 3] as
        rendered (the base returns them unchanged)."""
        return colors

    def loss(self, out: Render, batch: Cameras, step: int) -> Tensor | None:
        """The feature's loss term at ``step`` (a scalar tensor), or None."""
        return None

    def parameters(self) -> list[Tensor]:
        """Its learned tensors: their gradients are combined over the ranks of a job with the
        Gaussians' (``Parallel.reduce_gradients``) before :meth:`optimizer_step`."""
        return []

    def optimizer_step(self, step: int) -> None:
        """After backward: step the feature's own optimiser (and zero its gradients)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step needs, tensors on the CPU (saved in checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (raises ValueError when it does not fit the run)."""

    def write(self, run_dir: Path) -> None:
        """Write what the feature learned into the run folder (atomically); the base writes
        nothing."""

    def trained_views(self, dataset: SceneDataset) -> SceneDataset:
        """``dataset`` as the trained model sees it, for renders and evaluation after (or
        during) training: refined poses of the training views, say (the base returns it
        unchanged)."""
        return dataset


def restore_learned(
    what: str, target: Tensor, value: object, optimizer: torch.optim.Optimizer, adam: object
) -> None:
    """Load a feature's learned tensor and its Adam state from a checkpoint: ``value`` must
    be a finite tensor of ``target``'s shape (copied into it), ``adam`` the optimiser's state
    dict.

    Raises:
        ValueError: naming ``what`` (e.g. "pose_opt: the corrections") and what came.
    """
    if not isinstance(value, Tensor) or value.shape != target.shape:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{what} in the checkpoint are {got}, the run needs "
                         f"{tuple(target.shape)} (one per training image)")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{what} in the checkpoint are not finite")
    with torch.no_grad():
        target.copy_(value)
    try:
        optimizer.load_state_dict(adam)  # type: ignore[arg-type]
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"{what}: the checkpoint's Adam state does not load: {exc}") from None


_FEATURES: list[type[Feature]] = []


def register_feature(cls: F) -> F:
    """Class decorator: a training feature, built by the trainer when its keys switch it on;
    its :attr:`Feature.KEYS` join the config's table and its :meth:`Feature.config_errors`
    ``TrainConfig.validate()``'s checks."""
    if any(f.name == cls.name for f in _FEATURES):
        raise ValueError(f"feature {cls.name!r} is registered twice")
    _FEATURES.append(cls)
    seams.register_keys(f"feature {cls.name}", cls.KEYS, cls.config_errors)
    return cls


def build_features(
    cfg: TrainConfig, dataset: SceneDataset, device: torch.device
) -> list[Feature]:
    """The features ``cfg`` switches on, in registration order."""
    built = (cls.from_config(cfg, dataset, device) for cls in _FEATURES)
    return [f for f in built if f is not None]


def features_state(features: list[Feature]) -> dict[str, dict[str, Any]]:
    """The checkpoint entry of ``features``: each one's state by name."""
    return {f.name: f.state_dict() for f in features}


def trained_dataset(features: list[Feature], dataset: SceneDataset) -> SceneDataset:
    """``dataset`` as the features' learned state sees it (:meth:`Feature.trained_views` of
    each, in order)."""
    for f in features:
        dataset = f.trained_views(dataset)
    return dataset


def checkpoint_features(cfg: TrainConfig, dataset: SceneDataset, checkpoint: dict[str, Any]
                        ) -> list[Feature]:
    """The features ``cfg`` switches on, on the CPU, with the state of a training
    ``checkpoint`` (what a render or an evaluation of the run needs of them)."""
    features = build_features(cfg, dataset, torch.device("cpu"))
    load_features_state(features, checkpoint.get("features"))
    return features


def load_features_state(features: list[Feature], states: object) -> None:
    """Restore each feature from a checkpoint's ``features`` entry.

    Raises:
        ValueError: a feature that is on has no state in the checkpoint (it was trained
            without it), or its state does not fit.
    """
    states = states if isinstance(states, dict) else {}
    for f in features:
        st = states.get(f.name)
        if not isinstance(st, dict):
            raise ValueError(
                f"the checkpoint has no state of the feature {f.name!r}: it was trained without "
                "it; resume with the config it was trained with"
            )
        f.load_state_dict(st)

