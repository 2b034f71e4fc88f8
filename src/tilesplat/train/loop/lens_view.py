"""``tilesplat eval --pinhole``: a run scored through a pinhole instead of the capture's lens.

A run trained with ``camera_mode = "native"`` renders and scores its views through each
capture's own lens (the full image). ``--pinhole`` loads the views as ``camera_mode =
"undistort"`` makes them (:func:`.features.camera_mode.through_pinhole`: undistorted images,
pinhole cameras) and scores the model on those, which puts a native run and an undistorted one
on the same pixels. The numbers go to ``metrics_pinhole.json`` beside the run's own
``metrics.json`` (left as it is), the renders (``save_renders``) to ``renders/SPLIT_pinhole``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...io.atomic import atomic_write_bytes
from ...io.json_file import strict_json_bytes
from ..features.base import checkpoint_features, trained_dataset
from ..features.camera_mode import through_pinhole
from ..rundir.evaluate import METRICS, evaluate
from ..rundir.scene import load_scene
from .run import Log, load_run

METRICS_FILE = "metrics_pinhole.json"


def evaluate_pinhole(run_dir: str | Path, log: Log = print) -> dict[str, Any]:
    """Score a run's newest checkpoint on its test views (train views without test views)
    through the undistorted cameras; writes and returns ``metrics_pinhole.json``'s numbers."""
    run_dir = Path(run_dir)
    cfg, params, ckpt = load_run(run_dir)
    cfg = through_pinhole(cfg)
    dataset = load_scene(cfg, log)
    dataset = trained_dataset(checkpoint_features(cfg, dataset, ckpt), dataset)
    split = "test" if dataset.test else "train"
    frames = dataset.test or dataset.train
    out_dir = run_dir / "renders" / f"{split}_pinhole" if cfg.save_renders else None
    result = evaluate(params, frames, cfg, dataset.background, out_dir=out_dir)
    metrics = {
        "step": int(ckpt["step"]), "split": split, "through": "pinhole",
        **{k: result[k] for k in METRICS if k in result},
        "n_views": result["n_views"], "n_gaussians": len(params["means"]),
        "train_seconds": ckpt.get("elapsed"), "views": result["views"],
    }  # fmt: skip
    atomic_write_bytes(run_dir / METRICS_FILE, strict_json_bytes(metrics)[0])
    return metrics
