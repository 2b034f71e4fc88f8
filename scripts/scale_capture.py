"""Train a real-size capture: time and peak RSS per stage (issue 36, the scale benchmark).

    PYTHONPATH=src python scripts/scale_capture.py [--views 150] [--width 3000] [--height 2000]
        [--steps 10] [--image-cache-mb 0] [--eval-max-views 4] [--out DIR] [--json F]
        [--splats 0]

The parent writes a COLMAP capture once into ``--out`` (kept there for the next run): the
ray-cast room of ``tilesplat.data.room`` (a textured object in a textured room, Lambertian)
seen from ``--views`` poses circling the object, as JPEG photos of ``--width`` x
``--height`` (quality 90), with ``--points`` initial points sampled on its surfaces (their
true positions and colours). A NumPy ray cast costs ~6 us a ray here (37 s for one view of
3000x2000), so a view is cast at 1/``--cast-factor`` of the size, one ray per pixel centre,
and brought to the full size with a bicubic resize and a grain of +-6 levels: the photos
have the size, the decoding cost and roughly the file size of photos, and a model can fit
them.

A fresh child process then trains it with ``downscale = 1`` on the CPU and reports, per
stage, the seconds and the stage's own peak RSS (VmHWM, reset before each stage through
``/proc/self/clear_refs``), and the RSS after it:

- ``baseline``: the process after importing torch and tilesplat (the fixed overhead);
- ``load``: ``load_scene`` of the capture (the decoding pool fills the image cache);
- ``init``: the trainer (model from the points, Adam);
- ``first_step``: step 1 (every kernel compiled or loaded from Numba's cache);
- ``steps``: the other ``--steps`` - 1 steps, with the test PSNR measured every
  ``--eval-every`` steps on ``--eval-max-views`` of the test views (``eval_max_views``);
- ``evaluation``: every test view rendered, scored and written as PNG, one at a time, in
  crops of ``eval_tile_pixels`` where a view is larger;
- ``export``: ``point_cloud.ply``.

The bound of the issue: peak RSS <= 1.5 x the decoded uint8 bytes of the training images +
the model (parameters and Adam's two moments) + the fixed overhead (``baseline``); with
``--image-cache-mb`` the cache's budget stands for the images' bytes. ``--splats N`` adds
``scripts/scale_splats.py``'s write and read of an N-Gaussian SH-3 PLY (that script owns the
3 M-Gaussian figures of every format).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
GRAIN = 6  # +- levels of noise on the upscaled cast (a photo's sensor noise)
JPEG_QUALITY = 90
MARKER = "capture.json"


def cast_view(viewmat: np.ndarray, K: np.ndarray, width: int, height: int) -> np.ndarray:
    """The room seen by a pinhole camera: [height, width, 3] float64 in [0, 1], one ray per
    pixel centre, cast in row blocks (bounded memory)."""
    from tilesplat.data import room

    R, t = viewmat[:3, :3], viewmat[:3, 3]
    eye = -R.T @ t
    out = np.empty((height, width, 3))
    rows = max(1, 250_000 // width)
    xs = np.arange(width) + 0.5
    for y0 in range(0, height, rows):
        ys = np.arange(y0, min(height, y0 + rows)) + 0.5
        u, v = np.meshgrid(xs, ys)
        cam = np.stack([(u.ravel() - K[0, 2]) / K[0, 0], (v.ravel() - K[1, 2]) / K[1, 1],
                        np.ones(u.size)], axis=1)
        d = cam @ R
        rgb = room.shade(eye, d / np.linalg.norm(d, axis=1, keepdims=True))
        out[y0:y0 + len(ys)] = rgb.reshape(len(ys), width, 3)
    return out


def surface_points(viewmats: np.ndarray, K: np.ndarray, width: int, height: int, n: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points on the surfaces the cameras see, (positions [n, 3], colours [n, 3] uint8):
    the hits of rays through random pixels of random views."""
    from tilesplat.data import room

    rng = np.random.default_rng(seed)
    views = rng.integers(0, len(viewmats), n)
    pts, cols = np.zeros((n, 3)), np.zeros((n, 3))
    for c in np.unique(views):
        sel = np.nonzero(views == c)[0]
        R, t = viewmats[c, :3, :3], viewmats[c, :3, 3]
        eye = -R.T @ t
        u, v = rng.uniform(0, width, len(sel)), rng.uniform(0, height, len(sel))
        d = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)], 1) @ R
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        hit, _, _ = room.trace(eye, d)
        pts[sel] = eye + hit[:, None] * d
        cols[sel] = room.shade(eye, d)
    return pts, np.round(cols * 255).astype(np.uint8)


