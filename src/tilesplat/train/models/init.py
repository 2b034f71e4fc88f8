"""Initial Gaussians: from a point cloud (COLMAP), random points in the scene box, or the
Gaussians of a splat file or gsplat checkpoint (``init_file``, ``train --init FILE``).

Parameters are stored as the optimiser sees them (gsplat's simple trainer layout):
``means`` [N, 3], ``scales`` [N, 3] (log of the standard deviations), ``quats`` [N, 4]
(w, x, y, z, unnormalised), ``opacities`` [N] (logits), ``sh0`` [N, 1, 3] and
``shN`` [N, K - 1, 3] with K = (sh_degree + 1)^2.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...keys import Key
from ...sh_rgb import rgb_to_sh0
from .. import seams

if TYPE_CHECKING:
    from ...data.dataset import SceneDataset
    from ..config import TrainConfig

KEYS = (
    Key("init", "auto", "initial Gaussians: points (the dataset's point cloud), triangulate "
        "(features of the training views matched and triangulated with their poses fixed, "
        "through pycolmap: tilesplat[sfm]; cached beside the data; made up to "
        "init_frustum_points by the frustum's), frustum (points in the "
        "training views at the depths where neighbouring views agree on their colour), random "
        "(uniform in the scene box) or auto (points when the dataset has them; else "
        "triangulate where pycolmap is installed, else frustum; random for images with alpha "
        "or when few of the frustum's depths are distinct: an object on its background)",
        choices=("auto", "points", "triangulate", "frustum", "random")),
    Key("init_file", "", "start from the Gaussians of this file instead (train --init FILE): any "
        "splat file tilesplat reads (docs/formats.md) or a gsplat checkpoint; SH bands above "
        "sh_degree are dropped, missing ones start at zero; init and the init_* keys are then "
        "unused"),
    Key("init_points", 10_000, "number of random initial Gaussians", ge=1),
    Key("init_frustum_points", 20_000, "number of initial Gaussians of init = frustum (20,000 "
        "scored 0.6 dB above 10,000 on the room capture at 600 steps)", ge=1),
    Key("init_extent", 1.0, "half-size of the random-initialisation box, in units of the "
        "half-width the cameras see at the scene centre", gt=0.0),
    Key("init_opacity", 0.1, "initial opacity of every Gaussian (3DGS's 0.1; strategy = mcmc "
        "sets 0.5)", gt=0.0, lt=1.0),
    Key("init_scale", 1.0, "factor on the initial size (mean distance to the 3 nearest "
        "neighbours; strategy = mcmc sets 0.1)", gt=0.0),
)
seams.register_keys("initial Gaussians (train/models/init.py)", KEYS)

# ``init = auto`` keeps the frustum's points when at least this fraction of them lie at a
# distinct minimum of the colour difference, and starts from the random box otherwise: the
# capture tests' rooms (every lens) score 66-91 %, the exposure scene's object on a plain grey
# background, whose background cells match at every depth, 17 % (3,000 points)
AUTO_MIN_DISTINCT = 0.4


@torch.no_grad()
def knn_mean_distance(points: Tensor, k: int = 3) -> Tensor:
    """Root of the mean squared distance of each point to its ``k`` nearest others, exact,
    through a k-d tree (:mod:`.knn`: N log N, where a distance matrix cost N²: a COLMAP
    model of 1 M points took ~1.5 hours).

    Args:
        points: [N, 3].
        k: number of neighbours (fewer when N <= k).

    Returns:
        [N] distances; 0 for a lone point.
    """
    from .knn import nearest_squared  # compiled at the first initialisation

    n = points.shape[0]
    k = min(k, n - 1)
    if k <= 0:
        return torch.zeros(n, dtype=points.dtype, device=points.device)
    pts = points.detach().to("cpu", torch.float64).contiguous().numpy()
    d2 = torch.from_numpy(nearest_squared(pts, k))  # [N, k]
    return d2.mean(dim=1).sqrt().to(points.device, points.dtype)


def visible_half_width(viewmats: Tensor, Ks: Tensor, widths: Tensor, center: Tensor) -> float:
    """Median over cameras of the half-width of the view at the distance of ``center``.

    Args:
        viewmats: [C, 4, 4] world-to-camera.
        Ks: [C, 3, 3].
        widths: [C] image widths in pixels.
        center: [3] the scene centre.

    It sizes the random-initialisation box from the cameras alone: for the NeRF-synthetic
    scenes (cameras 4 units away, 40 degrees of view) it gives 1.45, near 3DGS's fixed 1.3.
    """
    cam = viewmats[:, :3, :3] @ center.to(viewmats) + viewmats[:, :3, 3]  # [C, 3]
    depth = cam[:, 2].abs()
    half = depth * (widths.to(viewmats) / 2.0) / Ks[:, 0, 0]
    return float(half.median())


@torch.no_grad()
def init_params(
    means: Tensor,  # [N, 3]
    rgb: Tensor,  # [N, 3] in [0, 1]
    sh_degree: int,
    init_opacity: float = 0.1,
    init_scale: float = 1.0,
    fallback_scale: float = 0.01,
) -> dict[str, Tensor]:
    """Gaussians centred on ``means`` with colours ``rgb``, isotropic scales from neighbours.

    Scales are ``init_scale`` x the root-mean-square distance to the 3 nearest neighbours
    (3DGS), at least 1e-7 squared as 3DGS clamps; ``fallback_scale`` when there is one point.
    Quaternions are uniform random in [0, 1)^4 (gsplat's simple trainer), drawn from the
    global torch RNG; the SH coefficients above degree 0 start at zero.
    """
    n = means.shape[0]
    if n == 0:
        raise ValueError("cannot initialise from zero points")
    dist = knn_mean_distance(means.float())
    dist = dist if n > 1 else torch.full((n,), fallback_scale)
    dist = dist.clamp_min(math.sqrt(1e-7)) * init_scale
    k = (sh_degree + 1) ** 2
    return {
        "means": means.float().clone(),
        "scales": dist.log()[:, None].repeat(1, 3).float(),
        "quats": torch.rand(n, 4),
        "opacities": torch.full((n,), math.log(init_opacity / (1.0 - init_opacity))),
        "sh0": rgb_to_sh0(rgb.float().clamp(0.0, 1.0))[:, None, :].clone(),
        "shN": torch.zeros(n, k - 1, 3),
    }


@torch.no_grad()
def random_points(n: int, center: Tensor, half_size: float) -> tuple[Tensor, Tensor]:
    """``n`` points uniform in the cube ``center`` +- ``half_size`` and uniform random colours.

    Returns:
        (points [n, 3], rgb [n, 3]) drawn from the global torch RNG.
    """
    points = center.float()[None] + half_size * (torch.rand(n, 3) * 2.0 - 1.0)
    return points, torch.rand(n, 3)


@torch.no_grad()
def gaussians_from_file(path: str | Path, sh_degree: int) -> dict[str, Tensor]:
    """The parameters of the Gaussians in a splat file (any of ``tilesplat.io.gaussians``)
    or a gsplat checkpoint file or result folder, with ``sh_degree``'s bands: higher ones
    dropped, missing ones zero.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a malformed file, or a tilesplat checkpoint (use ``--resume``).
    """
    from ...io.gaussians import read_gaussians, suffix_of
    from ...io.gsplat_ckpt import load_checkpoint_dict, read_gsplat_checkpoint

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"init_file: nothing at {path}")
    if path.is_file() and suffix_of(path) is not None:
        g = read_gaussians(path).gaussians
    else:
        if path.is_file() and "format" in (load_checkpoint_dict(path) or {}):
            raise ValueError(f"init_file {path}: a tilesplat checkpoint; continue its run with "
                             "--resume, or export it (tilesplat export CKPT --to ply) and "
                             "start from the PLY")  # fmt: skip
        g = read_gsplat_checkpoint(path)[0].gaussians
    rest = (sh_degree + 1) ** 2 - 1
    sh_n = g["shN"][:, :rest]
    if sh_n.shape[1] < rest:
        sh_n = torch.cat([sh_n, torch.zeros(len(sh_n), rest - sh_n.shape[1], 3)], dim=1)
    return {
        "means": g["means"].clone(),
        "scales": g["scales"].clone(),
        "quats": g["quats"].clone(),
        "opacities": g["opacities"].clone(),
        "sh0": g["sh0"].clone(),
        "shN": sh_n.clone(),
    }


def init_choice(cfg: TrainConfig, dataset: SceneDataset) -> tuple[str, str]:
    """The initialisation that runs (``points``, ``frustum`` or ``random``) and why."""
    has_points = dataset.points is not None and len(dataset.points) > 0
    if cfg.init == "points" and not has_points:
        raise ValueError("init = 'points' but the dataset has no point cloud; use init = "
                         "'frustum' or 'random'")
    if cfg.init != "auto":
        return cfg.init, f"init = {cfg.init!r}"
    if has_points:
        return "points", f"the dataset's {len(dataset.points):,} points"
    if any(f.alpha is not None for f in dataset.train):
        return "random", "no points, and images with alpha (an object on its background)"
    if importlib.util.find_spec("pycolmap") is not None and len(dataset.train) >= 2:
        return "triangulate", "no points in the dataset, and pycolmap is installed"
    return "frustum", "no points in the dataset"


def _random(cfg: TrainConfig, dataset: SceneDataset, n: int, why: str,
            say: Callable[[str], object]) -> tuple[Tensor, Tensor]:
    """``n`` random points [n, 3] in the box the cameras see and their colours [n, 3]."""
    frames = dataset.train
    half = cfg.init_extent * visible_half_width(
        torch.stack([f.viewmat for f in frames]).float(),
        torch.stack([f.K for f in frames]).float(),
        torch.tensor([f.width for f in frames]),
        dataset.scene_center.float(),
    )
    say(f"init: random, {n:,} points in a box of half-size {half:.3g} ({why})")
    return random_points(n, dataset.scene_center, half)


def _frustum(cfg: TrainConfig, dataset: SceneDataset, n: int, why: str,
             say: Callable[[str], object]) -> tuple[Tensor, Tensor]:
    """``n`` points [n, 3] at photo-consistent depths in the training views
    (``init_frustum.frustum_points``) and their colours [n, 3]; for ``init = auto``, the random
    box's ``init_points`` instead when fewer than AUTO_MIN_DISTINCT of the depths are
    distinct."""
    from .init_frustum import frustum_points

    frames = dataset.train
    pts, rgb, decided = frustum_points(
        torch.stack([f.viewmat for f in frames]).float(),
        torch.stack([f.K for f in frames]).float(),
        [f.image for f in frames], [f.camera_model for f in frames],
        dataset.scene_center.float(), float(dataset.scene_radius), n)
    if cfg.init == "auto" and decided < AUTO_MIN_DISTINCT:
        return _random(cfg, dataset, cfg.init_points, (
            f"{why}; the frustum search found a distinct depth for only {decided:.0%} of its "
            f"points (at least {AUTO_MIN_DISTINCT:.0%} wanted): views of an object on a plain "
            f"background"), say)
    say(f"init: frustum, {len(pts):,} points in the training views at the depths where their "
        f"colours agree ({decided:.0%} distinct; {why})")
    return pts, rgb


def _triangulated(cfg: TrainConfig, dataset: SceneDataset, why: str,
                  say: Callable[[str], object]) -> tuple[Tensor, Tensor]:
    """The training views' features triangulated with their poses fixed
    (``data/sfm/triangulate.py``), and where they are fewer than ``init_frustum_points``, the
    frustum's points to make up the count: [P, 3] points and [P, 3] colours."""
    from ...data.sfm.triangulate import triangulate_known_poses

    tri = triangulate_known_poses(dataset.train, dataset.path, log=say)
    pts, rgb = torch.from_numpy(tri.points), torch.from_numpy(tri.rgb)
    say(f"init: triangulate, {len(pts):,} points triangulated from {tri.n_views} views with "
        f"their poses fixed, {tri.reprojection_error:.2f} px mean error"
        f"{', from the cache' if tri.cached else f', {tri.seconds:.1f} s'} ({why})")
    need = cfg.init_frustum_points - len(pts)
    if need <= 0:
        return pts, rgb
    more, more_rgb = _frustum(cfg, dataset, need, f"to make up init_frustum_points = "
                              f"{cfg.init_frustum_points:,} with the {len(pts):,} triangulated",
                              say)
    return torch.cat([pts, more]), torch.cat([rgb, more_rgb])


def initial_gaussians(cfg: TrainConfig, dataset: SceneDataset,
                      log: Callable[[str], object] | None = None) -> dict[str, Tensor]:
    """Initial 3DGS parameters from a file (``init_file``), the dataset's points, the training
    views' features triangulated with their poses (``data/sfm/triangulate.py``), points at
    photo-consistent depths in the training views (``init_frustum.py``), or random in the box
    the cameras see (``init``, ``init_points``, ``init_extent``; the model kind adapts them).
    ``log`` gets a line saying which ran and why (one per source: a triangulation that finds
    fewer than ``init_frustum_points`` points is made up by the frustum's).

    Draws from the global torch RNG (seeded by the trainer).
    """
    say = log if log is not None else (lambda _line: None)
    if cfg.init_file:
        say(f"init: the Gaussians of {cfg.init_file}")
        return gaussians_from_file(cfg.init_file, cfg.sh_degree)
    kind, why = init_choice(cfg, dataset)
    if kind == "points":
        pts = dataset.points.float()
        rgb = dataset.points_rgb if dataset.points_rgb is not None else torch.full_like(pts, 0.5)
        say(f"init: points ({why})")
    elif kind == "triangulate":
        pts, rgb = _triangulated(cfg, dataset, why, say)
    elif kind == "frustum":
        pts, rgb = _frustum(cfg, dataset, cfg.init_frustum_points, why, say)
    else:
        pts, rgb = _random(cfg, dataset, cfg.init_points, why, say)
    return init_params(
        pts,
        rgb,
        cfg.sh_degree,
        cfg.init_opacity,
        cfg.init_scale,
        fallback_scale=0.01 * dataset.scene_radius,
    )
