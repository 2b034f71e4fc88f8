"""gsplat's training checkpoints: ``<result_dir>/ckpts/ckpt_<step>_rank<r>.pt``, a dict
``{"step": int, "splats": {means, scales, quats, opacities, sh0, shN}}`` (its
``simple_trainer.py``; ``sh0`` [N, 1, 3], ``shN`` [N, K - 1, 3], log-scales, opacity logits,
in the 3DGS frame). A run on several ranks shards the Gaussians: each rank's file holds its
part, and the checkpoint of a step is all of them together.

Loaded with ``torch.load(weights_only=True)``: tensors and plain containers only, no pickled
code runs. ``.pt`` files are not in the suffix table (tilesplat's own checkpoints end in
``.pt`` too): ``tilesplat view`` / ``export`` / ``train --init`` try this reader when a
``.pt`` file or folder is not a tilesplat run.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ._checks import SPLAT_KEYS, SplatData, as_arrays, decoded

KEYS = SPLAT_KEYS  # a checkpoint's "splats" hold the tensors by the names the files all use
_NAME = re.compile(r"ckpt_(\d+)_rank(\d+)\.pt$")


def load_checkpoint_dict(path: Path) -> object:
    """``torch.load(path, weights_only=True)`` on the CPU; any failure is a ``ValueError``
    naming the file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # the unpickler and zip reader raise many kinds
        raise ValueError(f"{path}: not a readable PyTorch checkpoint ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None  # fmt: skip


def is_gsplat_checkpoint(obj: object) -> bool:
    """Whether a loaded checkpoint has gsplat's shape (a ``splats`` dict, no tilesplat
    ``format``)."""
    return isinstance(obj, dict) and isinstance(obj.get("splats"), dict) and "format" not in obj


def checkpoint_files(folder: Path) -> list[Path]:
    """The files of the newest step in a gsplat result folder (or its ``ckpts`` folder),
    every rank's, in rank order; empty when there are none."""
    ckpts = folder / "ckpts" if (folder / "ckpts").is_dir() else folder
    found: dict[int, dict[int, Path]] = {}
    for p in ckpts.glob("ckpt_*_rank*.pt"):
        m = _NAME.search(p.name)
        if m:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = p
    if not found:
        return []
    ranks = found[max(found)]
    return [ranks[r] for r in sorted(ranks)]


def _splats(path: Path, ckpt: object) -> dict[str, torch.Tensor]:
    if not is_gsplat_checkpoint(ckpt):
        raise ValueError(f"{path}: not a gsplat checkpoint (expected a dict with 'splats')")
    splats = ckpt["splats"]
    if "features" in splats or "colors" in splats:
        raise ValueError(f"{path}: a gsplat checkpoint with appearance embeddings (features, "
                         "colors) has no SH colours to read")  # fmt: skip
    missing = [k for k in KEYS if k not in splats]
    if missing:
        raise ValueError(f"{path}: the gsplat checkpoint's splats lack {missing}")
    t = {}
    for k in KEYS:
        v = splats[k]
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            raise ValueError(f"{path}: splats[{k!r}] is not a floating-point tensor")
        t[k] = v.detach().float()
    n = t["means"].shape[0] if t["means"].dim() == 2 else -1
    want = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,),
            "sh0": (n, 1, 3)}  # fmt: skip
    for k, shape in want.items():
        if n < 1 or tuple(t[k].shape) != shape:
            raise ValueError(f"{path}: splats[{k!r}] has shape {tuple(t[k].shape)}, expected "
                             f"{shape}")  # fmt: skip
    shn = t["shN"]
    if shn.dim() != 3 or shn.shape[0] != n or shn.shape[2] != 3 or int(
        (shn.shape[1] + 1) ** 0.5
    ) ** 2 != shn.shape[1] + 1:
        raise ValueError(f"{path}: splats['shN'] has shape {tuple(shn.shape)}, expected "
                         f"({n}, (degree + 1)^2 - 1, 3)")  # fmt: skip
    return t


def _antialiased(folder: Path) -> bool:
    """gsplat's trainer writes its config to ``cfg.yml`` beside ``ckpts``."""
    cfg = folder / "cfg.yml"
    if not cfg.is_file() or cfg.stat().st_size > 1 << 20:
        return False
    return any(ln.strip().lower() in ("antialiased: true", "antialiased: yes")
               for ln in cfg.read_text(errors="replace").splitlines())  # fmt: skip


def read_gsplat_checkpoint(target: str | Path) -> tuple[SplatData, int, list[Path]]:
    """The Gaussians of a gsplat checkpoint file, or of the newest step in a result folder
    (all ranks concatenated).

    Returns:
        (SplatData with the Gaussians, :data:`~._checks.SPLAT_KEYS`; the step; the files read).

    Raises:
        FileNotFoundError: nothing there, or a folder without ``ckpt_*_rank*.pt``.
        ValueError (naming the file): not a gsplat checkpoint, or a malformed one.
    """
    target = Path(target)
    if target.is_dir():
        files = checkpoint_files(target)
        if not files:
            raise FileNotFoundError(f"no gsplat checkpoint (ckpts/ckpt_*_rank*.pt) in {target}")
    elif target.is_file():
        files = [target]
    else:
        raise FileNotFoundError(f"gsplat checkpoint not found: {target}")
    parts, step = [], None
    for f in files:
        ckpt = load_checkpoint_dict(f)
        parts.append(_splats(f, ckpt))
        s = ckpt.get("step")
        step = s if isinstance(s, int) and not isinstance(s, bool) else step
    degrees = {p["shN"].shape[1] for p in parts}
    if len(degrees) != 1:
        raise ValueError(f"{files[0].parent}: the ranks' checkpoints hold different SH degrees")
    # one rank's tensors are used as they are (no copy); ranks are joined
    arrays = {k: (parts[0][k] if len(parts) == 1 else torch.cat([p[k] for p in parts])).numpy()
              for k in KEYS}  # fmt: skip
    folder = files[0].parent.parent if files[0].parent.name == "ckpts" else files[0].parent
    return decoded(files[0], arrays, _antialiased(folder)), step or 0, files


def save_gsplat_checkpoint(
    path: str | Path, splats: dict[str, torch.Tensor], step: int = 0
) -> Path:
    """Write the Gaussians (:data:`~._checks.SPLAT_KEYS`) as a gsplat checkpoint ``{"step",
    "splats"}`` (atomically), which gsplat's ``simple_trainer.py --ckpt`` loads."""
    from .atomic import atomic_writer

    tensors = {k: torch.from_numpy(v) for k, v in as_arrays(splats).items()}
    path = Path(path)
    with atomic_writer(path) as f:  # straight to the file: no copy of the model in memory
        torch.save({"step": step, "splats": tensors}, f)
    return path
