"""Frames decode their images on demand through the bounded image cache (data/image_cache.py):
the float32 a step reads is bit for bit what the loaders used to hold (RGB, RGBA on a
background, masks, a downscale, an undistortion), the cache holds at most image_cache_mb,
an evicted image decodes again to the same values, threads and prefetch change nothing,
and a bad image_cache_mb is one line naming the key."""

import dataclasses
import json
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from tilesplat.data import image_cache
from tilesplat.data.captures import orbit, write_capture
from tilesplat.data.colmap_format import ColmapCamera, ColmapImage
from tilesplat.data.colmap_write import rotmat_to_qvec, write_model
from tilesplat.data.dataset import load_dataset
from tilesplat.data.frames import read_mask
from tilesplat.data.image_cache import MB, check_cache_mb, image_to_tensors
from tilesplat.data.pixels import LazyPixels, prefetch
from tilesplat.data.undistort import Camera, Remap, plan
from tilesplat.io.images import read_image, resize_image, write_png

W, H = 37, 29  # odd sizes: a downscale by 2 drops a row and a column


@pytest.fixture(autouse=True)
def automatic_budget():
    yield
    image_cache.configure(0)


def _poses(n: int) -> list[np.ndarray]:
    return [v for v in orbit(n)]


def _colmap(root, n=6, suffix=".jpg", alpha=False, masks=False, seed=0):
    """A COLMAP dataset of random photos (JPEG or PNG, RGBA with ``alpha``) and masks."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    images = []
    for i, viewmat in enumerate(_poses(n)):
        name = f"im_{i:02d}{suffix}"
        img = rng.integers(0, 256, (H, W, 4 if alpha else 3), dtype=np.uint8)
        Image.fromarray(img).save(root / "images" / name, quality=90)
        if masks and i % 2 == 0:
            (root / "masks").mkdir(exist_ok=True)
            keep = rng.random((H, W)) > 0.3
            write_png(root / "masks" / f"{name}.png", np.where(keep, 255, 0).astype(np.uint8))
        images.append(ColmapImage(i + 1, rotmat_to_qvec(viewmat[:3, :3]), viewmat[:3, 3].copy(),
                                  1, name))
    cam = ColmapCamera(1, "PINHOLE", W, H, np.array([30.0, 31.0, W / 2, H / 2]))
    write_model(root / "sparse" / "0", [cam], images, rng.random((5, 3)),
                rng.integers(0, 256, (5, 3), dtype=np.uint8))
    return root


def _today(image_file, downscale, background=(0.0, 0.0, 0.0), mask_file=None):
    """What the loaders held before the cache: (image, alpha, mask), from the same primitives
    (read_image's float32, resize_image, image_to_tensors), in the order they ran them."""
    img = read_image(image_file)
    h, w = img.shape[:2]
    size = (max(1, w // downscale), max(1, h // downscale))
    if size != (w, h):
        img = resize_image(img, *size)
    rgb, alpha = image_to_tensors(img, background)
    keep = None if mask_file is None else read_mask(mask_file, image_file, (w, h), size)
    return rgb, alpha, keep


def _same(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape, what
        diff = (a != b).nonzero()
        assert len(diff) == 0, f"{what}: {len(diff)} values differ, first at {diff[0].tolist()}"


def _check_frames(ds, root, downscale, background=(0.0, 0.0, 0.0), folder="images"):
    for f in ds.train + ds.test:
        image_file = next((root / folder).glob(f.name + ".*"))
        mask_file = root / "masks" / f"{image_file.name}.png"
        rgb, alpha, keep = _today(image_file, downscale, background,
                                  mask_file if mask_file.is_file() else None)
        _same(f.image, rgb, f"{f.name} image")
        _same(f.alpha, alpha, f"{f.name} alpha")
        want = None if keep is None or keep.all() else torch.from_numpy(keep)
        _same(f.mask, want, f"{f.name} mask")
        assert (f.width, f.height) == (rgb.shape[1], rgb.shape[0])


@pytest.mark.parametrize("downscale", [1, 2])
@pytest.mark.parametrize("suffix,alpha", [(".jpg", False), (".png", True)])
def test_colmap_frames_are_bit_identical_to_the_loaders_float32(tmp_path, downscale, suffix,
                                                                 alpha):
    root = _colmap(tmp_path, suffix=suffix, alpha=alpha, masks=True)
    ds = load_dataset(root, downscale=downscale, test_every=3)
    _check_frames(ds, root, downscale)
    masked = [f for f in ds.train + ds.test if f.mask_bits is not None]
    assert masked, "the masks reached no frame"
    for f in masked:  # held as bits
        assert f.mask_bits.bits.dtype == np.uint8
        assert f.mask_bits.bits.nbytes == -(-f.width * f.height // 8)


def _blender(root, n=4):
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        frames = []
        for i in range(n):
            img = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
            img[..., 3] = np.where(rng.random((H, W)) < 0.2, 0, img[..., 3])
            write_png(root / split / f"r_{i}.png", img)
            c2w = np.eye(4)
            c2w[:3, 3] = [np.cos(i), np.sin(i), 2.0 + i * 0.1]
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": c2w.tolist()})
        (root / f"transforms_{split}.json").write_text(
            json.dumps({"camera_angle_x": 0.7, "frames": frames}))
    return root


@pytest.mark.parametrize("downscale", [1, 2])
def test_blender_rgba_on_white_is_bit_identical(tmp_path, downscale):
    root = _blender(tmp_path)
    ds = load_dataset(root, downscale=downscale, white_background=True)
    white = (1.0, 1.0, 1.0)
    for split, frames in (("train", ds.train), ("test", ds.test)):
        for f in frames:
            img = read_image(root / split / f"{f.name}.png")
            rgb, alpha = image_to_tensors(img, white)
            if downscale > 1:  # composite first, then resize rgb and alpha together
                small = resize_image(np.concatenate([rgb.numpy(), alpha.numpy()], axis=2),
                                     W // downscale, H // downscale)
                rgb = torch.from_numpy(np.ascontiguousarray(small[:, :, :3]))
                alpha = torch.from_numpy(np.ascontiguousarray(small[:, :, 3:4]))
            _same(f.image, rgb, f"{f.name} image")
            _same(f.alpha, alpha, f"{f.name} alpha")


def test_undistorted_frames_are_the_remap_of_today_on_a_miss_and_on_a_hit(tmp_path):
    cam = Camera("OPENCV", 48, 36, (40.0, 41.0, 24.0, 18.0, -0.2, 0.05, 0.001, -0.002))
    root = write_capture(tmp_path / "cap", cam, orbit(3), masks=False)
    table = Remap(cam, plan(cam).target)
    want = {}
    for p in sorted((root / "images").iterdir()):
        rgb, _ = image_to_tensors(table.image(read_image(p)[:, :, :3]), (0.0, 0.0, 0.0))
        want[p.stem] = rgb
    for load in ("miss", "hit"):
        ds = load_dataset(root, test_every=0)
        assert len(list((root / "tilesplat_cache").iterdir())) == 1
        for f in ds.train:
            _same(f.image, want[f.name], f"{load}: {f.name}")
            image_cache.CACHE.clear()  # and decoded again
            _same(f.image, want[f.name], f"{load}, decoded again: {f.name}")


def test_the_bound_holds_and_an_evicted_image_decodes_to_the_same_values(tmp_path):
    root = _colmap(tmp_path, n=8, suffix=".png")
    one = W * H * 3  # uint8 bytes of one image
    mb = 2.5 * one / MB  # two images and a half
    ds = load_dataset(root, test_every=0, image_cache_mb=mb)
    cache = image_cache.CACHE
    assert cache.budget == int(mb * MB) and len(cache) == 2 and cache.held == 2 * one
    first = [f.image.clone() for f in ds.train]
    decodes = cache.decodes
    for _ in range(3):
        for f, want in zip(ds.train, first, strict=True):
            _same(f.image, want, f.name)
            assert cache.held <= cache.budget
    assert cache.decodes - decodes == 3 * len(ds.train)  # each view evicted before its turn
    image_cache.configure(1e-6)  # smaller than one image: nothing is held, values the same
    assert cache.held == 0
    for f, want in zip(ds.train, first, strict=True):
        _same(f.image, want, f.name)
    assert cache.held == 0


def test_threads_and_prefetch_give_the_same_values(tmp_path):
    root = _colmap(tmp_path, n=8, suffix=".jpg")
    ds = load_dataset(root, test_every=0)
    first = [f.image.clone() for f in ds.train]
    cache = image_cache.CACHE
    cache.clear()
    prefetch(f.pixels for f in ds.train)
    image_cache.pool().submit(lambda: None).result()
    got: dict[int, list[torch.Tensor]] = {}

    def read(k: int) -> None:
        got[k] = [f.image for f in ds.train]

    workers = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for k in range(4):
        for f, a, b in zip(ds.train, got[k], first, strict=True):
            _same(a, b, f"thread {k}: {f.name}")
    assert cache.decodes >= len(ds.train)


def test_a_frame_replaced_shares_its_pixels_and_decodes_nothing(tmp_path):
    root = _colmap(tmp_path, n=3, suffix=".png", masks=True)
    ds = load_dataset(root, test_every=0)
    f = ds.train[0]
    decodes = image_cache.CACHE.decodes
    g = dataclasses.replace(f, viewmat=f.viewmat * 2)
    assert g.pixels is f.pixels and g.mask_bits is f.mask_bits
    assert isinstance(g.pixels, LazyPixels) and image_cache.CACHE.decodes == decodes
    h = dataclasses.replace(f, image=f.image * 0.5)  # alpha and mask kept
    _same(h.image, f.image * 0.5, "replaced image")
    _same(h.mask, f.mask, "kept mask")


@pytest.mark.parametrize("bad", [-1, -0.5, "lots", float("nan"), float("inf"), True, None])
def test_a_bad_image_cache_mb_is_one_line_naming_the_key(tmp_path, bad):
    with pytest.raises(ValueError) as err:
        check_cache_mb(bad)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("image_cache_mb must be a number of megabytes >= 0")
    assert msg.endswith(f"got {bad!r}")
    root = _colmap(tmp_path, n=2)
    with pytest.raises(ValueError, match="^image_cache_mb must be"):
        load_dataset(root, image_cache_mb=bad)


def test_the_trainer_key_is_checked_with_the_others():
    from tilesplat.train.config import TrainConfig

    assert TrainConfig().image_cache_mb == 0.0
    for bad, says in ((-3, "image_cache_mb must be >= 0, got -3"),
                      ("lots", "image_cache_mb must be float, got 'lots'")):
        with pytest.raises(ValueError, match=says):
            TrainConfig(image_cache_mb=bad).validate()


def test_the_scale_script_reports_each_stage_at_a_small_size(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "scale_images.py"
    spec = importlib.util.spec_from_file_location("scale_images", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    got = script.main(["--photos", "3", "--width", "64", "--height", "48", "--downscale", "2",
                       "--out", str(tmp_path), "--image-cache-mb", "1"])
    (tree,) = got["trees"].values()
    assert tree["views"] == 3 and tree["cache"]["held"] <= tree["cache"]["budget"] == 1 << 20
    for stage in ("load", "epoch"):
        assert tree[stage]["seconds"] > 0 and tree[stage]["peak"] > 0


def test_resizing_uint8_is_resizing_its_float32():
    from tilesplat.io.images import to_float

    img = np.random.default_rng(4).integers(0, 256, (H, W, 4), dtype=np.uint8)
    _same(torch.from_numpy(resize_image(img, 12, 9)),
          torch.from_numpy(resize_image(to_float(img), 12, 9)), "resized")


def test_the_load_reports_its_progress_and_what_the_cache_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(image_cache, "PROGRESS_EVERY_S", 0.0)
    root = _colmap(tmp_path, n=4, suffix=".png")
    lines: list[str] = []
    load_dataset(root, test_every=0, log=lines.append, image_cache_mb=1)
    progress = [ln for ln in lines if ln.startswith("images: ")]
    assert [ln.split(" decoded (")[0] for ln in progress[:-1]] == [
        "images: 1/4", "images: 2/4", "images: 3/4"]
    assert progress[-1].startswith("images: 4 decoded in ")
    assert progress[-1].endswith(f"MB held ({image_cache.KEY})") and "of 1 MB" in progress[-1]