def write_capture(root: Path, views: int, width: int, height: int, cast_factor: int,
                  points: int, seed: int = 0, log=print) -> Path:
    """A COLMAP capture (``images/*.jpg``, ``sparse/0`` in text) of the room, written once
    (``capture.json`` marks a finished one)."""
    from PIL import Image

    from tilesplat.data import room
    from tilesplat.data.colmap_format import ColmapCamera, ColmapImage
    from tilesplat.data.colmap_write import rotmat_to_qvec, write_model

    params = {"views": views, "width": width, "height": height, "cast_factor": cast_factor,
              "points": points, "seed": seed}
    marker = root / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return root
    (root / "images").mkdir(parents=True, exist_ok=True)
    viewmats = room.camera_poses(views, seed)
    K = room.intrinsics(width, height)
    cw, ch = max(16, width // cast_factor), max(16, height // cast_factor)
    K_cast = K.copy()
    K_cast[0] *= cw / width
    K_cast[1] *= ch / height
    rng = np.random.default_rng(seed)
    images = []
    start = time.perf_counter()
    for i, viewmat in enumerate(viewmats):
        name = f"view_{i:04d}.jpg"
        cast = np.round(cast_view(viewmat, K_cast, cw, ch) * 255).astype(np.uint8)
        big = Image.fromarray(cast)
        if (cw, ch) != (width, height):
            big = big.resize((width, height), Image.Resampling.BICUBIC)
        grain = rng.integers(-GRAIN, GRAIN + 1, (height, width, 1), dtype=np.int16)
        photo = np.clip(np.asarray(big).astype(np.int16) + grain, 0, 255).astype(np.uint8)
        Image.fromarray(photo).save(root / "images" / name, quality=JPEG_QUALITY)
        images.append(ColmapImage(i + 1, rotmat_to_qvec(viewmat[:3, :3]),
                                  viewmat[:3, 3].copy(), 1, name))
        if (i + 1) % 10 == 0:
            log(f"capture: {i + 1}/{views} views ({time.perf_counter() - start:.0f} s)")
    pts, cols = surface_points(viewmats, K, width, height, points, seed)
    cam = ColmapCamera(1, "PINHOLE", width, height, np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2]]))
    write_model(root / "sparse" / "0", [cam], images, pts, cols, fmt="txt")
    marker.write_text(json.dumps(params))
    return root


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM); 0 where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: ``5`` into clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run_stages(root: Path, run_dir: Path, steps: int, eval_every: int, eval_max_views: int,
               image_cache_mb: float, eval_tile_pixels: int) -> dict:
    """Train and evaluate the capture in this process; the seconds and peaks of each stage."""
    import torch

    import tilesplat.train.rundir.evaluate as evaluation
    from tilesplat.data.image_cache import CACHE
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.trainer import Trainer
    from tilesplat.train.rundir.outputs import export_ply
    from tilesplat.train.rundir.scene import load_scene

    report: dict = {"baseline": _status("VmRSS"), "stages": {}}
    torch.set_num_threads(max(1, torch.get_num_threads()))

    def stage(name: str, start: float, peak: int | None = None) -> None:
        report["stages"][name] = got = {"seconds": time.perf_counter() - start,
                                        "peak": peak if peak is not None else _status("VmHWM"),
                                        "rss": _status("VmRSS")}
        print(f"{name}: {got['seconds']:.1f} s, peak {got['peak'] / 2**30:.2f} GiB",
              file=sys.stderr, flush=True)
        _reset_peak()

    cfg = TrainConfig(
        data=str(root), downscale=1, steps=steps, eval_every=eval_every,
        eval_max_views=eval_max_views, image_cache_mb=image_cache_mb,
        eval_tile_pixels=eval_tile_pixels, progress=False, lpips=False, checkpoint_every=0,
        log_every=max(1, steps), save_renders=True,
    ).validate()
    _reset_peak()
    t = time.perf_counter()
    dataset = load_scene(cfg, log=lambda _: None)
    stage("load", t)
    t = time.perf_counter()
    trainer = Trainer(cfg, dataset, run_dir, log=lambda _: None)
    stage("init", t)

    counted: list[int] = []  # the views each evaluation during training scored
    evaluate = evaluation.evaluate

    def counting(params, frames, *args, **kw):
        counted.append(len(frames))
        return evaluate(params, frames, *args, **kw)

    evaluation.evaluate = counting  # what Trainer.test_psnr imports when it runs
    first: dict = {}
    train_step = trainer.train_step

    def timed(step: int):
        out = train_step(step)
        if step == 0:
            first.update(seconds=time.perf_counter() - t, peak=_status("VmHWM"))
            print(f"first_step: {first['seconds']:.1f} s, peak {first['peak'] / 2**30:.2f} GiB",
                  file=sys.stderr, flush=True)
            _reset_peak()
            first["after"] = time.perf_counter()
        return out

    trainer.train_step = timed  # type: ignore[method-assign]
    t = time.perf_counter()
    try:
        trainer.train()
    finally:
        evaluation.evaluate = evaluate
    report["stages"]["first_step"] = {"seconds": first["seconds"], "peak": first["peak"],
                                      "rss": _status("VmRSS")}
    stage("steps", first["after"])
    params = trainer.served_params()
    assert params is not None
    t = time.perf_counter()
    result = evaluate(params, dataset.test, cfg, dataset.background,
                      out_dir=run_dir / "renders" / "test")
    stage("evaluation", t)
    t = time.perf_counter()
    export_ply(trainer.model.export(params), run_dir / "point_cloud.ply", cfg.antialiased)
    stage("export", t)
    n_params = sum(int(v.numel()) for v in params.values())
    report.update(
        train_views=len(dataset.train), test_views=len(dataset.test),
        size=[dataset.train[0].width, dataset.train[0].height],
        train_uint8_bytes=sum(3 * f.width * f.height for f in dataset.train),
        gaussians=len(params["means"]),
        # the parameters and Adam's two moments, float32
        model_bytes=3 * 4 * n_params,
        cache_budget=CACHE.budget, cache_held=CACHE.held,
        eval_views_during_training=counted,
        metrics={k: result[k] for k in ("psnr", "ssim", "cc_psnr", "cc_ssim") if k in result},
        evaluated=[v["name"] for v in result["views"]],
        renders=sorted(p.name for p in (run_dir / "renders" / "test").glob("*.png")),
        history_test_psnr=trainer.history["test_psnr"],
    )
    return report


