"""Every file a run writes atomically gets the mode the umask implies, not mkstemp's 0600."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from tilesplat.cli import main
from tilesplat.io.atomic import atomic_write_bytes, current_umask, default_file_mode


@pytest.fixture
def umask():
    """Run a test under a chosen umask, restoring the old one."""
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_atomic_write_follows_the_umask(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    assert default_file_mode() == 0o666 & ~mask
    path = atomic_write_bytes(tmp_path / "sub" / "a.bin", b"x")
    assert _mode(path) == 0o666 & ~mask
    assert [p.name for p in path.parent.iterdir()] == ["a.bin"]  # no temp file left


def test_every_file_of_a_run_is_0644_under_umask_022(tmp_path, umask, monkeypatch):
    umask(0o022)
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    args = ["train"]
    for s in (
        "synthetic_size=16", "synthetic_train=3", "synthetic_test=1", "steps=3",
        "init_points=50", "progress=false", "lpips=false", f"cache_dir={tmp_path / 'c'}",
    ):  # fmt: skip
        args += ["--set", s]
    assert main(args) == 0
    run = tmp_path / "runs" / "synthetic"
    assert main(["export", str(run), "--ply", str(tmp_path / "out.ply")]) == 0
    assert main(["export", str(run), "--splat", str(tmp_path / "out.splat")]) == 0
    assert main(["export", str(run), "--spz", str(tmp_path / "out.spz")]) == 0
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    for expected in (
        "point_cloud.ply", "metrics.json", "config.toml", "curve.png", "history.json",
        "step_0000003.pt", "out.ply", "out.splat", "out.spz", "transforms_train.json",
    ):  # fmt: skip
        assert expected in names
    wrong = {str(p.relative_to(tmp_path)): oct(_mode(p)) for p in written if _mode(p) != 0o644}
    assert not wrong, f"files not 0644 under umask 022: {wrong}"
