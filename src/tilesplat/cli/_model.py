"""What ``tilesplat view`` and ``tilesplat export`` open: a run folder, a checkpoint or a
splat file (``.ply``, ``.splat``, ``.spz``), as the raw parameters of
:mod:`tilesplat.io.gaussians`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from ..io.gaussians import SUFFIXES, load_gaussians


@dataclass
class Model:
    """Gaussians (``means``, ``quats``, ``log_scales``, ``opacity_logits``, ``sh``), where
    they came from, and whether they were trained in antialiased mode."""

    gaussians: dict[str, Tensor]
    source: str
    antialiased: bool = False


def open_model(target: str | Path) -> Model:
    """Load a run folder (its newest checkpoint), a checkpoint file or a splat file.

    Raises:
        FileNotFoundError: nothing at ``target``, or a folder without checkpoints.
        ValueError: a malformed checkpoint or splat file, or an unknown file type.
    """
    path = Path(target)
    if not path.exists():
        raise FileNotFoundError(f"no run folder, checkpoint or splat file at {path}")
    if path.is_file() and path.suffix.lower() in SUFFIXES:
        return Model(load_gaussians(path), str(path))
    if path.is_file() and path.suffix.lower() != ".pt":
        raise ValueError(
            f"{path}: expected a run folder, a checkpoint (.pt) or a splat file "
            f"({', '.join(SUFFIXES)})"
        )
    import torch

    from ..train.models import model_kind
    from ..train.run import open_checkpoint

    rc = open_checkpoint(path)
    p = {k: v.detach().float() for k, v in rc.ckpt["params"].items()}
    p = model_kind(rc.cfg).export(p)  # as the run's PLY holds them (2DGS: flat third scale)
    gaussians = {
        "means": p["means"],
        "quats": p["quats"],
        "log_scales": p["scales"],
        "opacity_logits": p["opacities"],
        "sh": torch.cat([p["sh0"], p["shN"]], dim=1),
    }
    return Model(gaussians, f"{rc.path} (step {rc.step})", rc.cfg.antialiased)
