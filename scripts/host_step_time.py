#!/usr/bin/env python
"""The host's time per ``cuda`` training step with the kernels stubbed (no GPU needed).

Under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``, set here) with every kernel launch of
the ``cuda`` backend replaced by nothing and its output buffers zero-filled, a step of the
trainer is what the host does around the kernels: validation, autograd, PyTorch's glue ops,
the launchers' Python, Adam. Run it in two checkouts to compare them (issue 21's "host Python
time per step with the kernels stubbed, before and after")::

    PYTHONPATH=src python scripts/host_step_time.py --steps 40
    PYTHONPATH=/tmp/old/src python scripts/host_step_time.py --steps 40   # a base commit

Prints the median CPU ms per step (the process's CPU time, which a loaded machine disturbs
less than wall time) over ``--steps`` steady steps (after 3 warm-up steps), and the mean of
``--repeats`` such medians. The tensors are on the CPU, so PyTorch's glue runs its
(tiny) CPU kernels too: the number is the host's work, not a GPU step's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=64, help="image size of the scene")
    parser.add_argument("--points", type=int, default=2000, help="initial Gaussians")
    parser.add_argument("--set", nargs="*", default=[], help="more config keys, key=value")
    args = parser.parse_args(argv)

    import torch

    from tilesplat.backends.cuda import runtime

    def no_launch(kernel, grid, block, device, *a):
        runtime._stats["launches"] += 1

    def zeros(shape, dtype, device):
        return torch.zeros(shape, dtype=dtype, device=device)

    runtime.launch = no_launch
    runtime.empty = zeros
    for name, module in list(sys.modules.items()):  # the launchers imported them by name
        if name.startswith("tilesplat.backends.cuda."):
            if getattr(module, "launch", None) is not None and module is not runtime:
                module.launch = no_launch
            if getattr(module, "empty", None) is not None and module is not runtime:
                module.empty = zeros
    torch.set_num_threads(1)

    from tilesplat.data.dataset import load_dataset
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.trainer import Trainer

    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = {"true": True, "false": False}.get(value, value)
    medians = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_synthetic_dataset(os.path.join(tmp, "scene"), n_train=4, n_test=1,
                                         size=args.size)
        for r in range(args.repeats):
            cfg = TrainConfig(backend="cuda", steps=10_000, init_points=args.points,
                              sh_degree=3, sh_degree_interval=1, progress=False, lpips=False,
                              checkpoint_every=0, eval_every=0, log_every=10_000, seed=r,
                              **extra)
            trainer = Trainer(cfg, load_dataset(folder), os.path.join(tmp, f"run{r}"),
                              log=lambda s: None)
            times = []
            for step in range(3 + args.steps):
                t0 = time.process_time()
                trainer.train_step(step)
                if step >= 3:
                    times.append((time.process_time() - t0) * 1e3)
            medians.append(statistics.median(times))
    print(f"host CPU ms per step, kernels stubbed: {statistics.mean(medians):.3f} "
          f"(medians {', '.join(f'{m:.3f}' for m in medians)}; {args.steps} steps, "
          f"{args.size}px, {args.points} Gaussians, SH degree 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
