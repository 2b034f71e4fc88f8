"""Parity between two arms and self-noise of one arm on a bench scene, tensor by tensor.

Each arm runs one staged pass (:mod:`.stages`) under one shared upstream gradient, the second
fed the first's stage inputs, and every output and gradient is compared in counts under the
tolerances and the per-tensor allowance of :mod:`.tolerance`. ``isect_ids`` are compared as
two tensors: the (image, tile) key (exact) and the depth stored in their low 32 bits (a
float). A run scene (``run:RUN_DIR``) is compared by :mod:`.replay` instead;
:mod:`.dispatch` sends each scene to one or the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..data.scenes import Scene
from .arms import Arm
from .stages import Inputs, make_inputs, staged_pass, upstream_gradient
from .timing import NullTimer
from .tolerance import (
    ATOL,
    RTOL,
    across_devices,
    allowed_failures,
    compare,
    compare_radii,
    policy,
    summary,
    verdict,
)

# Called with (arm spec, results of its staged pass) before comparing; tests use it to
# perturb an arm on purpose and check that parity fails.
Hook = Callable[[str, dict[str, Any]], None]


def split_isect_ids(isect_ids: Tensor) -> tuple[Tensor, Tensor]:
    """[n] int64 keys -> ((image, tile) key [n] int64, depth [n] float32)."""
    ids = isect_ids.detach().to("cpu").numpy().astype(np.int64)
    depth = (ids & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return torch.from_numpy(ids >> 32), torch.from_numpy(depth.copy())


def flatten_results(res: dict[str, Any]) -> dict[str, tuple[str, Tensor]]:
    """name -> (kind, tensor) for every output and gradient of a staged pass."""
    out: dict[str, tuple[str, Tensor]] = {}
    for name, t in res["outputs"].items():
        if name == "isect_ids":
            key, depth = split_isect_ids(t)
            out["isect_ids.tile_key"] = ("output", key)
            out["isect_ids.depth"] = ("output", depth)
        else:
            out[name] = ("output", t)
    for name, t in res["grads"].items():
        out[name] = ("gradient", t)
    return out


def compare_results(res_a: dict[str, Any], res_b: dict[str, Any], atol: float = ATOL,
                    rtol: float = RTOL, cross_device: bool = False) -> list[dict[str, Any]]:
    """One row per tensor of two staged passes (name, kind, counts, diffs, allowed failing
    elements, passed, verdict); ``cross_device``: the arms run on different device types."""
    fa, fb = flatten_results(res_a), flatten_results(res_b)
    rows = []
    for name in list(fa) + [n for n in fb if n not in fa]:
        if name not in fa or name not in fb:
            row = {"name": name, "kind": (fa.get(name) or fb[name])[0], "passed": False,
                   "note": "missing in one arm"}
        else:
            (kind, a), (_, b) = fa[name], fb[name]
            allowed = allowed_failures(name, a.numel(), cross_device)
            if name == "radii":
                row = {"name": name, "kind": kind, **compare_radii(a, b, allowed)}
            else:
                row = {"name": name, "kind": kind, **compare(a, b, atol, rtol, allowed)}
        row["verdict"] = verdict(row)
        rows.append(row)
    return rows


def parity_of_scene(sc: Scene, a: Arm, b: Arm, sh_degree: int, tile_size: int, seed: int,
                    atol: float, rtol: float, hook: Hook | None = None) -> dict[str, Any]:
    """Parity of arms ``a`` and ``b`` (usable, checked) on a loaded scene: the result of
    :func:`tilesplat.bench.run_parity` for a scene that is not a run."""
    upstream = upstream_gradient(sc, seed)
    results: list[dict[str, Any]] = []
    for arm in (a, b):
        res = staged_pass(make_inputs(sc, arm, sh_degree, tile_size, upstream), arm, NullTimer(),
                          feed=results[0] if results else None)
        if hook is not None:
            hook(arm.spec, res)
        results.append(res)
    across = across_devices(a, b)
    rows = compare_results(results[0], results[1], atol, rtol, cross_device=across)
    return {
        "kind": "parity",
        "arms": [a.spec, b.spec],
        "scene": sc.name,
        "sh_degree": sh_degree,
        "atol": atol,
        "rtol": rtol,
        "cross_device": across,
        "policy": policy(across),
        "tensors": rows,
        "summary": summary(rows),
        "passed": all(r["passed"] for r in rows),
    }


def self_noise_of(inp: Inputs, arm: Arm, k: int, hook: Hook | None = None) -> dict[str, Any]:
    """K staged passes of one arm: per gradient, the max difference to the first pass."""
    if k < 2:
        raise ValueError(f"self-noise needs K >= 2 passes, got {k}")
    first = None
    rows: dict[str, dict[str, Any]] = {}
    for _ in range(k):
        res = staged_pass(inp, arm, NullTimer())
        if hook is not None:
            hook(arm.spec, res)
        if first is None:
            first = res["grads"]
            rows = {n: {"max_abs": 0.0, "max_rel": 0.0, "bitwise_identical": True}
                    for n in first}
            continue
        for name, g in res["grads"].items():
            c = compare(first[name], g, atol=0.0, rtol=0.0)
            r = rows[name]
            r["max_abs"] = max(r["max_abs"], c["max_abs"] or 0.0)
            r["max_rel"] = max(r["max_rel"], c["max_rel"] or 0.0)
            r["bitwise_identical"] &= bool(torch.equal(first[name].cpu(), g.cpu()))
    return {
        "arm": arm.spec,
        "passes": k,
        "grads": rows,
        "max_rel": max(r["max_rel"] for r in rows.values()),
        "bitwise_identical": all(r["bitwise_identical"] for r in rows.values()),
    }


def self_noise_of_scene(sc: Scene, arms: list[Arm], k: int, sh_degree: int, tile_size: int,
                        seed: int, hook: Hook | None = None) -> dict[str, Any]:
    """Self-noise of each arm on a loaded scene: the result of
    :func:`tilesplat.bench.run_self_noise` for a scene that is not a run."""
    upstream = upstream_gradient(sc, seed)
    out = [self_noise_of(make_inputs(sc, arm, sh_degree, tile_size, upstream), arm, k, hook)
           for arm in arms]
    return {"kind": "self_noise", "scene": sc.name, "passes": k, "sh_degree": sh_degree,
            "arms": out}


def check_sh_degree(sh_degree: int) -> None:
    if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 4:
        raise ValueError(f"sh_degree must be an int in 0..4, got {sh_degree!r}")
