"""Cost of 3DGUT's eval3d rasterizer against the 2D rasterizer at the same size: a thin caller
of ``tilesplat bench --eval3d`` (``tilesplat.bench.eval3d_cost``), kept for the commands in
the journal.

    .venv/bin/python scripts/bench_eval3d.py [--gaussians 1000 10000] [--size 320x240]
"""

from __future__ import annotations

import argparse
import sys

from tilesplat.cli import main as cli_main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gaussians", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--size", default="320x240", help="WxH")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    sys.exit(cli_main(["bench", "--eval3d", *map(str, args.gaussians), "--eval3d-size",
                       args.size, "--repeats", str(args.repeats)]))


if __name__ == "__main__":
    main()
