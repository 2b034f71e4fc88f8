"""Shared test helpers: random scenes and a comparison that says which elements differ."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def assert_close(name: str, actual: Tensor, expected: Tensor, atol: float, rtol: float) -> None:
    """Fails when an element is off by more than ``atol`` AND more than ``rtol`` relative
    (DESIGN.md: both must fail to fail), reporting the worst elements."""
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    a, e = actual.detach().double(), expected.detach().double()
    assert torch.isfinite(a).all(), f"{name}: {(~torch.isfinite(a)).sum()} non-finite values"
    diff = (a - e).abs()
    rel = diff / e.abs().clamp_min(1e-30)
    bad = (diff > atol) & (rel > rtol)
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        rows = [f"  at {i}: got {a[tuple(i)].item():.8g}, expected {e[tuple(i)].item():.8g}"
                for i in idx]
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements differ "
            f"(max abs {diff.max().item():.3g}, atol {atol}, rtol {rtol})\n" + "\n".join(rows)
        )


def random_gaussians(n: int, batch: tuple = (), dtype=torch.float32, seed: int = 0,
                     spread: float = 1.0, scale: float = 0.15):
    """means, quats, scales, opacities, colors for n Gaussians in front of look_at cameras."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand((*batch, n, 3), generator=g) * 2 - 1) * spread
    quats = torch.randn((*batch, n, 4), generator=g)
    scales = torch.rand((*batch, n, 3), generator=g) * scale + 0.02
    opacities = torch.rand((*batch, n), generator=g) * 0.8 + 0.1
    colors = torch.rand((*batch, n, 3), generator=g)
    return [t.to(dtype) for t in (means, quats, scales, opacities, colors)]


def cameras(C: int, width: int, height: int, batch: tuple = (), dtype=torch.float32,
            distance: float = 4.0):
    """viewmats [..., C, 4, 4] (cameras at z = -distance, slightly shifted) and Ks."""
    view = torch.eye(4).repeat(C, 1, 1)
    view[:, 2, 3] = distance
    view[:, 0, 3] = torch.linspace(-0.3, 0.3, C)
    f = 0.9 * max(width, height)
    K = torch.tensor([[f, 0, width / 2], [0, f * 1.05, height / 2], [0, 0, 1.0]]).repeat(C, 1, 1)
    view = view.expand(*batch, C, 4, 4).contiguous()
    K = K.expand(*batch, C, 3, 3).contiguous()
    return view.to(dtype), K.to(dtype)


def tile_grid(width: int, height: int, tile_size: int) -> tuple[int, int]:
    return math.ceil(width / tile_size), math.ceil(height / tile_size)


def naive_rasterize(means2d, conics, colors, opacities, width, height, tile_size,
                    isect_offsets, flatten_ids, backgrounds=None, masks=None):
    """The rendering contract of DESIGN.md written as the plain per-pixel loop (float64).

    Shapes as the backend launchers: means2d [G,2], conics [G,3], colors [G,D],
    opacities [G], isect_offsets [I,TH,TW], flatten_ids [n], backgrounds [I,D].
    """
    I, TH, TW = isect_offsets.shape
    D = colors.shape[-1]
    n = flatten_ids.numel()
    out_c = torch.zeros(I, height, width, D, dtype=torch.float64)
    out_a = torch.zeros(I, height, width, 1, dtype=torch.float64)
    last = torch.full((I, height, width), -1, dtype=torch.int32)
    offs = isect_offsets.reshape(-1).tolist() + [n]
    m, q = means2d.double().tolist(), conics.double().tolist()
    col, op = colors.double().tolist(), opacities.double().tolist()
    fid = flatten_ids.tolist()
    for i in range(I):
        for y in range(height):
            for x in range(width):
                ty, tx = y // tile_size, x // tile_size
                t = (i * TH + ty) * TW + tx
                T, acc, last_id = 1.0, [0.0] * D, -1
                if masks is None or bool(masks[i, ty, tx]):
                    for k in range(offs[t], offs[t + 1]):
                        g = fid[k]
                        dx, dy = m[g][0] - (x + 0.5), m[g][1] - (y + 0.5)
                        a, b, c = q[g]
                        sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
                        if sigma < 0:
                            continue
                        alpha = min(0.999, op[g] * math.exp(-sigma))
                        if alpha < 1.0 / 255.0:
                            continue
                        t_next = T * (1 - alpha)
                        if t_next <= 1e-4:
                            break
                        for d in range(D):
                            acc[d] += alpha * T * col[g][d]
                        T, last_id = t_next, k
                for d in range(D):
                    bg = 0.0 if backgrounds is None else float(backgrounds[i, d])
                    out_c[i, y, x, d] = acc[d] + T * bg
                out_a[i, y, x, 0] = 1.0 - T
                last[i, y, x] = last_id
    return out_c, out_a, last


def run_in_cuda_simulator(paths: list[str], rootdir: str, timeout: float = 600) -> list[str]:
    """Runs pytest on ``paths`` in a subprocess with numba's CUDA simulator on; returns the node
    ids that passed. Fails on any failure, error, skip or xfail, or when nothing ran.

    numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported, and other test
    files import numba in the same pytest process, so the simulator needs its own process
    (one, without xdist: the simulator runs every GPU thread as a Python thread).
    """
    import os
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TILESPLAT_CUDA_") and k != "TILESPLAT_BACKEND"}
    env.update(NUMBA_ENABLE_CUDASIM="1", TILESPLAT_POISON="1")
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-rA", "--maxfail=5",
           "-p", "no:xdist", "-p", "no:cacheprovider"]
    run = subprocess.run(cmd, env=env, cwd=rootdir, capture_output=True, text=True,
                         timeout=timeout)
    out = run.stdout
    assert run.returncode == 0, out[-8000:] + run.stderr[-3000:]
    summary = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", out, re.M)
    assert set(summary) == {"PASSED"}, out[-6000:]  # nothing skipped, nothing xfailed
    return re.findall(r"^PASSED (\S+)", out, re.M)


def splats_of(means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor,
              sh: Tensor) -> dict[str, Tensor]:
    """Gaussians by gsplat's names (what every splat file reads and writes) from all K SH
    coefficients ``sh`` [N, K, 3]: ``sh0`` [N, 1, 3] and ``shN`` [N, K - 1, 3]."""
    return {"means": means, "scales": scales, "quats": quats, "opacities": opacities,
            "sh0": sh[:, :1], "shN": sh[:, 1:]}  # fmt: skip


def all_sh(splats: dict[str, Tensor]) -> Tensor:
    """All K SH coefficients [N, K, 3] of Gaussians by gsplat's names (``sh0`` and ``shN``)."""
    return torch.cat([splats["sh0"], splats["shN"]], dim=1)
