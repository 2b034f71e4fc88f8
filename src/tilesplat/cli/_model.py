"""What ``tilesplat view`` and ``tilesplat export`` open: a tilesplat run folder or
checkpoint, a gsplat checkpoint or result folder (``ckpts/ckpt_N_rank0.pt``), or any splat
file of :data:`tilesplat.io.gaussians.FORMATS`, as the Gaussians of that module (gsplat's
``splats`` names, :data:`~tilesplat.io.gaussians.SPLAT_KEYS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from ..io.gaussians import SPLAT_KEYS, SUFFIXES, read_gaussians, suffix_of

WHAT = "a run folder, a checkpoint (.pt, tilesplat's or gsplat's) or a splat file (" + ", ".join(
    SUFFIXES
) + ")"


@dataclass
class Model:
    """Gaussians (:data:`~tilesplat.io.gaussians.SPLAT_KEYS`), where they came from,
    whether they were trained in antialiased mode, and what the reader ignored."""

    gaussians: dict[str, Tensor]
    source: str
    antialiased: bool = False
    notes: list[str] = field(default_factory=list)


def _gsplat(path: Path) -> Model:
    from ..io.gsplat_ckpt import read_gsplat_checkpoint

    data, step, files = read_gsplat_checkpoint(path)
    source = f"{files[0]} (gsplat, step {step}" + (f", {len(files)} ranks)" if len(files) > 1
                                                   else ")")  # fmt: skip
    return Model(data.gaussians, source, data.antialiased, data.notes)


def _tilesplat(path: Path) -> Model:
    from ..train.features.averaging import served_params
    from ..train.models import model_kind
    from ..train.rundir.checkpoint import open_checkpoint

    rc = open_checkpoint(path)
    p = {k: v.detach().float() for k, v in served_params(rc.ckpt).items()}
    p = model_kind(rc.cfg).export(p)  # as the run's PLY holds them (2DGS: flat third scale)
    return Model({k: p[k] for k in SPLAT_KEYS}, f"{rc.path} (step {rc.step})", rc.cfg.antialiased)


def open_model(target: str | Path) -> Model:
    """Load a tilesplat run folder (its newest checkpoint) or checkpoint, a gsplat
    checkpoint or result folder, or a splat file.

    Raises:
        FileNotFoundError: nothing at ``target``, or a folder without checkpoints.
        ValueError: a malformed checkpoint or splat file, or an unknown file type.
    """
    path = Path(target)
    if not path.exists():
        raise FileNotFoundError(f"no run folder, checkpoint or splat file at {path}")
    if path.is_file() and suffix_of(path) is not None:
        data = read_gaussians(path)
        return Model(data.gaussians, str(path), data.antialiased, data.notes)
    if path.is_file() and path.suffix.lower() != ".pt":
        raise ValueError(f"{path}: expected {WHAT}")
    from ..io.gsplat_ckpt import checkpoint_files, is_gsplat_checkpoint, load_checkpoint_dict

    if path.is_dir():
        if checkpoint_files(path) and not (path / "checkpoints").is_dir():
            return _gsplat(path)
        return _tilesplat(path)
    if is_gsplat_checkpoint(load_checkpoint_dict(path)):
        return _gsplat(path)
    return _tilesplat(path)
