"""Hash the outputs and the gradients of the bench's staged pass on garden (the cpu arms of
both schemes and the torch reference), the tile lists left out: run on two trees and compare.

    PYTHONPATH=src .venv/bin/python scripts/house_grads.py
"""
import hashlib
import sys

import torch

from tilesplat.bench.arms import parse_arm
from tilesplat.bench.stages import make_inputs, staged_pass, upstream_gradient
from tilesplat.bench.timing import NullTimer
from tilesplat.data.scenes import load_scene

LISTS = ("isect_ids", "flatten_ids", "isect_offsets", "tiles_per_gauss", "last_ids")
sc = load_scene("garden")
for spec in ("cpu", "cpu:per_splat", "torch"):
    arm = parse_arm(spec)
    up = upstream_gradient(sc, 0)
    res = staged_pass(make_inputs(sc, arm, 3, 16, up), arm, NullTimer())
    for kind in ("outputs", "grads"):
        h = hashlib.sha256()
        for name in sorted(res[kind]):
            t = res[kind][name]
            if isinstance(t, torch.Tensor) and name not in LISTS:
                h.update(name.encode())
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
        print(spec, kind, sorted(res[kind]) if spec == "cpu" else "", h.hexdigest()[:16])
    sys.stdout.flush()
