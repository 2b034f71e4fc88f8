"""The dataset a config names: its folder, or the built-in scene written once into the cache,
loaded with the config's data keys."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ...data.dataset import SceneDataset, load_dataset
from ...keys import Key
from .. import seams
from ..config import TrainConfig

Log = Callable[[str], None]

KEYS = (
    Key("data", "", "dataset folder (Blender / NeRF-synthetic or COLMAP layout); empty: the "
        "built-in synthetic scene, generated once into the cache folder"),
    Key("downscale", 1, "integer factor dividing the image size", ge=1),
    Key("white_background", True, "composite RGBA images on white (else black); Blender layout "
        "only"),
    Key("test_every", -1, "every n-th image (by name) is a test image; 0: none; -1: the "
        "dataset's own split (Blender's test file, nerfstudio's lists or 90/10 split), else "
        "every 8th", ge=-1),
    Key("masks_dir", "", "folder of training masks, <image name>.png, black where a pixel is "
        "ignored by the loss, densification and metrics; empty: the dataset's own (COLMAP's "
        "masks/, nerfstudio's mask_path) (docs/data.md)"),
    Key("image_cache_mb", 0.0, "megabytes of decoded images held in memory (uint8 where "
        "exact; an image not held is decoded again from its file when a step needs it); 0: "
        "automatic, a quarter of the memory available at load (data/image_cache.py)", ge=0.0),
    Key("synthetic_scene", "raycast", "built-in scene (with data empty): raycast (a textured "
        "object ray cast in NumPy, Blender layout) or garden (the bundled Mip-NeRF 360 garden "
        "Gaussians rendered along a path near its cameras, COLMAP layout with initial points; "
        "synthetic_train + synthetic_test views of 324x210, split by test_every) or exposure "
        "(the raycast scene on grey, each training photo with a gain of x0.6-1.5 and a +-0.05 "
        "offset per channel, the test views without: data/exposure.py)",
        choices=("raycast", "garden", "exposure")),
    Key("synthetic_size", 200, "built-in scene: image width and height in pixels", ge=1),
    Key("synthetic_train", 100, "built-in scene: number of training views", ge=1),
    Key("synthetic_test", 20, "built-in scene: number of test views", ge=0),
    Key("cache_dir", "", "folder for generated data; empty: $XDG_CACHE_HOME/tilesplat or "
        "~/.cache/tilesplat"),
)
seams.register_keys("data (train/rundir/scene.py)", KEYS)


def cache_root(cfg: TrainConfig) -> Path:
    """Where generated data goes: ``cache_dir``, else $XDG_CACHE_HOME/tilesplat or ~/.cache."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tilesplat"


def resolve_data(cfg: TrainConfig, log: Log = print) -> Path:
    """The dataset folder: ``data``, or the built-in scene written once into the cache."""
    if cfg.data:
        return Path(cfg.data).expanduser()
    views = cfg.synthetic_train + cfg.synthetic_test
    if cfg.synthetic_scene == "garden":
        from ...data.garden_views import MARKER, write_garden_views_dataset

        folder = cache_root(cfg) / f"garden-views-{views}"
        if not (folder / MARKER).is_file():
            log(f"writing the built-in garden scene to {folder} (once)")
        return write_garden_views_dataset(folder, n_views=views)
    from ...data import exposure, synthetic

    # the exposure scene: the ray-cast views with a gain and offset on each training photo
    module = exposure if cfg.synthetic_scene == "exposure" else synthetic
    folder = cache_root(cfg) / (
        f"{scene_name(cfg)}-{cfg.synthetic_size}px-{cfg.synthetic_train}-{cfg.synthetic_test}"
    )
    if not (folder / module.MARKER).is_file():
        log(f"writing the built-in {cfg.synthetic_scene} scene to {folder} (once)")
    write = exposure.write_exposure_dataset if module is exposure else (
        synthetic.write_synthetic_dataset)
    return write(
        folder,
        n_train=cfg.synthetic_train,
        n_test=cfg.synthetic_test,
        size=cfg.synthetic_size,
        seed=0,
    )


def load_scene(cfg: TrainConfig, log: Log = print, camera_mode: str | None = None
               ) -> SceneDataset:
    """The dataset the config names, loaded (``camera_mode``: the loaders' mode instead of the
    config's, ``data/native.py``)."""
    return load_dataset(
        resolve_data(cfg, log),
        downscale=cfg.downscale,
        white_background=cfg.white_background,
        test_every=cfg.test_every,
        masks_dir=cfg.masks_dir,
        log=log,
        image_cache_mb=cfg.image_cache_mb,
        camera_mode=camera_mode or cfg.camera_mode,
    )


def scene_name(cfg: TrainConfig) -> str:
    """``synthetic`` (``garden-views``, ``synthetic-exposure``) for the built-in scenes, else
    the dataset folder's name."""
    if cfg.data:
        return Path(cfg.data).expanduser().resolve().name
    return {"garden": "garden-views", "exposure": "synthetic-exposure"}.get(
        cfg.synthetic_scene, "synthetic")
