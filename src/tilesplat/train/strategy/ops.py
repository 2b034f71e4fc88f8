"""The parameter edits of the strategies: :mod:`tilesplat.strategy.ops` under its old path."""

from ...strategy.ops import (
    compute_relocation,
    duplicate,
    inject_noise,
    quat_to_rotmat,
    relocate,
    relocation_table,
    remove,
    reset_opacity,
    sample_add,
    split,
    update_params,
)

__all__ = [
    "compute_relocation",
    "duplicate",
    "inject_noise",
    "quat_to_rotmat",
    "relocate",
    "relocation_table",
    "remove",
    "reset_opacity",
    "sample_add",
    "split",
    "update_params",
]
