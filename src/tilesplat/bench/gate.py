"""An A/B training gate: the same training run per arm, repeated, and a verdict.

``run_gate`` trains the base config and the candidate config ``repeats`` times each,
interleaved (base, cand, base, cand, ...), repeat k with seed ``seed + k`` for both arms, each
run in its own folder under ``out_dir`` and in its own process (``tilesplat train``,
:mod:`.gate_runs`), so that every run pays the same start-up and a crash stays in its run.
First a two-step run of each arm (``warmup-ARM``, not counted) compiles the kernels it needs
into Numba's cache, so that no timed run pays their compilation.
It then compares, per arm, the mean ± σ of the process wall time, the steps per second of
training, the final test PSNR and SSIM, the Gaussian count and the peak memory (the process's
resident set; on CUDA also the device's tensors), and pairs the repeats for the deltas
(candidate / base - 1 of the wall time and the memory, candidate - base of the PSNR).

Every run also evaluates its test views during training (every ``steps / EVAL_POINTS`` steps
when its config evaluates only at the end), and the gate reports, per arm, the **time to
PSNR**: the training time at which a run's test PSNR first reaches the base's mean final PSNR
minus ``TARGET_MARGIN_DB`` (how much sooner a recipe gets to the same quality), with the
paired ratio candidate / base, and draws ``time_to_psnr.png`` (test PSNR against training
time, every run) in the gate's folder.

The verdict is FAIL when any run failed (it is reported with its error, never dropped) or
when the candidate's mean PSNR is more than ``psnr_guard`` dB below the base's; else PASS.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from ..io.atomic import atomic_write_bytes
from ..train.config import TrainConfig
from .gate_plot import save_time_to_psnr
from .gate_runs import Log, run_one

SCHEMA = "tilesplat.gate/1"
ARMS = ("base", "cand")
METRICS = ("wall_s", "train_s", "steps_per_s", "psnr", "ssim", "cc_psnr", "gaussians",
           "peak_rss_mib", "peak_device_mib", "time_to_psnr_s")
# how many test evaluations a run makes when its config asks for none during training
EVAL_POINTS = 20
# the time to PSNR is to the base's mean final test PSNR minus this
TARGET_MARGIN_DB = 0.1


def check_gate_arguments(repeats: int, psnr_guard: float, timeout: float | None) -> None:
    """One-line errors naming the option (the CLI turns them into exit status 2)."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"--repeats must be an integer >= 1, got {repeats!r}")
    if not math.isfinite(psnr_guard) or psnr_guard < 0.0:
        raise ValueError(f"--psnr-guard must be a finite number >= 0, got {psnr_guard!r}")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0.0):
        raise ValueError(f"--timeout must be a number of seconds > 0, got {timeout!r}")


def gate_dir(out_dir: str | Path | None) -> Path:
    """``out_dir`` (refused when it holds a gate), else a fresh ``runs/gate[-k]``."""
    if out_dir:
        path = Path(out_dir)
        if (path / "gate.json").exists() or any((path / f"{arm}-r0").exists() for arm in ARMS):
            raise ValueError(f"--out-dir {path} already holds a gate; choose another folder")
        return path
    base = path = Path("runs") / "gate"
    k = 1
    while path.exists():
        k += 1
        path = base.with_name(f"gate-{k}")
    return path


# --- the gate ------------------------------------------------------------------------------


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "mean": statistics.fmean(values) if values else None,
        "std": statistics.stdev(values) if len(values) > 1 else (0.0 if values else None),
    }


def _paired_pct(pairs: list[dict[str, dict[str, Any]]], key: str) -> dict[str, Any]:
    """Statistics of candidate / base - 1 of ``key``, in percent, over the pairs where both
    runs have it (and the base's is not 0)."""
    return _stats([100.0 * (p["cand"][key] / p["base"][key] - 1.0) for p in pairs
                   if p["cand"].get(key) is not None and p["base"].get(key)])


def time_to(curve: list[list[float]], target: float) -> float | None:
    """The first training time of ``curve`` ([seconds, step, PSNR] rows) whose PSNR reaches
    ``target``; None when none does."""
    return next((t for t, _, psnr in curve if psnr >= target), None)


