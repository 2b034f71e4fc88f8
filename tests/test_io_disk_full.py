"""A write that runs out of space: one clear error naming the file, the old file kept, no
temp file left, and one line from the CLI instead of a traceback."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from tilesplat.io.atomic import DiskFullError, atomic_path, atomic_writer


def _full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _torch_like_failure() -> None:
    """What torch.save's zip writer raises when the disk fills: a RuntimeError raised while
    handling the OSError of the write."""
    try:
        raise _full()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None


@pytest.mark.parametrize("failure", [_full, _torch_like_failure])
def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, failure):
    path = tmp_path / "model.ply"
    path.write_bytes(b"old")
    with pytest.raises(DiskFullError, match="no room to write .*model.ply") as info:
        with atomic_writer(path) as f:
            f.write(b"new, half written")
            exc = failure()
            if exc is not None:
                raise exc
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ply"]  # no temp file


def test_a_full_disk_through_atomic_path(tmp_path):
    path = tmp_path / "video.mp4"
    with pytest.raises(DiskFullError, match="video.mp4"):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"part")
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exc", [FileNotFoundError(errno.ENOENT, "gone"), ValueError("bad"),
                                 RuntimeError("a bug")])
def test_other_failures_pass_through_unchanged(tmp_path, exc):
    path = tmp_path / "x.bin"
    with pytest.raises(type(exc)) as info:
        with atomic_writer(path) as f:
            f.write(b"x")
            raise exc
    assert info.value is exc and not isinstance(info.value, DiskFullError)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_on_a_full_disk(tmp_path, monkeypatch):
    from tilesplat.train.rundir import checkpoint

    path = tmp_path / "checkpoints" / "step_0000010.pt"
    checkpoint.save_checkpoint(path, {"step": 10, "x": torch.ones(3)})

    def full_save(obj, f):
        f.write(b"PK partial")
        _torch_like_failure()

    monkeypatch.setattr(checkpoint.torch, "save", full_save)
    with pytest.raises(DiskFullError, match="step_0000010.pt"):
        checkpoint.save_checkpoint(path, {"step": 20})
    assert checkpoint.load_checkpoint(path)["step"] == 10  # the old checkpoint is whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_the_cli_says_it_in_one_line(monkeypatch, capsys):
    import tilesplat.cli.eval as eval_command
    from tilesplat.cli import main

    def full(args):
        raise DiskFullError(errno.ENOSPC, "no room to write run/metrics.json: No space left")

    monkeypatch.setattr(eval_command, "run", full)
    assert main(["eval", "run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilesplat eval: error:") and "metrics.json" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_no_room_even_for_the_temp_file(tmp_path, monkeypatch):
    import tilesplat.io.atomic as atomic

    def full_mkstemp(**kwargs):
        raise _full()

    path = tmp_path / "a.json"
    path.write_text("old")
    monkeypatch.setattr(atomic.tempfile, "mkstemp", full_mkstemp)
    with pytest.raises(DiskFullError, match="a.json"):
        with atomic_writer(path) as f:
            f.write(b"new")
    with pytest.raises(DiskFullError, match="b.mp4"):
        with atomic_path(tmp_path / "b.mp4"):
            pass
    assert path.read_text() == "old"
