"""Hostile captures, configs and checkpoints (issue 36): each ends ``tilesplat`` with one line
naming the file or argument, what was expected and what came, exit status 2, and no run
folder or half-written file; never a traceback, a hang or an ``Infinity`` in a JSON file."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import struct
import time
import zlib

import numpy as np
import pytest
import torch

from capture_helpers import colmap_to_nerfstudio
from tilesplat.cli import main
from tilesplat.data.captures import pinhole_camera, write_capture
from tilesplat.data.colmap_format import read_model
from tilesplat.data.colmap_write import write_model
from tilesplat.data.dataset import load_dataset
from tilesplat.data.frames import mask_files
from tilesplat.data.room import camera_poses
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.io.images import read_image, write_png
from tilesplat.io.json_file import json_depth, read_json, strict_json_bytes
from tilesplat.train.config import load_config
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.history import TrainingLog
from tilesplat.train.rundir.scene import load_scene
from tilesplat.train.step.masks import view_metrics

W, H = 40, 30


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """A COLMAP capture of the room (4 views of 40x30, points) and its nerfstudio twin."""
    base = tmp_path_factory.mktemp("hostile")
    col = write_capture(base / "col", pinhole_camera(W, H), camera_poses(4))
    return col, colmap_to_nerfstudio(col, base / "ns")


def one_error_line(capsys, command: str = "train") -> str:
    """The one line the CLI printed on stderr (asserting it is one, and an error)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tilesplat {command}: error:"), err
    return err[0]


def train_fails(capsys, data, run, *extra: str) -> str:
    """``tilesplat train --data data`` into ``run``: exit status 2, one line, no run folder."""
    args = ["train", "--data", str(data), "--set", f"run_dir={run}", *extra]
    assert main(args) == 2
    line = one_error_line(capsys)
    assert not run.exists(), sorted(run.rglob("*"))
    return line


# --- 1. JSON nested deeper than the parser recurses --------------------------------------------


@pytest.mark.parametrize("layout, name", [("nerfstudio", "transforms.json"),
                                          ("blender", "transforms_train.json")])
def test_deeply_nested_transforms_fail_with_one_line(tmp_path, capsys, layout, name):
    data = tmp_path / layout
    data.mkdir()
    deep = 100_000  # far beyond Python's recursion limit (1000)
    (data / name).write_text('{"frames": ' + "[" * deep + "]" * deep + "}")
    line = train_fails(capsys, data, tmp_path / "run")
    assert f"{name}: " in line and f"nested {deep + 1} levels deep; at most 32" in line, line


def test_json_depth_counts_outside_strings_only(tmp_path):
    assert json_depth(b"1") == 0 and json_depth(b"[]") == 1
    assert json_depth(b'{"a": [[1], {"b": "]]]] [[[["}]}') == 3
    assert json_depth(rb'["\\", [[]]]') == 3  # an escaped backslash ends no string
    assert json_depth(rb'["\"[[[", 1]') == 1  # an escaped quote does
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"frames": [0] * 100}))
    with pytest.raises(ValueError, match=r"big\.json: a test file of 312 bytes; at most 100 "):
        read_json(big, "a test file", max_bytes=100)
    assert read_json(big, "a test file")["frames"] == [0] * 100


def test_a_config_nested_too_deep_or_too_large_is_one_line(tmp_path, capsys):
    """tomllib recurses once per level of nested arrays, as json does."""
    deep = tmp_path / "deep.toml"
    deep.write_text("steps = " + "[" * 5000 + "]" * 5000 + "\n")
    for argv in (["check", str(deep)], ["train", "--config", str(deep)]):
        assert main(argv) == 2
        assert (f"{deep}: not a valid config: its values are nested deeper than the TOML "
                "reader follows") in one_error_line(capsys, argv[0])
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 200_000)
    assert main(["check", str(big)]) == 2
    assert "a config file of 2000000 bytes; at most 1048576 are read" in one_error_line(
        capsys, "check")


# --- 2. 100,000 frames: linear work, fail or load in seconds -----------------------------------


