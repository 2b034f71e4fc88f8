"""Tolerances of parity: when an element fails, how many failing elements a tensor may have,
and the one-line verdicts. Parity (:mod:`.parity`), the replay of a run (:mod:`.replay`), the
bench's parity gate (:mod:`.runner`) and the GPU smoke test (:mod:`.smoke`) share them.

An element fails parity only when both its absolute and its relative difference exceed their
tolerances (1e-4 each by default, DESIGN.md); the relative difference of two values is
``|a - b| / max(|a|, |b|)`` (0 when both are 0). Every tensor is reported with its element
count, its number of failing elements, the number it may have, and its max abs / rel
difference; it passes when the failing elements are within that number.

Threshold policy (how many failing elements a tensor may have; docs/gpu.md):

- **Same device type, deterministic arms** (``torch`` against ``cpu``): none. The CPU
  kernels meet this against the reference on every scene we measure, garden included, and a
  failing element there has so far always been a bug or a precision loss worth fixing (the
  CPU ``per_splat`` backward once failed 38 ``v_conics`` elements on garden).
- **Different device types** (``cpu`` against ``cuda``): NVVM contracts multiply-adds to FMA
  and float32 ``exp`` differs from the CPU's, so a pair whose alpha lies within a few ulps of
  the 1/255 skip can be decided differently. One flip changes one pixel and, through its
  transmittance, the gradient of every Gaussian behind it there. Moving the reference's skip
  threshold by a relative 3e-7 (a few ulps) failed nothing on garden; by 1e-6 (a
  pessimistic bound) it failed 20 ``render_colors`` and 277 of 1,227,240 ``v_conics``
  elements there (2.3e-4), and on ``synthetic:20000:256x256`` one flipped pair failed 41 of
  60,000 ``v_conics`` (6.8e-4).
  So a tensor may have ``max(CROSS_DEVICE_MIN, ceil(CROSS_DEVICE_FRACTION * numel))``
  failing elements, except ``EXACT_TENSORS`` (intersection keys, ``flatten_ids``, offsets:
  computed from the fed, identical inputs), which must match exactly. A kernel bug (a wrong
  formula, a race, a missed tile or batch) fails far more elements than that.
- **Any ``cuda`` arm**, ``cuda`` against ``cuda`` too: the same allowance. The ``cuda``
  backward adds every gradient component with float atomics, whose order changes from run
  to run, so one arm is not even equal to itself: on an H200 (2026-11-30), four garden passes
  of ``cuda:per_pixel`` differed from the first by up to 3.9e-3 abs (0.35 rel) in
  ``v_conics``, and ``cuda:per_splat`` by 1.5e-3; ``cuda:per_pixel`` against
  ``cuda:per_splat`` failed 2 of 1,227,240 ``v_conics`` elements, and each against
  ``cpu:per_splat`` 1 to 3.

Integer tensors go through the same element rule, so they must match exactly (``radii``: to
one pixel, a ``ceil`` on an integer boundary). ``isect_ids`` are compared as two tensors: the
(image, tile) key (exact) and the depth stored in their low 32 bits (a float).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .arms import Arm

ATOL = 1e-4
RTOL = 1e-4
# Across device types (module docstring; measured by moving the reference's 1/255 skip by a
# relative 1e-6): the worst fraction of failing elements was 2.3e-4 on garden (v_conics,
# 277 of 1,227,240) and 6.8e-4 where one flipped pair failed 41 of 60,000 v_conics.
CROSS_DEVICE_FRACTION = 1e-3
CROSS_DEVICE_MIN = 1
# Tensors whose values are decisions on the fed (identical) inputs: exact on any devices.
EXACT_TENSORS = ("isect_ids.tile_key", "isect_ids.depth", "flatten_ids", "isect_offsets")


def allowed_failures(name: str, numel: int, cross_device: bool) -> int:
    """Failing elements tensor ``name`` (of ``numel`` elements) may have: 0 between arms on
    one device type, ``max(CROSS_DEVICE_MIN, ceil(CROSS_DEVICE_FRACTION * numel))`` across
    device types except for the exact tensors (``EXACT_TENSORS``); see the module docstring."""
    if not cross_device or name in EXACT_TENSORS or numel == 0:
        return 0
    return max(CROSS_DEVICE_MIN, math.ceil(CROSS_DEVICE_FRACTION * numel))


def verdict(row: dict[str, Any]) -> str:
    """``PASS 0/1,234 failing``, ``PASS 1/1,234 failing (<= 2 allowed)``, ``FAIL 80/1,234
    failing (> 2 allowed)``, ``FAIL (why)`` or ``not gated: why`` for a row of
    :func:`.parity.compare_results` (or of a replay's comparison)."""
    if row.get("gated") is False:
        return f"not gated: {row.get('note', '-')}"
    if row.get("n_fail") is None:
        return f"FAIL ({row.get('note', 'not compared')})"
    counts = f"{row['n_fail']:,}/{row['numel_a']:,} failing"
    allowed = row.get("allowed", 0)
    if row["passed"]:
        return f"PASS {counts}" + (f" (<= {allowed:,} allowed)" if row["n_fail"] else "")
    return f"FAIL {counts} (> {allowed:,} allowed)"


def compare(a: Tensor, b: Tensor, atol: float = ATOL, rtol: float = RTOL,
            allowed: int = 0) -> dict[str, Any]:
    """Element-wise comparison of ``a`` (the first arm) and ``b``; see the module docstring.

    Returns a row: ``numel_a``, ``numel_b``, shapes, ``n_fail`` (failing elements; a
    non-finite value fails unless both are the same), ``allowed``, ``max_abs``, ``max_rel``,
    ``max_rel_where_abs_fails``, ``passed`` (``n_fail <= allowed``) and the ``first_fail``.
    """
    row: dict[str, Any] = {"numel_a": int(a.numel()), "numel_b": int(b.numel()),
                           "shape_a": list(a.shape), "shape_b": list(b.shape),
                           "allowed": int(allowed)}
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
        passed=n_fail <= allowed,
    )
    if n_fail:
        idx = int(torch.nonzero(bad.reshape(-1))[0])
        row["first_fail"] = {"flat_index": idx, "a": float(x.reshape(-1)[idx]),
                             "b": float(y.reshape(-1)[idx])}
    return row


