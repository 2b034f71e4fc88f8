"""Load a capture of many large photos: time and peak RSS per stage (issue 36, images within
a memory budget).

    PYTHONPATH=src python scripts/scale_images.py [--photos 40] [--width 3000] [--height 2000]
        [--downscale 1] [--image-cache-mb 0] [--src src ...] [--out DIR] [--json F]

The parent writes a COLMAP capture of ``--photos`` JPEG photos of ``--width`` x ``--height``
(smooth random colour fields with grain, quality 90, so that a file is the size of a photo's)
once into ``--out``, then for each ``--src`` (a tree's ``src`` folder: ``src`` of this checkout,
and another checkout's to compare against) runs a fresh child process that:

- imports torch and tilesplat (``baseline``: its RSS then, counted apart);
- ``load``: ``load_dataset`` of the capture (seconds, and VmHWM minus the baseline);
- ``epoch``: reads every training view's ``frame.image`` once, as a pass of the trainer does
  (seconds, and the peak so far).

``image_cache_mb`` is passed to trees whose ``load_dataset`` takes it. The table prints the
peak over the bytes of the photos as uint8 and as float32.
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

CHILD = r"""
import inspect, json, sys, time
from pathlib import Path

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0

import torch  # noqa: F401
from tilesplat.data.dataset import load_dataset
root, downscale, cache_mb = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
base = status("VmRSS")
out = {"baseline": base}
kw = {"image_cache_mb": cache_mb} if "image_cache_mb" in inspect.signature(
    load_dataset).parameters else {}
t = time.perf_counter()
ds = load_dataset(root, downscale=downscale, test_every=0, **kw)
out["load"] = {"seconds": time.perf_counter() - t, "peak": status("VmHWM") - base,
               "rss": status("VmRSS") - base}
t = time.perf_counter()
checksum = 0.0
for f in ds.train:
    checksum += float(f.image[::97, ::89].sum())
out["epoch"] = {"seconds": time.perf_counter() - t, "peak": status("VmHWM") - base,
                "rss": status("VmRSS") - base}
out["views"] = len(ds.train)
out["checksum"] = checksum
try:
    from tilesplat.data.image_cache import CACHE
    out["cache"] = {"budget": CACHE.budget, "held": CACHE.held}
except ImportError:
    pass
print("RESULT " + json.dumps(out))
"""


def write_capture(root: Path, n: int, width: int, height: int, seed: int = 0) -> Path:
    """A COLMAP dataset of ``n`` JPEG photos (``images/``, ``sparse/0`` in text), once."""
    from PIL import Image

    from tilesplat.data.captures import orbit
    from tilesplat.data.colmap_format import ColmapCamera, ColmapImage
    from tilesplat.data.colmap_write import rotmat_to_qvec, write_model

    done = root / "sparse" / "0" / "images.txt"
    if done.is_file():
        return root
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images = []
    for i, viewmat in enumerate(orbit(n)):
        name = f"photo_{i:04d}.jpg"
        field = rng.integers(0, 256, (height // 50 + 2, width // 50 + 2, 3), dtype=np.uint8)
        big = np.asarray(Image.fromarray(field).resize((width, height), Image.Resampling.BICUBIC))
        grain = rng.integers(-12, 13, (height, width, 1), dtype=np.int16)
        photo = np.clip(big.astype(np.int16) + grain, 0, 255).astype(np.uint8)
        Image.fromarray(photo).save(root / "images" / name, quality=90)
        images.append(ColmapImage(i + 1, rotmat_to_qvec(viewmat[:3, :3]),
                                  viewmat[:3, 3].copy(), 1, name))
    focal = 0.8 * width
    cam = ColmapCamera(1, "PINHOLE", width, height,
                       np.array([focal, focal, width / 2, height / 2]))
    write_model(root / "sparse" / "0", [cam], images, rng.random((100, 3)),
                rng.integers(0, 256, (100, 3), dtype=np.uint8), fmt="txt")
    return root


def run_child(src: str, root: Path, downscale: int, cache_mb: float) -> dict:
    """One tree's load and pass in a fresh process (its own peak)."""
    env = {"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(downscale), str(cache_mb)],
                          capture_output=True, text=True, env=env, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"child of {src} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=40)
    ap.add_argument("--width", type=int, default=3000)
    ap.add_argument("--height", type=int, default=2000)
    ap.add_argument("--downscale", type=int, default=1)
    ap.add_argument("--image-cache-mb", type=float, default=0.0)
    ap.add_argument("--src", action="append", help="a tree's src folder (default: this one's)")
    ap.add_argument("--out", help="folder of the capture (default: a temporary one)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    srcs = args.src or [str(Path(__file__).resolve().parents[1] / "src")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp) / f"capture-{args.photos}-{args.width}x{args.height}"
        t = time.perf_counter()
        write_capture(root, args.photos, args.width, args.height)
        made = time.perf_counter() - t
        pixels = args.photos * (args.width // args.downscale) * (args.height // args.downscale)
        results = {"photos": args.photos, "size": [args.width, args.height],
                   "downscale": args.downscale, "image_cache_mb": args.image_cache_mb,
                   "write_seconds": made, "uint8_bytes": 3 * pixels,
                   "float32_bytes": 12 * pixels, "trees": {}}
        print(f"capture: {args.photos} photos of {args.width}x{args.height} at {root} "
              f"({made:.1f} s); as uint8 {3 * pixels / 2**30:.2f} GiB, as float32 "
              f"{12 * pixels / 2**30:.2f} GiB")
        for src in srcs:
            got = run_child(src, root, args.downscale, args.image_cache_mb)
            results["trees"][src] = got
            cache = got.get("cache")
            load = got["load"]
            print(f"{src}: load {load['seconds']:.1f} s, peak {load['peak'] / 2**30:.2f} GiB"
                  f" ({got['load']['peak'] / (12 * pixels):.2f}x float32, "
                  f"{load['peak'] / (3 * pixels):.2f}x uint8); epoch "
                  f"{got['epoch']['seconds']:.1f} s, peak {got['epoch']['peak'] / 2**30:.2f} GiB"
                  + (f"; cache held {cache['held'] / 2**20:.0f} of {cache['budget'] / 2**20:.0f}"
                     " MB" if cache else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