def test_a_hundred_thousand_frames_fail_in_seconds(tmp_path, capsys):
    """100,000 frames, valid but for their images, which are not there: the frames are
    checked, split (nerfstudio's 90/10 split was quadratic: minutes) and the first missing
    image is named within seconds. CPU time is measured, so that the load of other processes
    on a shared machine does not count."""
    data = tmp_path / "ns"
    data.mkdir()
    rng = np.random.default_rng(0)
    frames = [{"file_path": f"images/frame_{i:06d}.png",
               "transform_matrix": [[1.0, 0.0, 0.0, x], [0.0, 1.0, 0.0, 0.1],
                                    [0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 0.0, 1.0]]}
              for i, x in enumerate(rng.random(100_000).tolist())]
    meta = {"camera_model": "OPENCV", "fl_x": 50.0, "fl_y": 50.0, "cx": 20.0, "cy": 15.0,
            "w": W, "h": H, "frames": frames}
    (data / "transforms.json").write_text(json.dumps(meta))
    t0 = time.process_time()
    line = train_fails(capsys, data, tmp_path / "run")
    seconds = time.process_time() - t0
    assert "image of 'images/frame_000000.png' not found" in line, line
    assert seconds < 10.0, f"100,000 frames took {seconds:.1f} s of CPU to fail"


def test_masks_of_unregistered_images_are_matched_once_per_folder(tmp_path):
    """A mask whose image the model did not register is accepted when the image is there by
    any suffix; the images folder is listed once, not once per mask (which was quadratic in
    the masks), and glob's special characters in a name are plain characters."""
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    n = 4000
    for i in range(n):
        (images / f"u{i:05d}.jpg").touch()  # unregistered, masked as u00000.png
        (masks / f"u{i:05d}.png").touch()
    for name in ("[b].jpg", "c.d.jpg", "a.jpg"):
        (images / name).touch()
    for name in ("[b].png", "c.png", "c.d.png", "a.jpg.png"):
        (masks / name).touch()
    t0 = time.process_time()
    found = mask_files(masks, ["a.jpg"], images)
    assert time.process_time() - t0 < 5.0
    assert found == {"a.jpg": masks / "a.jpg.png"}
    (masks / "[x].png").touch()  # glob("[x].*") would match an image x.jpg: none is there
    (images / "x.jpg").touch()
    with pytest.raises(ValueError, match=r"mask .*\[x\]\.png belongs to no image"):
        mask_files(masks, ["a.jpg"], images)


def test_nerfstudio_still_loads_its_frames(capture):
    """The frames' poses checked as one array give what they gave frame by frame."""
    col, ns = capture
    a, b = load_dataset(col, test_every=0), load_dataset(ns, test_every=0)
    for fa, fb in zip(a.train, b.train, strict=True):
        np.testing.assert_allclose(fa.viewmat.numpy(), fb.viewmat.numpy(), atol=1e-5, rtol=0)
    meta = json.loads((ns / "transforms.json").read_text())
    meta["frames"][1]["transform_matrix"] = meta["frames"][1]["transform_matrix"][:3]  # 3x4
    meta["frames"][2]["transform_matrix"][0][0] = float("nan")
    bad = ns.parent / "ns_nan"
    shutil.copytree(ns, bad)
    (bad / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"frame 2 \(images/view_002\.png\): transform_matrix "
                                         r"must be a finite 3x4 or 4x4 matrix"):
        load_dataset(bad)


# --- 3. an image whose header declares 50,000 x 50,000 pixels ----------------------------------