def compare_radii(a: Tensor, b: Tensor, allowed: int = 0) -> dict[str, Any]:
    """Integer radii: equal, or one pixel apart (a ``ceil`` on an integer boundary)."""
    row = compare(a, b, atol=1.0, rtol=0.0, allowed=allowed)
    if a.shape == b.shape:
        diff = a.detach().to("cpu", torch.int64) - b.detach().to("cpu", torch.int64)
        row["off_by_one"] = int((diff.abs() == 1).sum())
    return row


def across_devices(a: Arm, b: Arm) -> bool:
    """True when the few-failing-elements allowance applies to arms ``a`` and ``b``: they
    compute on different device types (``cpu``, ``cuda``; the declared device, so a ``cuda``
    arm in numba's simulator counts as ``cuda``), or either runs the ``cuda`` backend, whose
    backward adds with float atomics in an order that changes from run to run (module
    docstring)."""
    return a.device != b.device or "cuda" in (a.backend, b.backend)


def summary(rows: list[dict[str, Any]]) -> str:
    """One line for a list of rows: ``PASS: 0 failing elements in 20 tensors`` or ``FAIL:
    v_conics 80/1,234 failing (> 64 allowed); ...`` (the failing tensors)."""
    gated = [r for r in rows if r.get("gated", True)]
    failed = [r for r in gated if not r["passed"]]
    if failed:
        return "FAIL: " + "; ".join(f"{r['name']} {r.get('verdict') or verdict(r)}"
                                    for r in failed)
    total = sum(r.get("n_fail") or 0 for r in gated)
    return f"PASS: {total:,} failing elements in {len(gated)} tensors" + (
        " (each within its allowance)" if total else "")


def policy(across: bool) -> str:
    """The allowance rule in force, in words (for reports)."""
    if not across:
        return "same device type: 0 failing elements per tensor"
    return (f"across device types or with the cuda backend's atomics: at most "
            f"max({CROSS_DEVICE_MIN}, ceil({CROSS_DEVICE_FRACTION:g} x elements)) failing "
            f"elements per tensor, 0 for "
            f"{', '.join(EXACT_TENSORS)}")
