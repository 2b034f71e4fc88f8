"""The runs of a gate (:mod:`.gate`): one ``tilesplat train`` in a child process of its own,
with a heartbeat of its progress, ended when it runs past its timeout, and its row: exit
status, wall time, the error line of a failed run, or the metrics of a finished one and its
test PSNR over training time (``curve``).

A child process per run, rather than the trainer called here, so that every run pays the same
start-up (imports, kernel cache) and a crash or a hang stays in its run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..train.config import TrainConfig, save_config

HEARTBEAT_S = 30.0  # how often a running training's last progress line is shown
KILL_GRACE_S = 10.0  # between SIGTERM and SIGKILL of a run past its timeout

Log = Callable[[str], None]


def code_version() -> dict[str, Any]:
    """Where the tilesplat the runs import lives, and its git commit (None outside a
    checkout) and whether tracked files differ from it: a shared checkout can change under a
    long gate, and the gate says so."""
    src = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(src), *args],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return {
        "source": str(src),
        "commit": commit or None,
        "dirty": None if status is None else bool(status),
    }


def _last_line(path: Path, max_bytes: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    lines = [ln.strip() for ln in lines if ln.strip()]
    return lines[-1] if lines else ""


def error_of(log_path: Path, returncode: int | None) -> str:
    """The one line that says why a run failed: its CLI error, the exception, or the status."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("tilesplat train: error:"):
            return ln.removeprefix("tilesplat train: error:").strip()
    for ln in reversed(lines):
        if "Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0]:
            return ln
    status = f"exit status {returncode}" if returncode is not None else "no exit status"
    return f"{status}: {lines[-1]}" if lines else status


def _stop(proc: subprocess.Popen) -> None:
    """Ends the run's process group (the child started a session of its own), by its id."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def train_process(
    config_path: Path, log_path: Path, timeout: float | None, heartbeat: Log | None = None
) -> tuple[int | None, float, bool]:
    """Runs ``tilesplat train --config config_path`` in a child process, output to ``log_path``.

    Returns:
        (exit status or None, wall seconds, timed out). The child is ended (SIGTERM, then
        SIGKILL) when it runs past ``timeout`` seconds or this process is interrupted.
    """
    cmd = [sys.executable, "-m", "tilesplat.cli", "train", "--config", str(config_path)]
    t0 = time.perf_counter()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            while True:
                elapsed = time.perf_counter() - t0
                wait = HEARTBEAT_S if timeout is None else min(HEARTBEAT_S, timeout - elapsed)
                try:
                    proc.wait(timeout=max(wait, 0.0))
                    return proc.returncode, time.perf_counter() - t0, False
                except subprocess.TimeoutExpired:
                    pass
                if timeout is not None and time.perf_counter() - t0 >= timeout:
                    _stop(proc)
                    return proc.returncode, time.perf_counter() - t0, True
                line = _last_line(log_path)
                if heartbeat is not None and line:
                    heartbeat(line)
        except BaseException:
            _stop(proc)
            raise


def read_metrics(path: Path) -> dict[str, float]:
    """psnr, ssim, gaussians, steps, train seconds and peak memory (MiB: the process's
    resident set and the CUDA device's tensors, each None when not recorded) of a run's
    ``metrics.json``.

    Raises:
        ValueError: missing, not JSON, or a field of the wrong type.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: no readable metrics ({exc})") from exc
    out = {}
    for key, name in (
        ("psnr", "psnr"),
        ("ssim", "ssim"),
        ("n_gaussians", "gaussians"),
        ("step", "steps"),
        ("train_seconds", "train_s"),
    ):
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: {key} is not a number ({value!r})")
        out[name] = float(value)
    # optional, None when absent or not a number: the colour-corrected test PSNR and the
    # peaks are absent from runs of older versions, the RSS is None on Windows and the
    # device's off CUDA
    for key in ("cc_psnr", "peak_rss_mib", "peak_device_mib"):
        value = data.get(key)
        out[key] = float(value) if isinstance(value, (int, float)) and not isinstance(
            value, bool) else None
    return out


def read_test_curve(path: Path) -> list[list[float]]:
    """[training seconds, step, test PSNR] of every evaluation during a run (``history.json``'s
    ``test_time``, ``test_step``, ``test_psnr``), in order; [] when it evaluated only at the end.

    Raises:
        ValueError: missing, not JSON, or lists of other lengths or types.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: no readable history ({exc})") from exc
    cols = [data.get(k) if isinstance(data, dict) else None
            for k in ("test_time", "test_step", "test_psnr")]
    if not all(isinstance(c, list) for c in cols) or len({len(c) for c in cols}) != 1:
        raise ValueError(f"{path}: test_time, test_step and test_psnr are not lists of one length")
    curve = []
    for t, step, psnr in zip(*cols, strict=True):
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (t, step, psnr)):
            raise ValueError(f"{path}: a test evaluation is not numbers ({t!r}, {step!r}, "
                             f"{psnr!r})")
        curve.append([float(t), float(step), float(psnr)])
    return curve


def run_one(
    cfg: TrainConfig, run_dir: Path, timeout: float | None, heartbeat: Log | None = None
) -> dict[str, Any]:
    """Trains ``cfg`` into ``run_dir`` in a child process; the run's row of the gate."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = save_config(
        cfg.replace(run_dir=str(run_dir)), run_dir / "config.toml"
    )
    log_path = run_dir / "train.log"
    version = code_version()
    code, wall, timed_out = train_process(config_path, log_path, timeout, heartbeat)
    row: dict[str, Any] = {
        "run_dir": str(run_dir),
        "seed": cfg.seed,
        "code": version,
        "exit_status": code,
        "wall_s": wall,
        "log": str(log_path),
    }
    if timed_out:
        return {**row, "ok": False, "error": f"ran past --timeout {timeout:g} s and was ended"}
    if code != 0:
        return {**row, "ok": False, "error": error_of(log_path, code)}
    try:
        m = read_metrics(run_dir / "metrics.json")
        curve = read_test_curve(run_dir / "history.json")
    except ValueError as exc:
        return {**row, "ok": False, "error": str(exc)}
    steps_per_s = m["steps"] / m["train_s"] if m["train_s"] > 0 else None
    return {
        **row,
        "ok": True,
        "error": None,
        "train_s": m["train_s"],
        "steps": int(m["steps"]),
        "steps_per_s": steps_per_s,
        "psnr": m["psnr"],
        "ssim": m["ssim"],
        "cc_psnr": m["cc_psnr"],
        "gaussians": int(m["gaussians"]),
        "peak_rss_mib": m["peak_rss_mib"],
        "peak_device_mib": m["peak_device_mib"],
        # the test PSNR during training, then at the end (the metrics' own evaluation)
        "curve": curve if curve and curve[-1][1] == m["steps"]
        else [*curve, [m["train_s"], m["steps"], m["psnr"]]],
    }
