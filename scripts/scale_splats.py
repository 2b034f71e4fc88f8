"""Write and read every splat file format at scale: time and peak RSS per format (issue 36).

    PYTHONPATH=src python scripts/scale_splats.py [--gaussians 3000000] [--out DIR] [--json F]

The parent makes a random model of ``--gaussians`` Gaussians of SH degree 3 (float32, saved
as one ``.npy`` per key) and runs each write and each read in a fresh child process, so
that one format's peak does not mix with another's, with the ``tilesplat`` command's
environment defaults (``OMP_WAIT_POLICY=PASSIVE``, huge pages). A child reports:

- ``baseline``: its RSS after imports (Python, torch, NumPy, tilesplat), counted apart;
- ``peak``: VmHWM minus that baseline. A writer's peak includes the model it was handed
  (loaded before the write); a reader's includes the model it returns;
- ``seconds``: the write or read alone, and ``cpu_seconds`` (user + system) of it: on a
  shared machine the CPU time varies less than the wall time;
- for reads, ``max_err`` per key against the original (after the peak was taken), with the
  order of formats that reorder Gaussians undone by matching centres.

The table prints peak / model bytes: the goal is <= 2 for every row.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

BOX, GRID = 10.0, 1024
CELL = 2 * BOX / GRID
KEYS = ("means", "scales", "quats", "opacities", "sh0", "shN")
# name ending of each format (the suffix table of tilesplat.io.gaussians), plus gsplat's .pt
FORMATS = {"ply": "model.ply", "compressed-ply": "model.compressed.ply",
           "splat": "model.splat", "spz": "model.spz", "sog": "model.sog",
           "glb": "model.glb", "gsplat-ckpt": "ckpt_0_rank0.pt"}  # fmt: skip


def make_model(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A random model of ``n`` Gaussians, SH degree 3: means [N, 3] in a 20-unit box, each
    near the centre of its own cell of a 1024^3 grid (so a reader's rows can be matched to
    the original's by their cell, whatever order the format stores), scales
    [N, 3] logs, quats [N, 4], opacities [N], sh0 [N, 1, 3], shN [N, 15, 3], float32."""
    rng = np.random.default_rng(seed)

    def f32(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
        return rng.random(shape, np.float32) * np.float32(hi - lo) + np.float32(lo)

    cells = np.unique(rng.integers(0, GRID**3, int(n * 1.05) + 16))  # distinct cells
    cells = rng.permutation(cells)[:n]
    if len(cells) < n:
        raise ValueError(f"at most ~{GRID**3 // 2} Gaussians")
    ijk = np.stack([cells // GRID**2, cells // GRID % GRID, cells % GRID], 1)
    means = ((ijk + 0.5 + f32(n, 3, lo=-0.2, hi=0.2)) * CELL - BOX).astype(np.float32)
    return {"means": means, "scales": f32(n, 3, lo=-6, hi=-2),
            "quats": f32(n, 4), "opacities": f32(n, lo=-4, hi=4),
            "sh0": f32(n, 1, 3, lo=-1.5, hi=1.5),
            "shN": f32(n, 15, 3, lo=-0.3, hi=0.3)}  # fmt: skip


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _load(folder: Path, mmap: str | None = None) -> dict[str, np.ndarray]:
    return {k: np.load(folder / f"{k}.npy", mmap_mode=mmap) for k in KEYS}


def _errors(model: dict[str, np.ndarray], got: dict) -> dict[str, float]:
    """Largest |difference| per key of ``got`` (tensors, any order) from ``model`` (memmaps),
    None for a key the format drops: rows matched by their grid cell, quaternions compared
    up to sign and norm."""
    got = {k: v.numpy() for k, v in got.items()}

    def by_cell(m: np.ndarray) -> np.ndarray:
        ijk = np.floor((np.asarray(m, np.float64) + BOX) / CELL).astype(np.int64)
        return np.argsort((ijk[:, 0] * GRID + ijk[:, 1]) * GRID + ijk[:, 2], kind="stable")

    mine, theirs = by_cell(model["means"]), by_cell(got["means"])
    out = {}
    for k in KEYS:
        a, b = np.asarray(model[k][mine], np.float32), got[k][theirs]
        if k == "quats":
            a = a / np.linalg.norm(a, axis=1, keepdims=True)
            b = b / np.linalg.norm(b, axis=1, keepdims=True)
            a = a * np.sign((a * b).sum(1, keepdims=True))
        out[k] = float(np.abs(a - b).max()) if a.shape == b.shape else None
    return out


def child(action: str, fmt: str, folder: Path) -> dict:
    """One write or read in this process: seconds, baseline and peak RSS (bytes)."""
    import resource

    import torch

    from tilesplat.io import gsplat_ckpt
    from tilesplat.io.gaussians import read_gaussians, save_gaussians

    baseline = _rss_kb("VmRSS")
    path = folder / FORMATS[fmt]
    if action == "write":
        splats = {k: torch.from_numpy(v) for k, v in _load(folder).items()}
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if fmt == "gsplat-ckpt":
            gsplat_ckpt.save_gsplat_checkpoint(path, splats, step=0)
        else:
            save_gaussians(path, splats)
        seconds = time.perf_counter() - t0
        report = {"bytes": path.stat().st_size}
    else:
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if fmt == "gsplat-ckpt":
            data = gsplat_ckpt.read_gsplat_checkpoint(path)[0]
        else:
            data = read_gaussians(path)
        seconds = time.perf_counter() - t0
        report = {}
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    report.update(seconds=seconds, cpu_seconds=cpu, baseline=baseline * 1024,
                  peak=(_rss_kb("VmHWM") - baseline) * 1024)  # fmt: skip
    if action == "read":
        report["max_err"] = _errors(_load(folder, "r"), data.gaussians)
    return report


def _command_env() -> dict[str, str]:
    """This environment with the ``tilesplat`` command's defaults where unset (OpenMP's
    wait policy PASSIVE, huge pages: tilesplat.command_env), so that a child measures what
    ``tilesplat export`` does."""
    import os

    from tilesplat.command_env import DEFAULTS

    return {**DEFAULTS, **os.environ}


def run_all(n: int, folder: Path, formats: list[str], in_process: bool = False) -> dict:
    """Every format written then read, each in a fresh child (or, ``in_process``, all in
    this process: quick, but the peaks then mix): the report (a dict)."""
    model = make_model(n)
    for k, v in model.items():
        np.save(folder / f"{k}.npy", v)
    model_bytes = sum(v.nbytes for v in model.values())
    del model
    report = {"gaussians": n, "sh_degree": 3, "model_bytes": model_bytes, "formats": {}}
    for fmt in formats:
        row = {}
        for action in ("write", "read"):
            if in_process:
                row[action] = child(action, fmt, folder)
                continue
            out = subprocess.run(
                [sys.executable, __file__, "--child", action, fmt, str(folder)],
                capture_output=True, text=True, check=False, env=_command_env(),
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"{action} {fmt} failed:\n{out.stderr[-3000:]}")
            row[action] = json.loads(out.stdout.strip().splitlines()[-1])
        report["formats"][fmt] = row
    return report


def table(report: dict) -> str:
    """The report as a Markdown table."""
    mb, model = 1 << 20, report["model_bytes"]
    lines = [f"{report['gaussians']} Gaussians, SH degree 3, model {model / mb:.0f} MB",
             "", "| format | file MB | write s (CPU s) | write peak MB (x model) | read s "
             "(CPU s) | read peak MB (x model) | baseline MB |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for fmt, row in report["formats"].items():
        w, r = row["write"], row["read"]
        lines.append(
            f"| {fmt} | {w['bytes'] / mb:.0f} | {w['seconds']:.1f} ({w['cpu_seconds']:.0f}) | "
            f"{w['peak'] / mb:.0f} ({w['peak'] / model:.2f}) | {r['seconds']:.1f} "
            f"({r['cpu_seconds']:.0f}) | {r['peak'] / mb:.0f} "
            f"({r['peak'] / model:.2f}) | {r['baseline'] / mb:.0f} |"
        )
    return "\n".join(lines)


def _render(g: dict, size: int = 192) -> torch.Tensor:
    """Images [4, size, size, 3] of Gaussians ``g`` (tensors) from four cameras around the
    box (CPU backend)."""
    import torch

    from tilesplat import rasterization

    views = []
    for yaw in (0.0, 1.6, 3.1, 4.7):
        eye = torch.tensor([30 * math.sin(yaw), -8.0, -30 * math.cos(yaw)])
        fwd = -eye / eye.norm()
        right = torch.linalg.cross(torch.tensor([0.0, 1.0, 0.0]), fwd)
        right /= right.norm()
        down = torch.linalg.cross(fwd, right)
        rot = torch.stack([right, down, fwd])  # world -> camera rows
        v = torch.eye(4)
        v[:3, :3], v[:3, 3] = rot, -rot @ eye
        views.append(v)
    f = size * 1.0
    ks = torch.tensor([[f, 0, size / 2], [0, f, size / 2], [0, 0, 1]]).expand(4, 3, 3)
    colors = torch.cat([g["sh0"], g["shN"]], 1)
    img, _, _ = rasterization(g["means"], g["quats"], g["scales"].exp(), g["opacities"].sigmoid(),
                              colors, torch.stack(views), ks, size, size, sh_degree=3,
                              backend="cpu")  # fmt: skip
    return img.clamp(0, 1)


def compare_sog(n: int, folder: Path, tool: Path) -> dict:
    """Our SOG and splat-transform's of one random model of ``n`` Gaussians: file bytes,
    write seconds and the PSNR (dB) of CPU renders of each against the original's."""
    import torch

    from tilesplat.io.gaussians import read_gaussians, save_gaussians

    model = {k: torch.from_numpy(v) for k, v in make_model(n).items()}
    save_gaussians(folder / "model.ply", model)
    t0 = time.perf_counter()
    save_gaussians(folder / "ours.sog", model)
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([str(tool), "-q", "-w", "-g", "cpu", str(folder / "model.ply"),
                    str(folder / "theirs.sog")], check=True, capture_output=True)  # fmt: skip
    theirs_s = time.perf_counter() - t0
    ref = _render(model)
    out = {"gaussians": n}
    for name, seconds in (("ours", ours_s), ("splat-transform", theirs_s)):
        file = folder / ("ours.sog" if name == "ours" else "theirs.sog")
        img = _render(read_gaussians(file).gaussians)
        mse = float(((img - ref) ** 2).mean())
        out[name] = {"bytes": file.stat().st_size, "seconds": seconds,
                     "psnr": 10 * math.log10(1 / max(mse, 1e-12))}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gaussians", type=int, default=3_000_000)
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated names")
    p.add_argument("--out", type=Path, help="folder for the files (default: a temp folder)")
    p.add_argument("--json", type=Path, help="write the report here too")
    p.add_argument("--compare-sog", type=Path, metavar="SPLAT_TRANSFORM",
                   help="instead: our SOG against this splat-transform's at --gaussians")
    p.add_argument("--in-process", action="store_true",
                   help="no child processes (quick; the peak RSS numbers then mix)")
    p.add_argument("--child", nargs=3, metavar=("ACTION", "FORMAT", "DIR"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], Path(args.child[2]))))
        return 0
    if args.compare_sog:
        with tempfile.TemporaryDirectory() as tmp:
            result = compare_sog(args.gaussians, Path(tmp), args.compare_sog)
        print(json.dumps(result, indent=1))
        return 0
    formats = args.formats.split(",")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        p.error(f"unknown formats {unknown}; known: {', '.join(FORMATS)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        report = run_all(args.gaussians, folder, formats, args.in_process)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
