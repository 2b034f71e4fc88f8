"""The trainer's seams: for each config key that chooses a variant, the variants by name.

Three keys choose how a run trains, and each names a class behind a seam:

- ``model`` (``3dgs``, ``2dgs``): a model kind, :class:`.models.base.ModelKind` (its initial
  parameters, its render, its regularisation, its config errors, its export);
- ``strategy`` (``default``, ``mcmc``): a densification strategy of :mod:`tilesplat.strategy`
  (gsplat's hooks; its defaults for the recipe and its config errors as class attributes);
- ``parallel`` (``none``, ``data``, ``model``): a parallel mode, :class:`.parallel.base.Parallel`
  (single-process is the null object).

A model kind or a parallel mode registers itself where it is defined, with
``@register("model", "2dgs")``, as the backends register their ops (``backends/registry.py``);
strategies are listed by :data:`tilesplat.strategy.BY_NAME` (that package sits below ``train``).
``TrainConfig.validate()``, the trainer, the step and the evaluation look the variants up here
by the config's value, and none of them branches on it. This module imports nothing of
``train``, so that neither ``config`` nor the variants need the other to find one another
(``tests/test_layering.py``: no import circle).

A training feature (the resolution schedule, ...) registers the check of its own config keys
with ``@config_check``, and ``TrainConfig.validate()`` runs them after the variants'.

The package's ``__init__`` imports ``train.models``, ``train.parallel`` and the features, whose
modules register, so that every variant and check is known before any module of
``tilesplat.train`` is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..strategy import BY_NAME as _STRATEGIES

if TYPE_CHECKING:
    from ..strategy import Strategy

T = TypeVar("T")

# the seams, in the order TrainConfig.validate() asks the chosen variants for their errors
SEAMS = ("parallel", "model", "strategy")
_TABLES: dict[str, dict[str, Any]] = {"parallel": {}, "model": {}, "strategy": dict(_STRATEGIES)}


def register(seam: str, name: str) -> Callable[[T], T]:
    """Class decorator: the variant of ``seam`` chosen by the config value ``name``."""
    table = _TABLES[seam]

    def add(cls: T) -> T:
        if name in table and table[name] is not cls:
            raise ValueError(f"{seam} {name!r} is registered twice")
        table[name] = cls
        return cls

    return add


def names(seam: str) -> tuple[str, ...]:
    """The config values of ``seam``, in registration order."""
    return tuple(_TABLES[seam])


def variant(seam: str, name: str) -> Any:
    """The class registered for ``seam`` = ``name``.

    Raises:
        ValueError: an unknown name (naming the valid ones).
    """
    table = _TABLES[seam]
    if name not in table:
        raise ValueError(f"{seam} must be one of {list(table)}, got {name!r}")
    return table[name]


def strategy(cfg: Any, key_for_gradient: str = "means2d") -> Strategy:
    """The densification strategy ``cfg.strategy`` names, with the config's thresholds
    (``Strategy.from_config``); ``key_for_gradient``: the model kind's screen-space means."""
    return variant("strategy", cfg.strategy).from_config(cfg, key_for_gradient)


# the config checks of the training features (each returns its error messages), run by
# TrainConfig.validate() after the variants'
_FEATURE_CHECKS: list[Callable[[Any], list[str]]] = []


def config_check(fn: Callable[[Any], list[str]]) -> Callable[[Any], list[str]]:
    """Decorator: a training feature's check of its config keys (``fn(cfg) -> errors``),
    registered where the feature is defined."""
    _FEATURE_CHECKS.append(fn)
    return fn


def feature_errors(cfg: Any) -> list[str]:
    """Every registered feature's errors for ``cfg``, in registration order."""
    return [msg for check in _FEATURE_CHECKS for msg in check(cfg)]
