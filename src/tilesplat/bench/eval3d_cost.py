"""``tilesplat bench --eval3d N ...``: the cost of 3DGUT's eval3d rasterizer against the 2D
rasterizer at the same size, on one backend (``cpu`` by default), measured in one run.

Per scene: random Gaussians in front of one pinhole camera, tile 16, each rasterizer on the
box tile lists (``isect_tiles``) of its own projection (``fully_fused_projection_with_ut``,
``fully_fused_projection``), forward + backward under one random upstream gradient with a
background, the two arms interleaved; ratios per call and per intersection; then the
projections (``fully_fused_projection_with_ut`` on the backend and on the reference,
``fully_fused_projection`` on the backend). A parity gate of the eval3d kernels against the
torch reference runs first, on a smaller scene (the reference holds a tile's pixels ×
Gaussians in memory); no ratio on a red gate.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

TILE = 16
GATE_TOL = 1e-4  # abs or rel, or no further from float64 than the float32 reference is
GRAD_NAMES = ("colors", "alphas", "v_means", "v_quats", "v_scales", "v_colors", "v_opacities")


def scene(n: int, width: int, height: int, seed: int = 0) -> tuple:
    """n Gaussians in front of one pinhole camera (about 70 degrees across): means, quats,
    scales, opacities [n], colours [n, 3], viewmats [1, 4, 4], Ks [1, 3, 3]."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([2.5, 1.9, 1.0])
    means[:, 2] += 4.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.08 + 0.01
    opac = torch.rand(n, generator=g) * 0.8 + 0.1
    rgb = torch.rand(n, 3, generator=g)
    view = torch.eye(4)[None]
    focal = 0.7 * width
    K = torch.tensor([[[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]]])
    return means, quats, scales, opac, rgb, view, K


def _lists(radii, m2d, depths, width: int, height: int) -> tuple:
    import tilesplat

    tw, th = math.ceil(width / TILE), math.ceil(height / TILE)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, TILE, tw, th,
                                                      backend="torch")
    return tilesplat.isect_offset_encode(isect_ids, 1, tw, th, backend="torch"), flatten_ids


def eval3d_inputs(raw: tuple, width: int, height: int) -> tuple:
    """(leaves, the other arguments) of ``rasterize_to_pixels_eval3d`` for a scene."""
    import tilesplat

    means, quats, scales, opac, rgb, view, K = raw
    radii, m2d, depths, _, _ = tilesplat.fully_fused_projection_with_ut(
        means, quats, scales, opac, view, K, width, height, backend="torch")
    offsets, flatten_ids = _lists(radii, m2d, depths, width, height)
    return (means, quats, scales, rgb[None], opac[None]), (view, K, width, height, TILE,
                                                           offsets, flatten_ids)


def twod_inputs(raw: tuple, width: int, height: int) -> tuple:
    """(leaves, the other arguments) of ``rasterize_to_pixels`` for the same scene."""
    import tilesplat

    means, quats, scales, opac, rgb, view, K = raw
    radii, m2d, depths, conics, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, width, height, backend="torch")
    offsets, flatten_ids = _lists(radii, m2d, depths, width, height)
    return (m2d, conics, rgb[None].contiguous(), opac[None]), (width, height, TILE, offsets,
                                                               flatten_ids)


def _timed(op: Callable, backend: str, inputs: tuple, bg, ups) -> tuple[float, list]:
    """Seconds of one forward + backward of ``op`` and [outputs, gradients]."""
    leaves = [t.clone().requires_grad_() for t in inputs[0]]
    t0 = time.perf_counter()
    out = op(*leaves, *inputs[1], backgrounds=bg, backend=backend)
    grads = torch.autograd.grad(out, leaves, grad_outputs=ups)
    return time.perf_counter() - t0, [*out, *grads]


def run_eval3d(backend: str, inputs: tuple, bg, ups) -> tuple[float, list]:
    import tilesplat

    return _timed(tilesplat.rasterize_to_pixels_eval3d, backend, inputs, bg, ups)


def run_2d(backend: str, inputs: tuple, bg, ups) -> tuple[float, list]:
    import tilesplat

    return _timed(tilesplat.rasterize_to_pixels, backend, inputs, bg, ups)


def _upstream(width: int, height: int, seed: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, height, width, 3, generator=g),
            torch.randn(1, height, width, 1, generator=g))


def gate(backend: str, n: int, width: int, height: int) -> dict:
    """eval3d on ``backend`` against the torch reference: per output and gradient, max
    |backend - ref|, |backend - f64|, |ref - f64| and whether it passes (within GATE_TOL, abs
    or rel, of the reference, or no further than twice the reference from float64)."""
    raw = scene(n, width, height, seed=1)
    inputs = eval3d_inputs(raw, width, height)
    ups = _upstream(width, height)
    bg = torch.full((1, 3), 0.25)
    got = run_eval3d(backend, inputs, bg, ups)[1]
    ref = run_eval3d("torch", inputs, bg, ups)[1]
    exact_inputs = ([t.double() for t in inputs[0]],
                    (inputs[1][0].double(), inputs[1][1].double(), *inputs[1][2:]))
    exact = run_eval3d("torch", exact_inputs, bg.double(), tuple(u.double() for u in ups))[1]
    rows = []
    for name, c, r, e in zip(GRAD_NAMES, got, ref, exact, strict=True):
        c, r, e = c.detach().double(), r.detach().double(), e.detach().double()
        d = (c - r).abs()
        close = bool(((d <= GATE_TOL) | (d <= GATE_TOL * r.abs())).all())
        to_f64, ref_f64 = float((c - e).abs().max()), float((r - e).abs().max())
        rows.append({"tensor": name, "max_abs_vs_ref": float(d.max()), "vs_f64": to_f64,
                     "ref_vs_f64": ref_f64, "passed": close or to_f64 <= 2 * ref_f64})
    return {"gaussians": n, "rows": rows, "passed": all(r["passed"] for r in rows)}


