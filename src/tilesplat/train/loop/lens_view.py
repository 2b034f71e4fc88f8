"""``tilesplat eval --pinhole``: a run scored through a pinhole instead of the capture's lens;
the capture's lens of a native run for ``tilesplat view``'s render mode (:func:`capture_frame`).

A run trained with ``camera_mode = "native"`` renders and scores its views through each
capture's own lens (the full image). ``--pinhole`` loads the views as ``camera_mode =
"undistort"`` makes them (:func:`.features.camera_mode.pinhole_mode`: undistorted images,
pinhole cameras, rendered through 3DGUT as the run was trained) and scores the model on those,
which puts a native run and an undistorted one on the same pixels. The numbers go to
``metrics_pinhole.json`` beside the run's own ``metrics.json`` (left as it is), the renders
(``save_renders``) to ``renders/SPLIT_pinhole``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...data.frames import Frame
from ...io.atomic import atomic_write_bytes
from ...io.json_file import strict_json_bytes
from ..features.base import checkpoint_features, trained_dataset
from ..features.camera_mode import pinhole_mode
from ..rundir.checkpoint import latest_checkpoint, open_checkpoint
from ..rundir.evaluate import METRICS, evaluate
from ..rundir.scene import load_scene
from .run import Log, load_run

METRICS_FILE = "metrics_pinhole.json"


def evaluate_pinhole(run_dir: str | Path, log: Log = print) -> dict[str, Any]:
    """Score a run's newest checkpoint on its test views (train views without test views)
    through the undistorted cameras; writes and returns ``metrics_pinhole.json``'s numbers."""
    run_dir = Path(run_dir)
    cfg, params, ckpt = load_run(run_dir)
    dataset = load_scene(cfg, log, pinhole_mode(cfg))
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


def capture_frame(source: str | Path) -> Frame | None:
    """The first training view with a lens of a run (folder or checkpoint) trained with
    ``camera_mode = "native"`` (its dataset loaded), or None: another camera mode, a capture
    without distortion, or a source that is no tilesplat run (a splat file, gsplat's)."""
    path = Path(source)
    if not (path.is_dir() and (path / "checkpoints").is_dir()) and path.suffix != ".pt":
        return None
    try:
        run = open_checkpoint(latest_checkpoint(path) if path.is_dir() else path)
    except (FileNotFoundError, ValueError):
        return None
    if run.cfg.camera_mode != "native":
        return None
    dataset = load_scene(run.cfg, lambda _: None)
    return next((f for f in dataset.train if f.lens is not None), None)
