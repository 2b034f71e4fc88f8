"""The training configuration: the composition of every declared key, for TOML files, ``--set``
flags, saved runs and the docs.

Each key is declared beside the code that reads it (a :class:`tilesplat.keys.Key`: default,
one-line doc, range), and registered in :mod:`.seams`: the run's common keys below, the
loop's, the step's, each model kind's, strategy's, parallel mode's and feature's with their
code. A :class:`TrainConfig` holds a value for every key of that table, read as attributes
(``cfg.steps``). Setting a key that chooses a variant (``recipe``, ``strategy``, ...) sets that
variant's ``PRESET`` first, and every other key given in the same place after it, so every
effective value is a key's value, and the saved ``config.toml`` shows it. A TOML file holds
``key = value`` lines at the top level; unknown keys are rejected with the closest valid name.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from ..keys import Key, toml_value
from . import seams

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KEYS = (
    Key("seed", 0, "seed of every random choice (initialisation, camera order, noise)"),
    Key("steps", 3000, "number of optimisation steps", ge=1),
    Key("batch_size", 1, "cameras per step; learning rates scale by sqrt(batch_size) as in "
        "gsplat", ge=1),
)
seams.register_keys("run", KEYS)

# Keys whose value -1 meant "the strategy's" in configs written before the strategies'
# presets (tilesplat <= 2026-12-02): such a value is read as not given.
_RETIRED_AUTO = ("init_opacity", "init_scale", "opacity_reg", "scale_reg")


class TrainConfig:
    """Everything that decides a training run: a value for each key of the table.

    ``TrainConfig(steps=100, strategy="mcmc")`` starts from the defaults, applies the presets
    of the variants it chooses, then its own values; :meth:`replace` does the same on a copy.
    A config is never changed in place. A key registered after a config was made (a variant of
    a test) reads as its default.
    """

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        defaults = {name: key.default for name, key in seams.key_table().items()}
        object.__setattr__(self, "_values", _with_presets(defaults, values))

    def replace(self, **values: Any) -> TrainConfig:
        """A copy with ``values`` set (their variants' presets first; not validated)."""
        return _restore(_with_presets(dict(self._values), values))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._values:
            return self._values[name]
        if name in seams.key_table():
            return seams.key_table()[name].default
        raise AttributeError(f"TrainConfig has no key {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a TrainConfig is not changed in place: cfg.replace({name}=...)")

    def as_dict(self) -> dict[str, Any]:
        """Every key's value, in the table's order."""
        return {name: getattr(self, name) for name in seams.key_table()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrainConfig) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        table = seams.key_table()
        given = [f"{k}={v!r}" for k, v in self.as_dict().items() if v != table[k].default]
        return f"TrainConfig({', '.join(given)})"

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return _restore, (dict(self._values),)

    def validate(self) -> TrainConfig:
        """Checks every key's type, choices and range, then what the owners of the keys check
        (:func:`.seams.errors`); returns self.

        Raises:
            ValueError: listing every problem found.
        """
        table = seams.key_table()
        errors = [p for k in table.values() if (p := k.problem(getattr(self, k.name)))]
        if not errors:
            errors = seams.errors(self)
        if errors:
            raise ValueError("invalid config: " + "; ".join(errors))
        return self


def _restore(values: dict[str, Any]) -> TrainConfig:
    cfg = object.__new__(TrainConfig)
    object.__setattr__(cfg, "_values", values)
    return cfg


def _with_presets(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    for key in values:
        if key not in seams.key_table():
            raise _unknown_key(key)
    for seam in seams.SEAMS:  # the presets of the variants chosen here, then the values
        if seam in values and values[seam] in seams.names(seam):
            base.update(seams.preset(seam, values[seam]))
    base.update(values)
    return base


def key_names() -> list[str]:
    """The names of all config keys, in the table's order."""
    return list(seams.key_table())


def _unknown_key(key: str) -> ValueError:
    close = difflib.get_close_matches(key, key_names(), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown config key {key!r}{hint}")


def config_from_dict(
    values: dict[str, Any], base: TrainConfig | None = None, where: str = "config"
) -> TrainConfig:
    """A validated config: ``base`` (default: the defaults) updated by ``values``.

    Raises:
        ValueError: an unknown key (with the closest valid name), a wrong type or range.
    """
    table = seams.key_table()
    updates = {}
    for key, value in values.items():
        if key not in table:
            if isinstance(value, dict):
                raise ValueError(
                    f"{where}: tables are not used; write the keys of [{key}] at the top level"
                )
            raise ValueError(f"{where}: {_unknown_key(key)}") from None
        if key in _RETIRED_AUTO and value == -1:
            continue
        updates[key] = table[key].coerce(value, where)
    return (base or TrainConfig()).replace(**updates).validate()


MAX_CONFIG_BYTES = 1 << 20  # ~10,000 times a config that sets every key


def load_config(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """Read a TOML config file over ``base`` (default: the defaults) and validate it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not valid TOML, or an invalid key or value (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:  # the file is a user's: bound what parsing it allocates
        raise ValueError(f"{path}: a config file of {size} bytes; at most {MAX_CONFIG_BYTES} "
                         "are read")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a valid TOML file ({exc})") from exc
    except RecursionError:  # tomllib recurses once per level of nested arrays or tables
        raise ValueError(f"{path}: not a valid config: its values are nested deeper than "
                         "the TOML reader follows") from None
    return config_from_dict(values, base, where=str(path))


def apply_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """``cfg`` with ``key=value`` overrides (as given to ``--set``) applied and validated."""
    table = seams.key_table()
    values = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        if key not in table:
            raise _unknown_key(key)
        values[key] = table[key].parse(text)
    return config_from_dict(values, cfg, where="--set")


def config_to_toml(cfg: TrainConfig) -> str:
    """The config as a TOML document: the keys by owner, each preceded by its doc."""
    lines = ["# tilesplat training config: tilesplat train --config THIS_FILE"]
    for group in seams.key_groups():
        if group.keys:
            lines += ["", f"# === {group.title} ==="]
        for key in group.keys:
            lines += [f"# {key.doc}", f"{key.name} = {toml_value(getattr(cfg, key.name))}"]
    return "\n".join(lines) + "\n"


def save_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write ``cfg`` as TOML to ``path`` (atomically)."""
    from ..io.atomic import atomic_write_bytes

    return atomic_write_bytes(Path(path), config_to_toml(cfg).encode("utf-8"))


def _values_text(key: Key) -> str:
    choices = key.valid_choices()
    allowed = " | ".join(choices) if choices else key.bounds()
    return f"{key.type.__name__}{', ' + allowed if allowed else ''}"


def describe_keys() -> str:
    """Every key by owner: name, type, range, default and doc (``tilesplat train --list-keys``)."""
    out = []
    for group in seams.key_groups():
        if group.keys:
            out.append(f"{group.title}:")
        out += [f"  {k.name} ({_values_text(k)}; default {toml_value(k.default)}): {k.doc}"
                for k in group.keys]
    return "\n".join(out)


def keys_markdown() -> str:
    """The table of keys of ``docs/config.md`` (a test checks that the page holds it)."""
    out = []
    for group in seams.key_groups():
        if not group.keys:
            continue
        out += [f"### {group.title}", "", "| key | type, values | default | what it does |",
                "| --- | --- | --- | --- |"]
        out += [f"| `{k.name}` | {_values_text(k).replace('|', '/')} | "
                f"`{toml_value(k.default)}` | {k.doc.replace('|', '/')} |" for k in group.keys]
        out.append("")
    return "\n".join(out)
