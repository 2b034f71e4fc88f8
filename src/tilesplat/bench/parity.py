"""Parity between two arms and self-noise of one arm, tensor by tensor.

An element fails parity only when both its absolute and its relative difference exceed their
tolerances (1e-4 each by default, DESIGN.md); the relative difference of two values is
``|a - b| / max(|a|, |b|)`` (0 when both are 0). Integer tensors go through the same rule, so
they must match exactly. ``isect_ids`` are compared as two tensors: the (image, tile) key
(exact) and the depth stored in their low 32 bits (a float).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..data.scenes import Scene
from .arms import Arm, check_usable, parse_arm
from .replay import is_run_spec, open_run, run_parity_on_run, run_self_noise_on_run
from .stages import Inputs, make_inputs, staged_pass, upstream_gradient
from .timing import NullTimer

ATOL = 1e-4
RTOL = 1e-4

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


def compare(a: Tensor, b: Tensor, atol: float = ATOL, rtol: float = RTOL) -> dict[str, Any]:
    """Element-wise comparison of ``a`` (the first arm) and ``b``; see the module docstring."""
    row: dict[str, Any] = {"numel_a": int(a.numel()), "numel_b": int(b.numel()),
                           "shape_a": list(a.shape), "shape_b": list(b.shape)}
    if a.shape != b.shape:
        row.update(max_abs=None, max_rel=None, max_rel_where_abs_fails=None, n_fail=None,
                   passed=False, note="shapes differ")
        return row
    x = a.detach().to("cpu", torch.float64)
    y = b.detach().to("cpu", torch.float64)
    finite = torch.isfinite(x) & torch.isfinite(y)
    same_nonfinite = ~finite & ((x == y) | (torch.isnan(x) & torch.isnan(y)))
    diff = (x - y).abs()
    scale = torch.maximum(x.abs(), y.abs())
    rel = torch.where(scale > 0, diff / scale.clamp_min(1e-300), torch.zeros_like(diff))
    bad = finite & (diff > atol) & (rel > rtol)
    bad |= ~finite & ~same_nonfinite
    n_fail = int(bad.sum())
    abs_fails = finite & (diff > atol)
    row.update(
        max_abs=float(diff[finite].max()) if bool(finite.any()) else 0.0,
        max_rel=float(rel[finite].max()) if bool(finite.any()) else 0.0,
        # the relative difference that decides: over the elements beyond atol
        max_rel_where_abs_fails=float(rel[abs_fails].max()) if bool(abs_fails.any()) else 0.0,
        n_fail=n_fail,
        passed=n_fail == 0,
    )
    if n_fail:
        idx = int(torch.nonzero(bad.reshape(-1))[0])
        row["first_fail"] = {"flat_index": idx, "a": float(x.reshape(-1)[idx]),
                             "b": float(y.reshape(-1)[idx])}
    return row


def compare_radii(a: Tensor, b: Tensor) -> dict[str, Any]:
    """Integer radii: equal, or one pixel apart (a ``ceil`` on an integer boundary)."""
    row = compare(a, b, atol=1.0, rtol=0.0)
    if a.shape == b.shape:
        diff = a.detach().to("cpu", torch.int64) - b.detach().to("cpu", torch.int64)
        row["off_by_one"] = int((diff.abs() == 1).sum())
    return row


def compare_results(res_a: dict[str, Any], res_b: dict[str, Any], atol: float = ATOL,
                    rtol: float = RTOL) -> list[dict[str, Any]]:
    """One row per tensor of two staged passes (name, kind, counts, diffs, passed)."""
    fa, fb = flatten_results(res_a), flatten_results(res_b)
    rows = []
    for name in list(fa) + [n for n in fb if n not in fa]:
        if name not in fa or name not in fb:
            rows.append({"name": name, "kind": (fa.get(name) or fb[name])[0], "passed": False,
                         "note": "missing in one arm"})
            continue
        if name == "radii":
            rows.append({"name": name, "kind": fa[name][0],
                         **compare_radii(fa[name][1], fb[name][1])})
            continue
        rows.append({"name": name, "kind": fa[name][0], **compare(fa[name][1], fb[name][1],
                                                                   atol, rtol)})
    return rows


def _load(scene: Scene | str, dtype: torch.dtype) -> Scene:
    from ..data.scenes import load_scene

    return load_scene(scene, dtype=dtype) if isinstance(scene, str) else scene


def _arm(spec: Arm | str) -> Arm:
    arm = spec if isinstance(spec, Arm) else parse_arm(spec)
    check_usable(arm)
    return arm


def run_parity(
    scene: Scene | str,
    arm_a: Arm | str,
    arm_b: Arm | str,
    sh_degree: int = 3,
    tile_size: int = 16,
    seed: int = 0,
    atol: float = ATOL,
    rtol: float = RTOL,
    dtype: torch.dtype = torch.float32,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Runs one staged pass per arm under one shared upstream gradient and compares them.

    The second arm's stages are fed the first arm's stage inputs (see ``staged_pass``), so
    every op is compared on identical inputs. ``radii`` are integers from a ``ceil`` and may
    differ by one pixel where the float radius sits on an integer: such elements are counted
    (``off_by_one``) and pass; any larger difference fails.

    ``scene`` may be ``run:RUN_DIR``: then each arm runs one step of the run's trainer on
    its checkpoint (:func:`.replay.run_parity_on_run`: the loss, every parameter gradient
    under the checkpoint's names, the rasterizer's gradients, the tile offsets exactly and
    the intersection order, reported and not gated); ``sh_degree``, ``tile_size``, ``seed``
    and ``dtype`` are then the run's.

    Returns:
        dict with ``kind`` "parity", ``arms``, ``scene``, ``atol``, ``rtol``, ``tensors``
        (one row per tensor) and ``passed`` (every gated row passed).
    """
    if is_run_spec(scene):
        return run_parity_on_run(open_run(scene), _arm(arm_a), _arm(arm_b), atol, rtol, hook)
    sc = _load(scene, dtype)
    check_sh_degree(sh_degree)
    a, b = _arm(arm_a), _arm(arm_b)
    upstream = upstream_gradient(sc, seed)
    results: list[dict[str, Any]] = []
    for arm in (a, b):
        res = staged_pass(make_inputs(sc, arm, sh_degree, tile_size, upstream), arm, NullTimer(),
                          feed=results[0] if results else None)
        if hook is not None:
            hook(arm.spec, res)
        results.append(res)
    rows = compare_results(results[0], results[1], atol, rtol)
    return {
        "kind": "parity",
        "arms": [a.spec, b.spec],
        "scene": sc.name,
        "sh_degree": sh_degree,
        "atol": atol,
        "rtol": rtol,
        "tensors": rows,
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


def run_self_noise(
    scene: Scene | str,
    arms: list[Arm | str] | Arm | str,
    k: int = 3,
    sh_degree: int = 3,
    tile_size: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Self-noise of each arm: K forward + backward passes under one upstream gradient, and
    per gradient tensor the max abs / rel difference to the first pass (0 = deterministic).

    ``scene`` may be ``run:RUN_DIR``: each pass is then one step of the run's trainer on a
    fresh copy of its checkpoint (:func:`.replay.run_self_noise_on_run`), the loss included.

    Returns:
        dict with ``kind`` "self_noise", ``scene``, ``passes`` and ``arms`` (one entry per arm).
    """
    arm_list = [_arm(a) for a in ([arms] if isinstance(arms, (str, Arm)) else arms)]
    if not arm_list:
        raise ValueError("self-noise needs at least one arm")
    if is_run_spec(scene):
        return run_self_noise_on_run(open_run(scene), arm_list, k, hook)
    sc = _load(scene, dtype)
    check_sh_degree(sh_degree)
    upstream = upstream_gradient(sc, seed)
    out = [self_noise_of(make_inputs(sc, arm, sh_degree, tile_size, upstream), arm, k, hook)
           for arm in arm_list]
    return {"kind": "self_noise", "scene": sc.name, "passes": k, "sh_degree": sh_degree,
            "arms": out}


def check_sh_degree(sh_degree: int) -> None:
    if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 4:
        raise ValueError(f"sh_degree must be an int in 0..4, got {sh_degree!r}")