def bound(report: dict) -> dict:
    """The issue's bound on the peak RSS, and whether the run kept it."""
    images = report["train_uint8_bytes"]
    limit = report["baseline"] + report["model_bytes"] + 1.5 * images
    peak = max(s["peak"] for s in report["stages"].values())
    return {"peak": peak, "limit": limit, "holds": peak <= limit,
            "peak_over_images": (peak - report["baseline"] - report["model_bytes"]) / images}


def table(report: dict) -> str:
    """The stages as a markdown table (GiB, seconds)."""
    gib = 2.0**30
    lines = ["| stage | seconds | peak RSS (GiB) | RSS after (GiB) |",
             "| --- | ---: | ---: | ---: |",
             f"| baseline (after imports) | | | {report['baseline'] / gib:.2f} |"]
    for name, s in report["stages"].items():
        lines.append(f"| {name} | {s['seconds']:.1f} | {s['peak'] / gib:.2f} | "
                     f"{s['rss'] / gib:.2f} |")
    b = bound(report)
    lines.append(
        f"\n{report['train_views']} training views of {report['size'][0]}x{report['size'][1]}: "
        f"{report['train_uint8_bytes'] / gib:.2f} GiB as uint8; {report['gaussians']} Gaussians "
        f"({report['model_bytes'] / 2**20:.0f} MiB with Adam); image cache "
        f"{report['cache_held'] / 2**20:.0f} of {report['cache_budget'] / 2**20:.0f} MiB held; "
        f"peak {b['peak'] / gib:.2f} GiB against the bound {b['limit'] / gib:.2f} GiB "
        f"(baseline + model + 1.5 x the images): {'holds' if b['holds'] else 'EXCEEDED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--views", type=int, default=150)
    ap.add_argument("--width", type=int, default=3000)
    ap.add_argument("--height", type=int, default=2000)
    ap.add_argument("--cast-factor", type=int, default=4, help="ray cast at 1/this of the size")
    ap.add_argument("--points", type=int, default=20_000, help="initial points (Gaussians)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-max-views", type=int, default=4)
    ap.add_argument("--eval-tile-pixels", type=int, default=1 << 18)
    ap.add_argument("--image-cache-mb", type=float, default=0.0)
    ap.add_argument("--splats", type=int, default=0,
                    help="also scripts/scale_splats.py's PLY write and read of N Gaussians")
    ap.add_argument("--out", help="folder of the capture and the run (default: temporary)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--child", nargs=2, metavar=("CAPTURE", "RUN"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        report = run_stages(Path(args.child[0]), Path(args.child[1]), args.steps,
                            args.eval_every, args.eval_max_views, args.image_cache_mb,
                            args.eval_tile_pixels)
        print("RESULT " + json.dumps(report))
        return report
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.out or tmp)
        root = folder / f"capture-{args.views}-{args.width}x{args.height}"
        t = time.perf_counter()
        write_capture(root, args.views, args.width, args.height, args.cast_factor, args.points)
        written = time.perf_counter() - t
        run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=folder))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(root), str(run_dir),
               "--steps", str(args.steps), "--eval-every", str(args.eval_every),
               "--eval-max-views", str(args.eval_max_views),
               "--eval-tile-pixels", str(args.eval_tile_pixels),
               "--image-cache-mb", str(args.image_cache_mb)]
        env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
        # the child's stage lines go to this process's stderr as they come
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=False)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"the training child failed ({done.returncode}):\n{done.stdout}")
        report = json.loads(line[len("RESULT "):])
        report.update(capture_seconds=written, image_cache_mb=args.image_cache_mb,
                      capture_bytes=sum(p.stat().st_size for p in (root / "images").iterdir()),
                      bound=bound(report))
        print(table(report))
        if args.splats:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import scale_splats  # another engineer's script: its PLY figures, imported

            report["splats"] = scale_splats.run_all(args.splats, folder / "splats", ["ply"])
            print(scale_splats.table(report["splats"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
