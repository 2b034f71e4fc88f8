"""The machine a run measured, text tables of bench / parity / self-noise results, JSON output."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import tempfile
from typing import Any

import torch

from ..backends.vector_width import wide_vectors_on
from .stages import STAGE_TITLES
from .timing import cpu_threads
from .tolerance import summary, verdict


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """CPU model, threads, GPU, library versions and the date (UTC) of a run."""
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("numba", "numpy", "llvmlite", "numba_cuda"):
        try:
            mod = __import__(name)
            versions[name] = getattr(mod, "__version__", "unknown")
        except ImportError:
            continue
    from .. import __version__

    versions["tilesplat"] = __version__
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu_model": cpu_model(),
        # the CPU kernels' target asked for 512-bit vectors (backends/vector_width.py)
        "wide_vectors": wide_vectors_on(),
        "threads": cpu_threads(),
        "gpu": gpu,
        "platform": platform.platform(),
        "versions": versions,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
    }


def write_json(data: dict[str, Any], path: str) -> None:
    """Writes ``data`` to ``path`` atomically (a temporary file in the same folder, renamed)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bench-", suffix=".json.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(data), f, indent=1, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _clean(obj: Any) -> Any:
    """JSON-ready copy: non-finite floats become None, tuples lists, numpy scalars Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item"):  # numpy / torch scalars
        return _clean(obj.item())
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def _g(x: float | None, unit: str = "") -> str:
    """``x`` with an SI prefix: 1.23 G, 45.6 M, 7.89 k."""
    if x is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    line = lambda r: "| " + " | ".join(r) + " |"
    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def format_bench(res: dict[str, Any], markdown: bool = False) -> str:
    """The bench result as text (or a Markdown table): scene, ceiling, one column per arm."""
    sc, pairs, cal = res["scene"], res["pairs"], res["calibration"]
    m = res["machine"]
    lines = [
        f"machine: {m['cpu_model']}, threads {m['threads']}, torch {m['versions']['torch']}, "
        f"numba {m['versions'].get('numba', '-')}"
        + (", 512-bit vectors" if m.get("wide_vectors") else "") + f", {m['date_utc']}",
        f"scene {sc['name']}: {sc['gaussians']} Gaussians, {sc['cameras']} camera(s) "
        f"{sc['width']}x{sc['height']}, SH degree {sc['sh_degree']}, {sc['dtype']}, "
        f"{pairs['intersections']} intersections",
        f"pairs per pass: forward {pairs['forward']:,} and backward {pairs['backward']:,} "
        f"(exact, per the contract); bound {pairs['bound']:,} (tile pixels x tile list)",
        "ceiling: " + (f"{_g(cal['interleaved']['median'], 'pairs/s')} (micro-kernel on "
                       f"{cal['threads']} threads, median of 0.1 s runs interleaved with the arms; "
                       f"best standalone {_g(cal['pairs_per_s'], 'pairs/s')})"
                       if cal else "not calibrated"),
        *([f"run {sc['run']['run_dir']} at step {sc['run']['step']}: the training step is "
           f"the trainer's own ({sc['run']['training_step']}), {sc['run']['batch_size']} "
           "camera(s) per step"] if sc.get("run") else []),
        f"times: ms, median over {res['config']['repeats']} repeats of "
        f"{res['config']['iters']} iterations (mean ± σ); (x.x×) = speedup vs "
        f"{res['arms'][0]['spec']}",
        "",
    ]
    arms = res["arms"]
    rows = []
    for name, title in STAGE_TITLES.items():
        if name == "step":
            rows.append(["stages total"] + [_cell(a["ms"]["staged_total"], a is arms[0])
                                            for a in arms])
        rows.append([title] + [_cell(a["ms"][name], a is arms[0]) for a in arms])
        if name == "step":  # a run's trainer step, part by part (replay, CPU arms)
            for part in ("render", "loss", "backward", "adam"):
                if f"step_{part}" in arms[0]["ms"]:
                    rows.append([f"  step: {part}"] + [
                        _cell(a["ms"][f"step_{part}"], a is arms[0]) for a in arms])
    if any("gpu" in a["ms"]["step"] for a in arms):
        rows.append(["step GPU-busy ms"] + [
            f"{a['ms']['step']['gpu']['median']:.3f}" if "gpu" in a["ms"]["step"] else "-"
            for a in arms])
        rows.append(["step host overhead ms"] + [
            f"{a['ms']['step']['host_overhead_median']:.3f}" if "gpu" in a["ms"]["step"]
            else "-" for a in arms])
    if any(a.get("cuda_launches") for a in arms):
        rows.append(["step kernel launches"] + [
            f"{a['cuda_launches']['launches']:g}" if a.get("cuda_launches") else "-"
            for a in arms])
        rows.append(["step launcher Python ms"] + [
            f"{a['cuda_launches']['host_ms']['median']:.3f}" if a.get("cuda_launches") else "-"
            for a in arms])
    for d in ("forward", "backward"):
        rows.append([f"raster {d} pairs/s"] + [_rate(a["evals"][d]) for a in arms])
    rows.append(["peak memory"] + [_mem(a["peak_memory"]) for a in arms])
    rows.append(["parity vs first"] + [_gate_cell(a["parity_gate"]) for a in arms])
    header = ["", *[a["spec"] for a in arms]]
    lines.append(_markdown(header, rows) if markdown else _table(header, rows))
    if not res["parity_gate_passed"]:
        lines.append("\nPARITY FAIL (speedups withheld; run --parity for details):")
        lines += [f"  {a['spec']}: {a['parity_gate'].get('summary') or a['parity_gate']['failed']}"
                  for a in arms if not a["parity_gate"]["passed"]]
    return "\n".join(lines)


def _gate_cell(gate: dict[str, Any]) -> str:
    """``PASS (0 failing)``, ``PASS (3 failing, allowed)`` or ``FAIL (2 tensors, 80 failing)``."""
    n = gate.get("n_fail")
    if gate["passed"]:
        return "PASS" if n is None else (
            f"PASS ({n:,} failing{', allowed' if n else ''})")
    tail = "" if n is None else f", {n:,} failing"
    return f"FAIL ({len(gate['failed'])} tensor{'s' if len(gate['failed']) != 1 else ''}{tail})"


def _ms(x: float) -> str:
    """A time in ms, with as many digits as a noisy measurement deserves."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _cell(t: dict[str, Any], first: bool) -> str:
    s = f"{_ms(t['median'])} ({_ms(t['mean'])}±{_ms(t['std'])})"
    if not first:
        sp = t.get("speedup_vs_first")
        s += f" ({sp:.3g}×)" if sp is not None else " (-)"
    return s


