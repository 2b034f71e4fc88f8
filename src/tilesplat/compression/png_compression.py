"""``PngCompression`` (gsplat 1.5.3): splats as PNG images on a sorted grid, SH by k-means.

The directory layout is gsplat's, so either library reads the other's files:

- ``meta.json``: for each attribute its ``shape`` and ``dtype``, and for the quantised ones
  ``mins`` / ``maxs`` (per channel; one scalar pair for ``shN``) and ``quantization``;
- ``means_l.png`` / ``means_u.png``: the log-transformed centres (``sign(x) log(1 + |x|)``)
  as 16 bits per channel, low and high bytes in two 8-bit RGB images;
- ``scales.png``, ``quats.png`` (normalised, RGBA), ``opacities.png`` (grey), ``sh0.png``:
  8 bits per channel, each channel scaled to its [min, max];
- ``shN.npz``: the higher SH bands of each splat replaced by the label (``uint16``) of one of
  at most 65,536 k-means centroids, the centroids quantised to 6 bits (``uint8``);
- ``<name>.npz`` for any other attribute (lossless).

The images are S × S with S = floor(sqrt(N)): a count that is not a square loses its lowest
opacities first (gsplat's rule, with a warning). ``use_sort`` lays the splats out with
:func:`.grid_sort.grid_sort` on the attributes that become images (gsplat uses PLAS, a CUDA
package not on PyPI, on every key but ``shN``: an extra key is an npz, which no order
shrinks, and an index column would only pull the layout around); the k-means is
tilesplat's CPU one (``io/kmeans.py``, Euclidean; gsplat's torchpq is CUDA only and
Manhattan) — neither changes the format. PNGs are written and read with Pillow.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .grid_sort import grid_sort

REQUIRED = ("means", "scales", "quats", "opacities", "sh0", "shN")
SH_CLUSTERS = 65536  # gsplat's k-means palette (labels are uint16)
SH_BITS = 6  # gsplat's quantisation of the centroids
SH_ITERATIONS = 10


@dataclass
class PngCompression:
    """Compresses splats (pre-activation values, gsplat's keys) into a directory of PNGs.

    Args:
        use_sort: lay the splats out on a self-organised grid first (smaller PNGs).
        verbose: print what is being done.
    """

    use_sort: bool = True
    verbose: bool = True

    def compress(self, compress_dir: str, splats: dict[str, Tensor]) -> None:
        """Writes ``splats`` (``means`` [N, 3], ``scales`` [N, 3], ``quats`` [N, 4],
        ``opacities`` [N], ``sh0`` [N, 1, 3], ``shN`` [N, K, 3], any more [N, ...]) into
        ``compress_dir`` (made if missing). The caller's dict is not changed."""
        splats = _checked(splats)
        splats["means"] = _log_transform(splats["means"])
        splats["quats"] = torch.nn.functional.normalize(splats["quats"], dim=-1)
        n = len(splats["means"])
        side = math.isqrt(n)
        n_crop = n - side * side
        if n_crop:
            keep = torch.argsort(splats["opacities"], descending=True, stable=True)[:side * side]
            splats = {k: v[keep] for k, v in splats.items()}
            warnings.warn(f"PngCompression: {n} Gaussians is not a square number; dropped the "
                          f"{n_crop} of lowest opacity", stacklevel=2)
        if self.use_sort:
            if self.verbose:
                print(f"PngCompression: sorting {side * side} splats onto a {side}x{side} grid")
            keys = [k for k in _ENCODERS if _ENCODERS[k] is not _write_kmeans]  # the PNGs
            order = grid_sort(torch.cat([splats[k].reshape(side * side, -1) for k in keys], 1),
                              splats["means"])
            splats = {k: v[order] for k, v in splats.items()}
        os.makedirs(compress_dir, exist_ok=True)
        meta = {}
        for name, value in splats.items():
            if self.verbose:
                print(f"PngCompression: {name} {tuple(value.shape)}")
            meta[name] = _ENCODERS.get(name, _write_npz)(compress_dir, name, value, side)
        with open(os.path.join(compress_dir, "meta.json"), "w") as f:
            json.dump(meta, f)

    def decompress(self, compress_dir: str) -> dict[str, Tensor]:
        """The splats of ``compress_dir`` (gsplat's or tilesplat's), on the CPU, each in the
        dtype it was written with."""
        path = os.path.join(compress_dir, "meta.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no meta.json (not a PngCompression directory)")
        with open(path) as f:
            meta = json.load(f)
        splats = {name: _DECODERS.get(name, _read_npz)(compress_dir, name, m)
                  for name, m in meta.items()}
        if "means" in splats:
            m = splats["means"]
            splats["means"] = torch.sign(m) * torch.expm1(m.abs())
        return splats


def _checked(splats: dict[str, Tensor]) -> dict[str, Tensor]:
    """Detached copies of the splats, all with the same leading N >= 1 (``ValueError``)."""
    if not isinstance(splats, dict):
        raise ValueError(f"splats must be a dict of tensors, got {type(splats).__name__}")
    missing = [k for k in REQUIRED if k not in splats]
    if missing:
        raise ValueError(f"splats is missing {missing} (gsplat's keys: {list(REQUIRED)})")
    out = {}
    for name, value in splats.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"splats[{name!r}] must be a tensor, got {type(value).__name__}")
        out[name] = value.detach().cpu()
    n = len(out["means"])
    bad = {k: tuple(v.shape) for k, v in out.items() if v.dim() == 0 or len(v) != n}
    if n == 0 or bad:
        raise ValueError(f"splats need one row per Gaussian (N >= 1, means has {n}), got {bad}")
    for name, tail in (("means", (3,)), ("scales", (3,)), ("quats", (4,)), ("opacities", ()),
                       ("sh0", (1, 3))):
        if tuple(out[name].shape[1:]) != tail:
            raise ValueError(f"splats[{name!r}] must be [N, {', '.join(map(str, tail))}]"
                             f", got {list(out[name].shape)}".replace("[N, ]", "[N]"))
    return out