def forged_png(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` RGB pixels, with a few bytes of data:
    what a decompression bomb's header looks like, without its gigabytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def forged_bmp(width: int, height: int) -> bytes:
    """A BMP header declaring ``width`` x ``height`` 24-bit pixels, and no pixels."""
    dib = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(dib), 0, 0, 14 + len(dib)) + dib


@pytest.mark.parametrize("where", ["image", "mask"])
def test_an_image_declaring_fifty_thousand_squared_pixels(capture, tmp_path, capsys, where):
    col, _ = capture
    data = tmp_path / "col"
    shutil.copytree(col, data)
    if where == "image":
        bomb = data / "images" / "view_001.png"
    else:
        (data / "masks").mkdir()
        bomb = data / "masks" / "view_001.png.png"
    bomb.write_bytes(forged_png(50_000, 50_000))
    line = train_fails(capsys, data, tmp_path / "run")
    assert (f"cannot read {where} {bomb}" in line
            and "it declares 50000x50000 (2500000000 pixels), more than the 178956970 pixels"
            in line), line


def test_a_bomb_of_another_format_names_its_pixels(tmp_path):
    bomb = tmp_path / "bomb.bmp"
    bomb.write_bytes(forged_bmp(50_000, 50_000))
    with pytest.raises(ValueError, match=r"cannot read image .*bomb\.bmp: it declares "
                                         r"2500000000 pixels, more than"):
        read_image(bomb)


# --- 4. a run_dir that is a file ---------------------------------------------------------------


def test_a_run_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    """Refused before the built-in scene is written into its cache (no work done), the file
    left as it was; under a file too; and by tilesplat check."""
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    cache = tmp_path / "cache"
    for run_dir, message in ((afile, f"run_dir {afile}: expected a folder, found a file"),
                             (afile / "run", f"run_dir {afile / 'run'}: expected a folder, but "
                                             f"{afile} is a file")):
        assert main(["train", "--set", f"run_dir={run_dir}", "--set", f"cache_dir={cache}"]) == 2
        assert message in one_error_line(capsys)
        assert afile.read_text() == "mine" and not cache.exists()
    config = tmp_path / "run.toml"
    config.write_text(f'run_dir = "{afile}"\n')
    assert main(["check", str(config)]) == 2
    assert f"run.toml: run_dir {afile}: expected a folder" in one_error_line(capsys, "check")
    for command in ("eval", "render"):
        assert main([command, str(afile)]) == 2
        assert f"{afile}: expected a run folder, found a file" in one_error_line(capsys, command)
    assert main(["train", "--resume", str(afile)]) == 2
    assert f"{afile}: expected a run folder, found a file" in one_error_line(capsys)


def test_a_run_the_trainer_refuses_leaves_no_folder(capture, tmp_path, capsys):
    """The trainer's own checks (here: a batch of views of two sizes) come before the run
    folder and its config.toml are written."""
    col, _ = capture
    ns = colmap_to_nerfstudio(col, tmp_path / "ns", per_frame=True)
    meta = json.loads((ns / "transforms.json").read_text())
    small = meta["frames"][0]
    for key in ("fl_x", "fl_y", "cx", "cy"):
        small[key] /= 2
    small["w"], small["h"] = W // 2, H // 2
    write_png(ns / small["file_path"], np.zeros((H // 2, W // 2, 3), np.uint8))
    (ns / "transforms.json").write_text(json.dumps(meta))
    line = train_fails(capsys, ns, tmp_path / "run", "--set", "batch_size=2",
                       "--set", "test_every=0")
    assert "batch_size > 1 needs training images of one size" in line, line


# --- 5. a checkpoint that loads safely but is some other program's dict ------------------------

RUN_KEYS = ["--set", "synthetic_size=24", "--set", "synthetic_train=4", "--set",
            "synthetic_test=2", "--set", "progress=false", "--set", "lpips=false",
            "--set", "save_ply=false", "--set", "log_every=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of 2 steps on a tiny built-in scene, and its checkpoint."""
    base = tmp_path_factory.mktemp("trained")
    run = base / "run"
    assert main(["train", "--set", f"run_dir={run}", "--set", f"cache_dir={base / 'cache'}",
                 "--set", "steps=2", *RUN_KEYS]) == 0
    (path,) = (run / "checkpoints").iterdir()
    return run, torch.load(path, weights_only=True)


def _edit(key: str, value) -> object:
    return lambda c: {**c, key: value}


def _edit_in(key: str, inner: str, value) -> object:
    return lambda c: {**c, key: {**c[key], inner: value}}


FOREIGN = [
    ("a list", lambda c: [1, 2, 3], r"not a tilesplat training checkpoint \(a list, not a dict\)"),
    ("another program's dict", lambda c: {"step": 3, "params": {"w": torch.zeros(3)},
                                          "model": "resnet"},
     r"not a tilesplat training checkpoint: format None, expected 'tilesplat-train-1' "
     r"\(its keys: model, params, step\)"),
    ("no config", lambda c: {k: v for k, v in c.items() if k != "config"},
     r"the checkpoint holds no config"),
    ("a config key of another program", _edit_in("config", "learning_rate", 0.1),
     r"checkpoint config: unknown config key 'learning_rate'"),
    ("a negative step", _edit("step", -4), r"step must be an int >= 0, got -4"),
    ("a NaN scene scale", _edit("scene_scale", float("nan")),
     r"scene_scale must be a finite number > 0.0, got nan"),
    ("no time", lambda c: {k: v for k, v in c.items() if k != "elapsed"},
     r"elapsed must be a finite number >= 0.0, got None"),
    ("no quaternions", lambda c: {**c, "params": {k: v for k, v in c["params"].items()
                                                  if k != "quats"}},
     r"model parameter 'quats' is missing or not a float tensor"),
    ("NaN means", lambda c: {**c, "params": {**c["params"],
                                             "means": c["params"]["means"] * float("nan")}},
     r"model parameter 'means' holds NaN or infinite values"),
    ("an averaged model that is a tensor", _edit("averaged", torch.zeros(3)),
     r"the checkpoint's averaged model \(ema_decay\) is malformed"),
    ("no Adam states", lambda c: {k: v for k, v in c.items() if k != "optimizers"},
     r"the checkpoint holds no optimizer states"),
    ("an Adam moment of another shape",
     lambda c: {**c, "optimizers": {**c["optimizers"], "means": {
         **c["optimizers"]["means"], "state": {0: {"step": torch.tensor(2.0),
                                                   "exp_avg": torch.zeros(2, 3),
                                                   "exp_avg_sq": torch.zeros(2, 3)}}}}},
     r"optimizer state means\.exp_avg is \[2, 3\], expected a float tensor of shape \[\d+, 3\]"),
    ("another strategy's state", _edit("strategy_state", {"binoms": torch.zeros(51, 51)}),
     r"strategy_state holds \['binoms'\], the strategy keeps \['count', 'grad2d', "
     r"'scene_scale'\]"),
    ("a strategy count of other Gaussians", _edit_in("strategy_state", "count", torch.zeros(7)),
     r"strategy_state\['count'\] is \[7\], which the run's strategy does not keep there"),
    ("another generator's state", _edit("rng", torch.zeros(16, dtype=torch.uint8)),
     r"rng must be torch's CPU generator state \(uint8 \[\d+\]\), got torch\.uint8 \[16\]"),
    ("a log of words", _edit_in("history", "loss", ["low", "lower"]),
     r"history\['loss'\] must be a list of numbers"),
    ("a log of ragged lists", _edit_in("history", "psnr", [1.0]),
     r"history lists differ in length"),
    ("a window of words", _edit("window", "abc"), r"window must be a list of"),
    ("features of words", _edit("features", {"pose_opt": "yes"}),
     r"features must be a dict of each feature's state"),
]
COMMANDS = [("eval", []), ("render", []), ("export", ["--to", "ply"]),
            ("train", ["--set", "steps=4"])]


@pytest.mark.parametrize("what, edit, message", FOREIGN, ids=[f[0] for f in FOREIGN])
def test_a_foreign_checkpoint_is_one_line_for_every_command(trained, tmp_path, capsys, what,
                                                            edit, message):
    run, ckpt = trained
    bad = tmp_path / "run"
    (bad / "checkpoints").mkdir(parents=True)
    shutil.copy(run / "config.toml", bad / "config.toml")
    path = bad / "checkpoints" / "step_0000002.pt"
    torch.save(edit(ckpt), path)
    before = sorted(p.relative_to(bad) for p in bad.rglob("*"))
    for command, extra in COMMANDS:
        argv = [command, str(bad), *extra]
        if command == "train":
            argv = ["train", "--resume", str(bad), *extra]
        assert main(argv) == 2, argv
        line = one_error_line(capsys, command)
        assert f"{path}: " in line and re.search(message, line), line
        assert sorted(p.relative_to(bad) for p in bad.rglob("*")) == before  # nothing written


def test_a_trainer_given_a_foreign_checkpoint_says_so(trained, tmp_path):
    run, ckpt = trained
    cfg = load_config(run / "config.toml")
    dataset = load_scene(cfg, log=lambda _: None)
    with pytest.raises(ValueError, match=r"^checkpoint: strategy_state holds \['x'\]"):
        Trainer(cfg, dataset, tmp_path / "run", checkpoint={**ckpt, "strategy_state": {"x": 1}},
                log=lambda _: None)
    trainer = Trainer(cfg, dataset, tmp_path / "run", checkpoint=ckpt, log=lambda _: None)
    assert trainer.step == 2  # the checkpoint itself passes


# --- 6. masks that hide every pixel: undefined metrics are null, and said so ------------------


def _strict(path):
    """The JSON file ``path``, refusing NaN and Infinity (which are not JSON)."""
    def refuse(name):
        raise AssertionError(f"{path.name} holds {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_masks_that_hide_every_pixel_give_null_metrics(capture, tmp_path, capsys):
    col, _ = capture
    data = tmp_path / "col"
    shutil.copytree(col, data)
    (data / "masks").mkdir()
    for image in (data / "images").iterdir():
        write_png(data / "masks" / f"{image.name}.png", np.zeros((H, W), np.uint8))
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--set", f"run_dir={run}", "--set", "steps=4",
                 "--set", "test_every=2", *RUN_KEYS[6:]]) == 0
    out = capsys.readouterr().out
    metrics = _strict(run / "metrics.json")
    assert metrics["masked_psnr"] is None and metrics["masked_ssim"] is None
    assert all(v["masked_psnr"] is None and v["masked_ssim"] is None for v in metrics["views"])
    assert isinstance(metrics["psnr"], float)  # the unmasked metrics are still there
    assert ("metrics.json: undefined (no pixel counted) or infinite metrics written as null: "
            "masked_psnr, masked_ssim, masked_psnr of view_000, masked_ssim of view_000") in out
    assert "masked PSNR undefined" in out  # the closing line
    history = _strict(run / "history.json")
    assert history["psnr"] == [None] * 4 and history["loss"] == [0.0] * 4  # nothing to fit
    assert ("history.json: undefined or infinite numbers written as null (a PSNR where no "
            "pixel counted, or of a perfect render): psnr[0], psnr[1], psnr[2], psnr[3]") in out
    assert main(["eval", str(run)]) == 0  # the checkpoint's NaN PSNRs load and are written
    assert _strict(run / "metrics.json")["masked_psnr"] is None


def test_the_masked_metrics_of_the_views_that_count_a_pixel():
    image, target = torch.rand(2, 20, 20, 3).unbind(0)
    hidden = torch.zeros(20, 20, dtype=torch.bool)
    border = hidden.clone()
    border[0] = True  # kept pixels, but no SSIM window centred on one
    assert view_metrics(image, target, hidden) == {"masked_psnr": None, "masked_ssim": None}
    got = view_metrics(image, target, border)
    assert got["masked_ssim"] is None and math.isfinite(got["masked_psnr"])
    log = TrainingLog()
    nan, mse = torch.tensor(math.nan, dtype=torch.float64), torch.tensor(0.01, dtype=torch.float64)
    log.record(1, torch.tensor(0.5), nan, False, 1.0, 10)  # a step whose views count no pixel
    log.record(2, torch.tensor(0.3), mse, True, 2.0, 10)
    assert log.history["psnr"] == [20.0] and log.history["loss"] == [pytest.approx(0.4)]
    assert TrainingLog(window=[1.0, 40.0, 2]).window == [1.0, 40.0, 2, 2]  # older checkpoints
    data, nulled = strict_json_bytes({"a": math.inf, "b": [math.nan, 1.0]})
    assert json.loads(data) == {"a": None, "b": [None, 1.0]} and nulled == ["a", "b[0]"]


# --- 7. NaN or Inf in the points or the cameras: refused at load, before the run folder -------


def _colmap_with(col, out, fmt, edit):
    """A copy of the COLMAP capture ``col`` in ``out``, its model rewritten in ``fmt`` after
    ``edit(cameras, images, xyz)`` (lists of records, [P, 3] array) changed it in place."""
    shutil.copytree(col, out, ignore=shutil.ignore_patterns("sparse"))
    cams, images, xyz, rgb = read_model(col / "sparse" / "0")
    cams = [dataclasses.replace(c, params=c.params.copy()) for c in cams.values()]
    images = [dataclasses.replace(im, tvec=im.tvec.copy())
              for im in sorted(images.values(), key=lambda im: im.name)]
    xyz = xyz.copy()
    edit(cams, images, xyz)
    write_model(out / "sparse" / "0", cams, images, xyz, rgb, fmt=fmt)
    return out


def _set(array, index, value):
    array[index] = value


NON_FINITE_COLMAP = [
    ("bin", lambda c, i, x: _set(x, 5, [math.nan, 0.0, 1.0]),
     r"sparse/0/points3D\.bin: 3D point 5 \(POINT3D_ID \d+\) has a non-finite position "
     r"\(nan, 0\.0, 1\.0\); 1 of the \d+ points do"),
    ("txt", lambda c, i, x: _set(x, 2, [0.0, math.inf, 1.0]),
     r"sparse/0/points3D\.txt:\d+: 3D point 2 has a non-finite position \(0\.0, inf, 1\.0\)"),
    ("txt", lambda c, i, x: _set(i[1].tvec, 0, math.nan),
     r"sparse/0/images\.txt: image 'view_001\.png' has a non-finite translation \[nan, "),
    ("bin", lambda c, i, x: _set(c[0].params, 2, -math.inf),
     r"sparse/0/cameras\.bin: camera \d+ \(PINHOLE\): parameter 2 of \[.*-inf.*\] is not "
     r"finite"),
]


@pytest.mark.parametrize("fmt, edit, message", NON_FINITE_COLMAP)
def test_non_finite_colmap_numbers_are_refused_at_load(capture, tmp_path, capsys, fmt, edit,
                                                       message):
    data = _colmap_with(capture[0], tmp_path / "col", fmt, edit)
    line = train_fails(capsys, data, tmp_path / "run")
    assert re.search(message, line), line


def test_non_finite_nerfstudio_numbers_are_refused_at_load(capture, tmp_path, capsys):
    _, ns = capture
    data = tmp_path / "ns"
    shutil.copytree(ns, data)
    ply = data / "sparse_pc.ply"
    good = ply.read_text()
    lines = good.splitlines()
    body = lines.index("end_header") + 1
    ply.write_text("\n".join(lines[:body + 3] + ["nan 0.5 1.0 10 20 30"] + lines[body + 4:]))
    line = train_fails(capsys, data, tmp_path / "run")
    assert re.search(r"sparse_pc\.ply: vertex 3 has a non-finite position \(nan, 0\.5, 1\.0\)",
                     line), line
    floats = good.replace("property uint8 red", "property float red").splitlines()
    floats[body + 1] = "0.1 0.2 0.3 nan 20 30"  # a float colour that would cast to any byte
    ply.write_text("\n".join(floats))
    line = train_fails(capsys, data, tmp_path / "run")
    assert "sparse_pc.ply: vertex 1 has a non-finite colour (nan, 20.0, 30.0)" in line, line
    ply.write_text(good)
    meta = json.loads((data / "transforms.json").read_text())
    (data / "transforms.json").write_text(json.dumps({**meta, "fl_x": math.inf}))
    assert "fl_x must be finite, got inf" in train_fails(capsys, data, tmp_path / "run")


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(cx=math.nan), r"the principal point must be finite, got cx=nan"),
    (lambda m: m.update(w=math.inf, h=16), r"w must be a number of pixels, got inf"),
    # finite in the file, but the camera's position is beyond float32: the pose is not
    (lambda m: m["frames"][1]["transform_matrix"][0].__setitem__(3, 1e300),
     r"train view 'r_1' has a non-finite world-to-camera matrix"),
])
def test_non_finite_blender_numbers_are_refused_at_load(tmp_path, capsys, edit, message):
    data = write_synthetic_dataset(tmp_path / "blender", n_train=3, n_test=1, size=16, seed=0)
    meta = json.loads((data / "transforms_train.json").read_text())
    edit(meta)
    (data / "transforms_train.json").write_text(json.dumps(meta))
    line = train_fails(capsys, data, tmp_path / "run")
    assert re.search(message, line), line


def test_a_resume_that_fails_leaves_the_run_as_it_was(trained, tmp_path, capsys):
    """--resume with overrides writes the run's config.toml only once the dataset loaded
    and the trainer took the checkpoint."""
    run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(copy), "--set", "steps=9",
                 "--set", f"data={tmp_path / 'moved'}"]) == 2
    assert f"dataset folder not found: {tmp_path / 'moved'}" in one_error_line(capsys)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