def _rate(r: dict[str, Any]) -> str:
    s = _g(r["pairs_per_s"])
    pct = r["pct_of_ceiling"]
    return s + ("" if pct is None else f" ({pct:.2g}%)" if pct < 10 else f" ({pct:.0f}%)")


def _mem(m: dict[str, Any]) -> str:
    if m.get("peak_bytes") is None:
        return "-"
    s = f"{m['peak_bytes'] / 2**20:.0f} MiB"
    if m.get("delta_bytes") is not None:
        s += f" ({m['delta_bytes'] / 2**20:+.0f} in the step)"
    return s


def format_parity(res: dict[str, Any]) -> str:
    """One row per tensor: elements, failing elements and the number allowed, max abs / rel
    difference, and the verdict with its counts."""
    a, b = res["arms"]
    fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
    rows = []
    for r in res["tensors"]:
        if "numel_a" not in r:
            rows.append([r["name"], r["kind"], "-", "-", "-", "-", "-", "-", verdict(r)])
            continue
        numel = (f"{r['numel_a']:,}" if r["numel_a"] == r["numel_b"]
                 else f"{r['numel_a']:,}/{r['numel_b']:,}")
        rows.append([r["name"], r["kind"], numel,
                     "-" if r.get("n_fail") is None else f"{r['n_fail']:,}",
                     f"{r.get('allowed', 0):,}", fmt(r["max_abs"]), fmt(r["max_rel"]),
                     fmt(r["max_rel_where_abs_fails"]), r.get("verdict") or verdict(r)])
    head = (f"parity {a} vs {b} on {res['scene']} (SH degree {res['sh_degree']}): an element "
            f"fails when abs > {res['atol']:g} and rel > {res['rtol']:g}; "
            f"{res.get('policy', 'same device type: 0 failing elements per tensor')}")
    table = _table(["tensor", "kind", "elements", "failing", "allowed", "max abs", "max rel",
                    "max rel where abs fails", "result"], rows)
    line = res.get("summary") or summary(res["tensors"])
    return f"{head}\n{table}\nPARITY {line}"


def format_self_noise(res: dict[str, Any]) -> str:
    """Per arm and gradient: max abs / rel difference of K passes to the first."""
    lines = [f"self-noise on {res['scene']}: {res['passes']} forward+backward passes, "
             "max difference to the first"]
    for arm in res["arms"]:
        rows = [[name, f"{r['max_abs']:.3g}", f"{r['max_rel']:.3g}",
                 "yes" if r["bitwise_identical"] else "no"] for name, r in arm["grads"].items()]
        lines.append(f"\n{arm['arm']}: max rel {arm['max_rel']:.3g}, bitwise identical: "
                     f"{'yes' if arm['bitwise_identical'] else 'no'}")
        lines.append(_table(["gradient", "max abs", "max rel", "identical"], rows))
    return "\n".join(lines)