def with_evaluations(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` evaluating its test views during training: its own ``eval_every``, else every
    ``steps / EVAL_POINTS`` steps (at least 1)."""
    if cfg.eval_every:
        return cfg
    return cfg.replace(eval_every=max(1, cfg.steps // EVAL_POINTS))


def summarize_gate(runs: list[dict[str, Any]], psnr_guard: float) -> dict[str, Any]:
    """Per-arm statistics, paired deltas and the verdict of the gate's ``runs``.

    Each run is a row of :func:`run_one` with ``arm`` and ``repeat`` added. A run's
    ``time_to_psnr_s`` (set here) is when its test PSNR first reached the base's mean final
    PSNR minus ``TARGET_MARGIN_DB`` (None if it never did, or before the base has a run).
    """
    base_ok = [r["psnr"] for r in runs if r["arm"] == "base" and r["ok"]]
    target = statistics.fmean(base_ok) - TARGET_MARGIN_DB if base_ok else None
    for r in runs:
        if r["ok"]:
            r["time_to_psnr_s"] = (None if target is None
                                   else time_to(r.get("curve") or [], target))
    arms = {}
    for arm in ARMS:
        ok = [r for r in runs if r["arm"] == arm and r["ok"]]
        arms[arm] = {
            "runs": sum(r["arm"] == arm for r in runs),
            "ok": len(ok),
            **{k: _stats([r[k] for r in ok if r.get(k) is not None]) for k in METRICS},
            "reached_psnr": sum(r.get("time_to_psnr_s") is not None for r in ok),
        }
    by_repeat: dict[int, dict[str, dict[str, Any]]] = {}
    for r in runs:
        if r["ok"]:
            by_repeat.setdefault(r["repeat"], {})[r["arm"]] = r
    pairs = [p for _, p in sorted(by_repeat.items()) if len(p) == 2]
    deltas = {
        "wall_pct": _paired_pct(pairs, "wall_s"),
        "train_time_pct": _paired_pct(pairs, "train_s"),
        "psnr_db": _stats([p["cand"]["psnr"] - p["base"]["psnr"] for p in pairs]),
        # colour-corrected (what appearance compensation is judged by: post_processing)
        "cc_psnr_db": _stats([p["cand"]["cc_psnr"] - p["base"]["cc_psnr"] for p in pairs
                              if p["cand"].get("cc_psnr") is not None
                              and p["base"].get("cc_psnr") is not None]),
        "time_to_psnr_ratio": _stats(
            [
                p["cand"]["time_to_psnr_s"] / p["base"]["time_to_psnr_s"]
                for p in pairs
                if p["cand"]["time_to_psnr_s"] is not None and p["base"]["time_to_psnr_s"]
            ]
        ),
        "peak_rss_pct": _paired_pct(pairs, "peak_rss_mib"),
        "peak_device_pct": _paired_pct(pairs, "peak_device_mib"),
        "pairs": len(pairs),
    }
    reasons = []
    failed = [r for r in runs if not r["ok"]]
    if failed:
        reasons.append(f"{len(failed)} run(s) failed")
    pb, pc = arms["base"]["psnr"]["mean"], arms["cand"]["psnr"]["mean"]
    if pb is None or pc is None:
        reasons.append("an arm has no finished run: PSNR not compared")
        psnr_delta = None
    else:
        psnr_delta = pc - pb
        if psnr_delta < -psnr_guard:
            reasons.append(
                f"candidate PSNR {pc:.2f} dB is {-psnr_delta:.2f} dB below the base's "
                f"{pb:.2f} dB (guard {psnr_guard:g} dB)"
            )
    deltas["psnr_of_means_db"] = psnr_delta
    versions = {(r["code"]["commit"], r["code"]["dirty"]) for r in runs if r.get("code")}
    notes = []
    if len(versions) > 1:
        notes.append(
            "the tilesplat source changed between runs (commits "
            + ", ".join(sorted(str(c)[:10] + ("+dirty" if d else "") for c, d in versions))
            + "): compare with care"
        )
    return {
        "arms": arms,
        "deltas": deltas,
        "target_psnr_db": target,
        "verdict": "FAIL" if reasons else "PASS",
        "reasons": reasons,
        "notes": notes,
    }


def run_gate(
    base: TrainConfig,
    cand: TrainConfig,
    out_dir: str | Path,
    repeats: int = 3,
    psnr_guard: float = 0.1,
    seed: int = 0,
    timeout: float | None = None,
    names: tuple[str, str] = ("base", "cand"),
    log: Log = print,
    warmup: bool = True,
) -> dict[str, Any]:
    """Trains both configs ``repeats`` times, interleaved; the gate's JSON-ready result.

    Args:
        base, cand: validated configs (their ``seed`` and ``run_dir`` are replaced).
        out_dir: the gate's folder: ``base-r0``, ``cand-r0``, ... and ``gate.json``.
        seed: repeat k trains both arms with seed ``seed + k``.
        timeout: seconds a run may take before it is ended and counted as failed.
        names: how the arms are shown (e.g. their config files).
        warmup: first a two-step run of each arm, not counted, that compiles its kernels.
    """
    check_gate_arguments(repeats, psnr_guard, timeout)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    configs = {"base": with_evaluations(base.validate()),
               "cand": with_evaluations(cand.validate())}
    label = dict(zip(ARMS, names, strict=True))
    total = 2 * repeats
    log(
        f"gate: base = {names[0]}, cand = {names[1]}; {repeats} repeat(s), seeds "
        f"{', '.join(str(seed + k) for k in range(repeats))}; {total} runs in {out}"
    )
    for arm in ARMS if warmup else ():  # compile every kernel an arm runs before timing
        warm = configs[arm].replace(steps=2, eval_every=1, save_ply=False,
                                   save_renders=False, checkpoint_every=0)
        row = run_one(warm, out / f"warmup-{arm}", timeout)
        log(f"warm-up of {arm} (2 steps, not counted): "
            + ("ok" if row["ok"] else f"FAILED: {row['error']}"))
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    for k in range(repeats):
        for arm in ARMS:
            i = len(runs) + 1
            run_dir = out / f"{arm}-r{k}"
            tag = f"[{i}/{total}] {arm} r{k} (seed {seed + k})"
            log(f"{tag}: training into {run_dir}")
            cfg = configs[arm].replace(seed=seed + k)
            row = run_one(
                cfg, run_dir, timeout, heartbeat=lambda line, t=tag: log(f"  {t}: {line}")
            )
            row.update(arm=arm, repeat=k)
            runs.append(row)
            if row["ok"]:
                log(
                    f"{tag}: done in {row['wall_s']:.0f} s: PSNR {row['psnr']:.2f} dB, "
                    f"{row['steps']} steps in {row['train_s']:.0f} s, {row['gaussians']} Gaussians"
                )
            else:
                log(f"{tag}: FAILED after {row['wall_s']:.0f} s: {row['error']}")
            summary = summarize_gate(runs, psnr_guard)
            result = {
                "schema": SCHEMA,
                "kind": "gate",
                **summary,
                "arms": {
                    a: {
                        "name": label[a],
                        **summary["arms"][a],
                        "config": configs[a].as_dict(),
                    }
                    for a in ARMS
                },
                "repeats": repeats,
                "seeds": [seed + j for j in range(repeats)],
                "psnr_guard_db": psnr_guard,
                "timeout_s": timeout,
                "runs": runs,
                "finished": i == total,
            }
            write_json(result, out / "gate.json")  # after every run: a partial gate survives
            save_time_to_psnr(result, out / "time_to_psnr.png")
    return result


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    """The result as strict JSON (NaN refused), written atomically."""
    text = json.dumps(result, indent=1, allow_nan=False)
    return atomic_write_bytes(Path(path), text.encode("utf-8"))


# --- the table -----------------------------------------------------------------------------


def _pm(s: dict[str, Any], fmt: str) -> str:
    if s["mean"] is None:
        return "-"
    return f"{s['mean']:{fmt}} ± {s['std']:{fmt.lstrip('+')}}"


def _reached(arm: dict[str, Any]) -> str:
    """The arm's time to PSNR, and how many of its runs reached it."""
    return f"{_pm(arm['time_to_psnr_s'], '.1f')} ({arm['reached_psnr']}/{arm['ok']})"


def _device_peak_rows(arms: dict[str, Any], d: dict[str, Any]) -> list[tuple[str, ...]]:
    """The table's row of the CUDA device's peak memory (``peak_device_mib``), where an arm
    ran on one; none for runs on the CPU."""
    if all(arms[arm]["peak_device_mib"]["n"] == 0 for arm in ARMS):
        return []
    pct = d["peak_device_pct"]
    return [("peak device MiB", _pm(arms["base"]["peak_device_mib"], ".0f"),
             _pm(arms["cand"]["peak_device_mib"], ".0f"),
             _pm(pct, "+.1f") + " %" if pct["n"] else "-")]


def format_gate(result: dict[str, Any]) -> str:
    """The gate as a text table, the failed runs with their errors, and the verdict."""
    arms, d = result["arms"], result["deltas"]
    rows = [
        ("", result["arms"]["base"]["name"], result["arms"]["cand"]["name"], "Δ (paired)"),
        (
            "wall s",
            _pm(arms["base"]["wall_s"], ".1f"),
            _pm(arms["cand"]["wall_s"], ".1f"),
            _pm(d["wall_pct"], "+.1f") + " %" if d["pairs"] else "-",
        ),
        (
            "train s",
            _pm(arms["base"]["train_s"], ".1f"),
            _pm(arms["cand"]["train_s"], ".1f"),
            _pm(d["train_time_pct"], "+.1f") + " %" if d["pairs"] else "-",
        ),
        (
            "steps/s",
            _pm(arms["base"]["steps_per_s"], ".2f"),
            _pm(arms["cand"]["steps_per_s"], ".2f"),
            "",
        ),
        (
            "test PSNR dB",
            _pm(arms["base"]["psnr"], ".2f"),
            _pm(arms["cand"]["psnr"], ".2f"),
            _pm(d["psnr_db"], "+.2f") + f" (guard -{result['psnr_guard_db']:g})"
            if d["pairs"]
            else "-",
        ),
        ("test SSIM", _pm(arms["base"]["ssim"], ".4f"), _pm(arms["cand"]["ssim"], ".4f"), ""),
        (
            "cc PSNR dB",
            _pm(arms["base"]["cc_psnr"], ".2f"),
            _pm(arms["cand"]["cc_psnr"], ".2f"),
            _pm(d["cc_psnr_db"], "+.2f") if d["cc_psnr_db"]["n"] else "-",
        ),
        (
            "s to " + ("-" if result.get("target_psnr_db") is None
                       else f"{result['target_psnr_db']:.2f} dB"),
            _reached(arms["base"]),
            _reached(arms["cand"]),
            _pm(d["time_to_psnr_ratio"], ".2f") + " x" if d["time_to_psnr_ratio"]["n"] else "-",
        ),
        (
            "Gaussians",
            _pm(arms["base"]["gaussians"], ".0f"),
            _pm(arms["cand"]["gaussians"], ".0f"),
            "",
        ),
        (
            "peak MiB",
            _pm(arms["base"]["peak_rss_mib"], ".0f"),
            _pm(arms["cand"]["peak_rss_mib"], ".0f"),
            _pm(d["peak_rss_pct"], "+.1f") + " %" if d["peak_rss_pct"]["n"] else "-",
        ),
        *_device_peak_rows(arms, d),
        (
            "runs ok",
            f"{arms['base']['ok']}/{arms['base']['runs']}",
            f"{arms['cand']['ok']}/{arms['cand']['runs']}",
            "",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for r in result["runs"]:
        if not r["ok"]:
            lines.append(f"FAILED {r['arm']} r{r['repeat']} ({r['run_dir']}): {r['error']}")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    verdict = result["verdict"]
    why = f": {'; '.join(result['reasons'])}" if result["reasons"] else ""
    lines.append(f"verdict: {verdict}{why}")
    return "\n".join(lines)
