"""The trainer's seams: the variants each choosing key names, and every declared config key.

Four keys choose how a run trains, and each names a class behind a seam:

- ``recipe`` (``3dgs``, ``fast``): a preset of keys (:mod:`.recipes`);
- ``parallel`` (``none``, ``data``, ``model``): a parallel mode, :class:`.parallel.base.Parallel`
  (single-process is the null object);
- ``model`` (``3dgs``, ``2dgs``): a model kind, :class:`.models.base.ModelKind`;
- ``strategy`` (``default``, ``mcmc``, ``budget``): a densification strategy of
  :mod:`tilesplat.strategy` (gsplat's hooks), listed by :data:`tilesplat.strategy.BY_NAME`.

A variant registers where it is defined, with ``@register(seam, NAME)``. Its class attributes
say what the configuration needs of it: ``KEYS`` (the :class:`tilesplat.keys.Key` records of
its own keys, joined to the table here), ``PRESET`` (the values its choice sets before the
other keys given with it, as a recipe does) and ``config_errors(cfg)`` (why a config cannot
train with it, asked of the chosen variant only).

Modules that are not variants (the loop, the step, the features) declare their keys with
:func:`register_keys`, with a check of their own where a key depends on another. A feature
registers through :func:`.features.base.register_feature`, which calls it.

This module imports nothing of ``train`` (``tests/test_layering.py``: no import circle); the
package's ``__init__`` imports every room, so that every variant and key is known before a
config is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..keys import Key
from ..strategy import BY_NAME as _STRATEGIES

if TYPE_CHECKING:
    from ..strategy import Strategy

T = TypeVar("T")
Check = Callable[[Any], list[str]]

# the choosing keys, in the order their presets apply and their variants are checked
SEAMS = ("recipe", "parallel", "model", "strategy")
_TABLES: dict[str, dict[str, Any]] = {seam: {} for seam in SEAMS}


@dataclass(frozen=True)
class KeyGroup:
    """The keys one owner declares: ``title`` (shown above them in ``--list-keys`` and the
    saved ``config.toml``), ``keys``, and ``check`` (``cfg -> errors``: what the keys' own
    ranges cannot say, run for every config), or None."""

    title: str
    keys: tuple[Key, ...]
    check: Check | None = None


_GROUPS: list[KeyGroup] = []
_KEYS: dict[str, Key] = {}


def register_keys(title: str, keys: Sequence[Key], check: Check | None = None) -> None:
    """Join ``keys`` to the table under ``title``; ``check(cfg)`` runs at every validation.

    A key declared again by another owner (two strategies share ``refine_every``) must be the
    same record.

    Raises:
        ValueError: a key of that name with another default, doc or range.
    """
    for key in keys:
        if _KEYS.get(key.name, key) != key:
            raise ValueError(f"config key {key.name!r} is declared twice, differently")
    new = tuple(k for k in keys if k.name not in _KEYS)
    _KEYS.update({k.name: k for k in new})
    _GROUPS.append(KeyGroup(title, new, check))


def key_table() -> dict[str, Key]:
    """Every declared key by name, in declaration order."""
    return _KEYS


def key_groups() -> list[KeyGroup]:
    """The owners' groups of keys, in registration order."""
    return _GROUPS


def register(seam: str, name: str) -> Callable[[T], T]:
    """Class decorator: the variant of ``seam`` chosen by the config value ``name``; its
    ``KEYS`` join the table."""
    table = _TABLES[seam]

    def add(cls: T) -> T:
        if name in table and table[name] is not cls:
            raise ValueError(f"{seam} {name!r} is registered twice")
        table[name] = cls
        register_keys(f"{seam} = {name!r}", getattr(cls, "KEYS", ()))
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


def preset(seam: str, name: str) -> dict[str, Any]:
    """The keys choosing ``seam = name`` sets: its ``PRESET``, and the defaults of every key
    another variant of the seam presets (so that choosing it sets them back)."""
    chosen = getattr(variant(seam, name), "PRESET", {})
    others = {k for cls in _TABLES[seam].values() for k in getattr(cls, "PRESET", {})}
    return {k: chosen[k] if k in chosen else _KEYS[k].default for k in sorted(others)}


def strategy(cfg: Any, key_for_gradient: str = "means2d", image_pixels: int = 0) -> Strategy:
    """The densification strategy ``cfg.strategy`` names, with the config's thresholds
    (``Strategy.from_config``); ``key_for_gradient``: the model kind's screen-space means;
    ``image_pixels``: the largest training image's pixels, for a limit that scales with
    them (``Strategy.for_images``; 0: none)."""
    made = variant("strategy", cfg.strategy).from_config(cfg, key_for_gradient)
    return made.for_images(image_pixels) if image_pixels > 0 else made


def errors(cfg: Any) -> list[str]:
    """Why ``cfg`` cannot train, beyond its keys' types and ranges: every group's check, then
    the chosen variant of each seam's ``config_errors``."""
    found = [msg for group in _GROUPS if group.check is not None for msg in group.check(cfg)]
    for seam in SEAMS:
        found += getattr(variant(seam, getattr(cfg, seam)), "config_errors", lambda c: [])(cfg)
    return found


register_keys("what trains (each key chooses a variant; its preset applies first)", (
    Key("recipe", "3dgs", "a preset of keys set before the others given with it: 3dgs (the "
        "paper's, as gsplat's simple trainer) or fast (coarse images first, early "
        "densification, higher rates; docs/training.md)", choices=lambda: names("recipe")),
    Key("parallel", "none", "training across processes (tilesplat train --nproc N, or "
        "torchrun): none; data (every rank holds all Gaussians and renders batch_size / ranks "
        "cameras of each step; gradients all-reduced); model (every rank holds a shard of the "
        "Gaussians, rendered with rasterization(distributed=True), densified locally and "
        "rebalanced); docs/distributed.md", choices=lambda: names("parallel")),
    Key("model", "3dgs", "3dgs (Gaussians) or 2dgs (surfels, Huang et al. 2024, as gsplat's "
        "simple_trainer_2dgs: flat third scale, rasterization_2dgs, normal and depth renders; "
        "docs/training.md)", choices=lambda: names("model")),
    Key("strategy", "default", "densification: default (3DGS clone/split/prune/reset), mcmc "
        "(3DGS-MCMC relocation) or budget (default's growth within cap_max)",
        choices=lambda: names("strategy")),
))

for _name, _cls in _STRATEGIES.items():  # the strategies sit below train: registered here
    register("strategy", _name)(_cls)
