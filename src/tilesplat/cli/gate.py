"""``tilesplat gate``: train two configs N times each and say whether the candidate holds up."""

from __future__ import annotations

import argparse

COMMAND = "gate"
HELP = "A/B gate: train a base and a candidate config N times each, compare time and PSNR"

_EPILOG = """\
Both configs are validated first, as tilesplat check does (with the --set overrides, which
apply to both). Then the runs go interleaved: base, cand, base, cand, ...; repeat k trains
both arms with seed SEED + k, each run in its own process and folder (OUT_DIR/base-rK,
OUT_DIR/cand-rK, with train.log), after a two-step warm-up run of each arm that compiles the
kernels it needs (not counted; --no-warmup skips it). Every run evaluates its test views during
training (every steps / 20 steps unless its config sets eval_every), for the time to PSNR: the
training seconds at which a run first reaches the base's mean final test PSNR - 0.1 dB, with
the paired ratio cand / base; OUT_DIR/time_to_psnr.png plots every run's test PSNR against
its training time. The table gives, per arm, mean ± σ over the repeats of the
process wall time, training time, steps/s, final test PSNR and SSIM, and the Gaussian count;
the deltas pair the repeats. OUT_DIR/gate.json holds every number (rewritten after each run).

verdict: FAIL when any run failed (shown with its error) or when the candidate's mean test
PSNR is more than --psnr-guard dB below the base's; else PASS.

exit status: 0 PASS, 1 FAIL, 2 bad arguments or an invalid config (nothing is trained).

example:
  tilesplat gate base.toml cand.toml --repeats 3 --set steps=3000 --out gate.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("base", metavar="BASE.toml", help="the base config")
    parser.add_argument("cand", metavar="CAND.toml", help="the candidate config")
    parser.add_argument("--repeats", type=int, default=3,
                        help="trainings per arm (default: %(default)s)")
    parser.add_argument("--psnr-guard", type=float, default=0.1, metavar="DB",
                        help="largest allowed drop of the mean test PSNR (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a key in both configs (repeatable)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first repeat; repeat k uses SEED + k (default: 0)")
    parser.add_argument("--out-dir", default=None, metavar="DIR",
                        help="folder of the runs (default: runs/gate, numbered when it exists)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="end a run that takes longer and count it as failed")
    parser.add_argument("--out", default=None, metavar="FILE.json",
                        help="also write the result to this JSON file")
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the two-step run of each arm that first compiles its kernels "
                             "(when they are in Numba's cache already)")


def run(args: argparse.Namespace) -> int:
    from ..bench.gate import (
        check_gate_arguments,
        format_gate,
        gate_dir,
        run_gate,
        write_json,
    )
    from ..train.loop.run import checked_config

    check_gate_arguments(args.repeats, args.psnr_guard, args.timeout)
    base, base_layout = checked_config(args.base, args.overrides)
    cand, cand_layout = checked_config(args.cand, args.overrides)
    print(f"{args.base}: valid; data: {base_layout}")
    print(f"{args.cand}: valid; data: {cand_layout}")
    out_dir = gate_dir(args.out_dir)
    result = run_gate(base, cand, out_dir, repeats=args.repeats, psnr_guard=args.psnr_guard,
                      seed=args.seed, timeout=args.timeout, names=(args.base, args.cand),
                      log=lambda line: print(line, flush=True), warmup=not args.no_warmup)
    print(format_gate(result))
    print(f"wrote {out_dir / 'gate.json'}")
    if args.out:
        write_json(result, args.out)
        print(f"wrote {args.out}")
    return 0 if result["verdict"] == "PASS" else 1