def _log_transform(x: Tensor) -> Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def _meta(value: Tensor) -> dict[str, Any]:
    return {"shape": list(value.shape), "dtype": str(value.dtype).split(".")[1]}


def _unit_grid(value: Tensor, side: int) -> tuple[np.ndarray, dict[str, Any]]:
    """[S, S, C] float64 in [0, 1], each channel scaled to its [min, max], and the meta."""
    grid = value.reshape(side, side, -1).double()
    mins = grid.amin(dim=(0, 1))
    maxs = grid.amax(dim=(0, 1))
    span = torch.where(maxs > mins, maxs - mins, torch.ones_like(maxs))
    meta = {**_meta(value), "mins": mins.tolist(), "maxs": maxs.tolist()}
    return ((grid - mins) / span).numpy(), meta


def _save_png(path: str, img: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(img.squeeze(-1) if img.shape[-1] == 1 else img)).save(
        path, format="PNG", optimize=True)


def _load_png(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im)


def _write_png8(compress_dir: str, name: str, value: Tensor, side: int) -> dict[str, Any]:
    if value.numel() == 0:
        return _meta(value)
    unit, meta = _unit_grid(value, side)
    _save_png(os.path.join(compress_dir, f"{name}.png"),
              np.round(unit * 255).astype(np.uint8))
    return meta


def _write_png16(compress_dir: str, name: str, value: Tensor, side: int) -> dict[str, Any]:
    if value.numel() == 0:
        return _meta(value)
    unit, meta = _unit_grid(value, side)
    q = np.round(unit * 65535).astype(np.uint16)
    _save_png(os.path.join(compress_dir, f"{name}_l.png"), (q & 0xFF).astype(np.uint8))
    _save_png(os.path.join(compress_dir, f"{name}_u.png"), (q >> 8).astype(np.uint8))
    return meta