def _interleaved(calls: dict[str, Callable[[], float]], repeats: int) -> dict[str, list]:
    for call in calls.values():
        call()  # warm-up (compilation)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(call())
    return times


def measure(backend: str, n: int, width: int, height: int, repeats: int) -> dict:
    """One scene's eval3d and 2D forward + backward, interleaved, and its projections."""
    import tilesplat

    raw = scene(n, width, height)
    ev, tw = eval3d_inputs(raw, width, height), twod_inputs(raw, width, height)
    bg = torch.full((1, 3), 0.25)
    ups = _upstream(width, height)
    raster = _interleaved({"eval3d": lambda: run_eval3d(backend, ev, bg, ups)[0],
                           "2d": lambda: run_2d(backend, tw, bg, ups)[0]}, repeats)
    ratios = sorted(a / b for a, b in zip(raster["eval3d"], raster["2d"], strict=True))
    means, quats, scales, opac, _, view, K = raw

    def clock(fn: Callable[[], object]) -> Callable[[], float]:
        def call() -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        return call

    proj = _interleaved({
        "ut": clock(lambda: tilesplat.fully_fused_projection_with_ut(
            means, quats, scales, opac, view, K, width, height, backend=backend)),
        "ut_reference": clock(lambda: tilesplat.fully_fused_projection_with_ut(
            means, quats, scales, opac, view, K, width, height, backend="torch")),
        "3dgs": clock(lambda: tilesplat.fully_fused_projection(
            means, None, quats, scales, view, K, width, height, backend=backend)),
    }, repeats)
    med = statistics.median
    return {
        "gaussians": n, "width": width, "height": height, "repeats": repeats,
        "intersections": {"eval3d": int(ev[1][-1].numel()), "2d": int(tw[1][-1].numel())},
        "raster_s": {k: med(v) for k, v in raster.items()},
        "ratio": {"median": med(ratios), "min": ratios[0], "max": ratios[-1]},
        "projection_s": {k: med(v) for k, v in proj.items()},
    }


def run_eval3d_cost(gaussians: list[int], width: int, height: int, repeats: int = 5,
                    backend: str = "cpu", gate_gaussians: int = 300) -> dict:
    """The gate, then each scene of ``gaussians`` (none on a red gate); JSON-ready."""
    result: dict = {"kind": "eval3d_cost", "backend": backend,
                    "torch_threads": torch.get_num_threads(),
                    "gate": gate(backend, gate_gaussians, width, height), "scenes": []}
    if result["gate"]["passed"]:
        result["scenes"] = [measure(backend, n, width, height, repeats) for n in gaussians]
    return result


def format_eval3d_cost(result: dict, markdown: bool = False) -> str:
    """The gate's rows, then one line (or Markdown row) per scene."""
    g = result["gate"]
    lines = [f"parity gate, eval3d {result['backend']} vs torch ({g['gaussians']} Gaussians): "
             "max |got - ref|, |got - f64|, |ref - f64|"]
    lines += [f"  {r['tensor']:12s} {r['max_abs_vs_ref']:.3g}  {r['vs_f64']:.3g}  "
              f"{r['ref_vs_f64']:.3g}  {'PASS' if r['passed'] else 'FAIL'}" for r in g["rows"]]
    if not g["passed"]:
        return "\n".join([*lines, "parity gate failed: no ratios"])
    if markdown:
        lines += ["", "| Gaussians (intersections eval3d / 2D) | eval3d fwd+bwd | 2D fwd+bwd | "
                  "eval3d / 2D (median of interleaved pairs, range) | UT projection / 3DGS "
                  "projection |", "| --- | --- | --- | --- | --- |"]
    for s in result["scenes"]:
        t, r, p, i = s["raster_s"], s["ratio"], s["projection_s"], s["intersections"]
        if markdown:
            lines.append(f"| {s['gaussians']:,} ({i['eval3d']:,} / {i['2d']:,}) | "
                         f"{t['eval3d'] * 1e3:.1f} ms | {t['2d'] * 1e3:.1f} ms | "
                         f"**{r['median']:.2f}×** ({r['min']:.2f}–{r['max']:.2f}×) | "
                         f"{p['ut'] * 1e3:.2f} / {p['3dgs'] * 1e3:.2f} ms |")
            continue
        per_isect = (t["eval3d"] / max(i["eval3d"], 1)) / (t["2d"] / max(i["2d"], 1))
        lines += [
            f"{s['gaussians']} Gaussians, {s['width']}x{s['height']}, {s['repeats']} repeats, "
            f"{result['torch_threads']} torch threads:",
            f"  eval3d fwd+bwd median {t['eval3d'] * 1e3:.1f} ms ({i['eval3d']} "
            f"intersections), 2D {t['2d'] * 1e3:.1f} ms ({i['2d']} intersections)",
            f"  eval3d / 2D: {r['median']:.2f}x per call ({r['min']:.2f}-{r['max']:.2f}), "
            f"{per_isect:.2f}x per intersection",
            f"  projection: ut {p['ut'] * 1e3:.2f} ms, ut reference "
            f"{p['ut_reference'] * 1e3:.2f} ms, 3DGS {p['3dgs'] * 1e3:.2f} ms",
        ]
    return "\n".join(lines)
