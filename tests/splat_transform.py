"""PlayCanvas's ``splat-transform`` 3.7.0 (Node 20) for the interoperability tests: found where
``make test`` installs it, run with a time limit, ended by its PID (and its process group).

``make test`` runs ``npm install @playcanvas/splat-transform@3.7.0`` into
``~/.cache/tilesplat/splat-transform-3.7.0`` (``TILESPLAT_SPLAT_TRANSFORM_DIR`` moves it).
The tests skip, with the reason, only where npm itself is absent; in CI (``CI=true``) or with
``TILESPLAT_REQUIRE_SPLAT_TRANSFORM=1`` a missing install fails them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

VERSION = "3.7.0"
_CACHE = Path.home() / ".cache" / "tilesplat" / f"splat-transform-{VERSION}"
DIR = Path(os.environ.get("TILESPLAT_SPLAT_TRANSFORM_DIR", _CACHE))
BIN = DIR / "node_modules" / ".bin" / "splat-transform"
SPZ_WASM = DIR / "node_modules" / "@adobe" / "spz" / "dist" / "spz.js"  # Niantic's library
TIMEOUT = 120  # seconds for one command (SOG's CPU k-means of a few thousand: ~2 s)


def require_splat_transform() -> Path:
    """The splat-transform executable, or a skip (npm absent, locally) / failure (CI)."""
    required = os.environ.get("CI") == "true" or os.environ.get(
        "TILESPLAT_REQUIRE_SPLAT_TRANSFORM") == "1"  # fmt: skip
    if BIN.is_file() and shutil.which("node"):
        return BIN
    if shutil.which("npm") is None and not required:
        pytest.skip("npm is not installed: the splat-transform tests need Node 20 and npm "
                    "(apt-get install nodejs npm), then make test")  # fmt: skip
    pytest.fail(f"splat-transform {VERSION} is not installed at {BIN}: run make test (it runs "
                f"npm install --prefix {DIR} @playcanvas/splat-transform@{VERSION})")  # fmt: skip


def run(args: list[str], cwd: Path, timeout: float = TIMEOUT) -> str:
    """stdout of ``node args...`` (a fresh process group, ended by its PID on timeout);
    ``AssertionError`` with its stderr when it fails."""
    proc = subprocess.Popen(
        ["node", *map(str, args)], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"{args[:3]} ran past {timeout} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers left behind by a clean exit
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{err[-2000:]}"
    return out


def convert(src: Path, dst: Path, *extra: str) -> Path:
    """``splat-transform -q -w [extra] src dst`` (``-g cpu``: SOG's k-means on the CPU)."""
    run([require_splat_transform(), "-q", "-w", "-g", "cpu", *extra, src, dst], cwd=dst.parent)
    return dst


def stats(path: Path) -> dict:
    """``splat-transform FILE --stats json null``: {"numGaussians", "shBands", "model",
    "columns": {name: {"min", "max", "mean", "stdDev"}}} (values in its display space:
    opacity through the sigmoid, scales through exp, f_dc as 0.5 + SH_C0 x)."""
    out = run([require_splat_transform(), "-q", path, "--stats", "json", "null"], cwd=path.parent)
    info = json.loads(out)
    lod = info["stats"][0]
    cols = {name: {k: lod["data"][k][i] for k in ("min", "max", "mean", "stdDev")}
            for i, name in enumerate(lod["columns"])}  # fmt: skip
    return {"numGaussians": info["numGaussians"], "shBands": info["shBands"],
            "model": info["model"], "columns": cols}  # fmt: skip