def _dequantised(norm: np.ndarray, meta: dict[str, Any]) -> Tensor:
    mins = torch.tensor(meta["mins"], dtype=torch.float64)
    maxs = torch.tensor(meta["maxs"], dtype=torch.float64)
    values = torch.from_numpy(norm).double() * (maxs - mins) + mins
    return values.reshape(meta["shape"]).to(getattr(torch, meta["dtype"]))


def _empty(meta: dict[str, Any]) -> Tensor | None:
    if math.prod(meta["shape"]) == 0:
        return torch.zeros(meta["shape"], dtype=getattr(torch, meta["dtype"]))
    return None


def _read_png8(compress_dir: str, name: str, meta: dict[str, Any]) -> Tensor:
    empty = _empty(meta)
    if empty is not None:
        return empty
    img = _load_png(os.path.join(compress_dir, f"{name}.png"))
    return _dequantised(img / 255.0, meta)


def _read_png16(compress_dir: str, name: str, meta: dict[str, Any]) -> Tensor:
    empty = _empty(meta)
    if empty is not None:
        return empty
    low = _load_png(os.path.join(compress_dir, f"{name}_l.png")).astype(np.uint16)
    high = _load_png(os.path.join(compress_dir, f"{name}_u.png")).astype(np.uint16)
    return _dequantised(((high << 8) + low) / 65535.0, meta)


def _write_kmeans(compress_dir: str, name: str, value: Tensor, side: int) -> dict[str, Any]:
    """Each row's label among at most ``SH_CLUSTERS`` centroids, quantised to ``SH_BITS``."""
    from ..io.kmeans import kmeans

    if value.numel() == 0:
        return _meta(value)
    rows = value.reshape(len(value), -1).float().numpy()
    centroids, labels = kmeans(rows, SH_CLUSTERS, SH_ITERATIONS)
    lo, hi = float(centroids.min()), float(centroids.max())
    unit = (centroids - lo) / (hi - lo if hi > lo else 1.0)
    top = (1 << SH_BITS) - 1
    np.savez_compressed(os.path.join(compress_dir, f"{name}.npz"),
                        centroids=np.round(unit * top).astype(np.uint8),
                        labels=labels.astype(np.uint16))
    return {**_meta(value), "mins": lo, "maxs": hi, "quantization": SH_BITS}


def _read_kmeans(compress_dir: str, name: str, meta: dict[str, Any]) -> Tensor:
    empty = _empty(meta)
    if empty is not None:
        return empty
    with np.load(os.path.join(compress_dir, f"{name}.npz")) as f:
        centroids, labels = f["centroids"], f["labels"].astype(np.int64)
    unit = centroids / float((1 << meta["quantization"]) - 1)
    return _dequantised(unit[labels], meta)


def _write_npz(compress_dir: str, name: str, value: Tensor, side: int) -> dict[str, Any]:
    np.savez_compressed(os.path.join(compress_dir, f"{name}.npz"), arr=value.numpy())
    return _meta(value)


def _read_npz(compress_dir: str, name: str, meta: dict[str, Any]) -> Tensor:
    with np.load(os.path.join(compress_dir, f"{name}.npz")) as f:
        arr = f["arr"]
    return torch.from_numpy(arr).reshape(meta["shape"]).to(getattr(torch, meta["dtype"]))


_ENCODERS: dict[str, Callable[[str, str, Tensor, int], dict[str, Any]]] = {
    "means": _write_png16, "scales": _write_png8, "quats": _write_png8,
    "opacities": _write_png8, "sh0": _write_png8, "shN": _write_kmeans,
}
_DECODERS: dict[str, Callable[[str, str, dict[str, Any]], Tensor]] = {
    "means": _read_png16, "scales": _read_png8, "quats": _read_png8,
    "opacities": _read_png8, "sh0": _read_png8, "shN": _read_kmeans,
}
