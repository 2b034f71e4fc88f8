"""What a run writes at its end: ``metrics.json`` (the test views scored), the test renders,
``curve.png`` and ``point_cloud.ply``; and the run's closing line."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...data.dataset import SceneDataset
from ...io.atomic import atomic_write_bytes
from ...io.json_file import strict_json_bytes
from ...keys import Key
from .. import seams
from ..config import TrainConfig
from ..models import model_kind
from ..step.metrics import make_lpips
from .evaluate import METRICS, evaluate
from .plots import save_curve

KEYS = (
    Key("save_renders", True, "write the test-view renders as PNG at the end"),
    Key("save_ply", True, "write point_cloud.ply (3DGS layout) at the end"),
    Key("lpips", True, "also report LPIPS when the lpips package is importable"),
)
seams.register_keys("outputs (train/rundir/outputs.py)", KEYS)


def _value(x: float | None, digits: int, unit: str = "") -> str:
    """A metric for the closing line; ``undefined`` for None (no pixel counted)."""
    return "undefined" if x is None else f"{x:.{digits}f}{unit}"


def summary(run_dir: object, metrics: dict) -> str:
    """The closing line of a run: test PSNR first, since it is what the README promises."""
    parts = [f"{metrics['split']} PSNR {metrics['psnr']:.2f} dB", f"SSIM {metrics['ssim']:.4f}"]
    if "cc_psnr" in metrics:  # after a colour fit of each render to its image (evaluate.py)
        parts.append(f"cc_psnr {metrics['cc_psnr']:.2f} dB  cc_ssim {metrics['cc_ssim']:.4f}")
    if "lpips" in metrics:
        parts.append(f"LPIPS {metrics['lpips']:.4f}")
    if "masked_psnr" in metrics:
        parts.append(f"masked PSNR {_value(metrics['masked_psnr'], 2, ' dB')}")
    secs = metrics.get("train_seconds") or 0.0
    parts.append(
        f"{metrics['n_views']} views, {metrics['n_gaussians']} Gaussians, "
        f"{metrics['step']} steps in {secs:.0f} s"
    )
    return "  ".join(parts) + f"\nrun folder: {run_dir}"


def write_outputs(
    run_dir: Path,
    cfg: TrainConfig,
    dataset: SceneDataset,
    params: dict[str, Tensor],
    history: dict[str, list[float]] | None,
    step: int,
    train_seconds: float | None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Evaluate on the test views and write metrics.json, renders, curve.png, the PLY.

    A metric that counted no pixel (a mask that hides every pixel of a view) is None, and an
    infinite one (the PSNR of a render equal to its image) is not JSON: both are written as
    ``null``, and ``log`` names them.
    """
    split = "test" if dataset.test else "train"
    frames = dataset.test or dataset.train
    lpips_fn = make_lpips() if cfg.lpips else None
    out_dir = run_dir / "renders" / split if cfg.save_renders else None
    result = evaluate(params, frames, cfg, dataset.background, out_dir=out_dir, lpips_fn=lpips_fn)
    metrics = {
        "step": step,
        "split": split,
        **{k: result[k] for k in METRICS if k in result},
        "n_views": result["n_views"],
        "n_gaussians": len(params["means"]),
        "train_seconds": train_seconds,
        "render_seconds_per_view": result["seconds_per_view"],
        "peak_rss_mib": peak_rss_mib(),
        "peak_device_mib": peak_device_mib(params["means"].device),
        "views": result["views"],
    }
    data, _ = strict_json_bytes(metrics)
    undefined = _undefined(metrics)
    if undefined:
        log(f"metrics.json: undefined (no pixel counted) or infinite metrics written as null: "
            f"{listed(undefined)}")
    atomic_write_bytes(run_dir / "metrics.json", data)
    if history is not None:
        save_curve(history, run_dir / "curve.png")
    if cfg.save_ply:
        export_ply(model_kind(cfg).export(params), run_dir / "point_cloud.ply", cfg.antialiased)
    return metrics


def listed(names: list[str], most: int = 6) -> str:
    """``names`` joined with commas: the first ``most`` of them, and how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _undefined(metrics: dict[str, Any]) -> list[str]:
    """The metrics of :data:`.evaluate.METRICS` that are None or not finite: ``masked_psnr``
    (the mean over the views), ``masked_psnr of view_003``."""
    def bad(x: object) -> bool:
        return x is None or (isinstance(x, float) and not math.isfinite(x))

    found = [k for k in METRICS if k in metrics and bad(metrics[k])]
    for view in metrics.get("views", []):
        found += [f"{k} of {view.get('name')}" for k in METRICS if k in view and bad(view[k])]
    return found


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far in MiB (the kernel's high-water mark), or
    None where the platform does not report it."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes there, KiB here


def peak_device_mib(device: torch.device) -> float | None:
    """The most memory this process's tensors held at once on ``device`` so far in MiB, for a
    CUDA device (``torch.cuda.max_memory_allocated``: the peak that gsplat's simple trainer
    reports as ``mem``; the caching allocator's reserve and the CUDA context come on top);
    None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def export_ply(params: dict[str, Tensor], path: str | Path, antialiased: bool = False) -> Path:
    """Write the parameters as a 3DGS PLY file (a model kind's ``export`` gives them as the
    file holds them); an antialiased model gets the ``SplatRenderMode: mip`` comment."""
    from ...io.ply import save_ply

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        cpu = {k: v.detach().cpu() for k, v in params.items()}  # the file is written from there
        save_ply(path, cpu, antialiased=antialiased)
    return path
