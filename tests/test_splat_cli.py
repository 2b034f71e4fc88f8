"""gsplat checkpoints (``ckpts/ckpt_N_rank0.pt``) and the commands that open splat files:
``tilesplat export --to FORMAT`` for every format, ``view``'s loader, ``train --init FILE``."""

from __future__ import annotations

import math

import pytest
import torch

from tilesplat.cli import main
from tilesplat.cli._model import open_model
from tilesplat.io.gaussians import BY_NAME, read_gaussians
from tilesplat.io.gsplat_ckpt import read_gsplat_checkpoint, save_gsplat_checkpoint
from tilesplat.io.ply import load_ply, save_ply

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gaussians(n: int, degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    out = {
        "means": torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "scales": torch.rand(n, 3, generator=g) * 2 - 5,
        "opacities": torch.randn(n, generator=g),
    }
    sh = torch.rand(n, k, 3, generator=g) * 0.6 - 0.3
    return out | {"sh0": sh[:, :1], "shN": sh[:, 1:]}


def _gsplat_run(folder, parts, step=6999, antialiased=False):
    (folder / "ckpts").mkdir(parents=True)
    for rank, g in enumerate(parts):
        torch.save({"step": step, "splats": dict(g)}, folder / "ckpts" /
                   f"ckpt_{step}_rank{rank}.pt")  # fmt: skip
    torch.save({"step": 99, "splats": dict(parts[0])}, folder / "ckpts" / "ckpt_99_rank0.pt")
    (folder / "cfg.yml").write_text(f"max_steps: 30000\nantialiased: {str(antialiased).lower()}\n")


def test_gsplat_checkpoints_open_as_files_and_result_folders(tmp_path):
    a, b = _gaussians(20, 3), _gaussians(7, 3, seed=1)
    _gsplat_run(tmp_path / "res", [a, b], antialiased=True)
    data, step, files = read_gsplat_checkpoint(tmp_path / "res")
    assert step == 6999 and [f.name for f in files] == ["ckpt_6999_rank0.pt", "ckpt_6999_rank1.pt"]
    assert data.antialiased
    for k in a:  # both ranks' shards, in rank order
        assert torch.equal(data.gaussians[k], torch.cat([a[k], b[k]])), k
    one = open_model(tmp_path / "res" / "ckpts" / "ckpt_6999_rank0.pt")
    assert torch.equal(one.gaussians["shN"], a["shN"]) and "gsplat, step 6999" in one.source
    assert len(open_model(tmp_path / "res").gaussians["means"]) == 27


def test_gsplat_checkpoint_errors(tmp_path):
    g = _gaussians(5, 1)

    class Evil:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    torch.save({"step": 1, "splats": dict(g), "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="evil.pt: not a readable PyTorch checkpoint"):
        read_gsplat_checkpoint(tmp_path / "evil.pt")  # weights_only: nothing unpickled
    bad = dict(g)
    bad["features"] = torch.zeros(5, 32)
    torch.save({"step": 1, "splats": bad}, tmp_path / "app.pt")
    with pytest.raises(ValueError, match="appearance embeddings"):
        read_gsplat_checkpoint(tmp_path / "app.pt")
    bad = {**dict(g), "shN": torch.zeros(5, 4, 3)}
    torch.save({"step": 1, "splats": bad}, tmp_path / "shn.pt")
    with pytest.raises(ValueError, match=r"splats\['shN'\] has shape"):
        read_gsplat_checkpoint(tmp_path / "shn.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="junk.pt"):
        open_model(tmp_path / "junk.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        read_gsplat_checkpoint(tmp_path / "empty")


def test_gsplat_checkpoint_written_is_what_gsplat_loads(tmp_path):
    g = _gaussians(9, 2)
    save_gsplat_checkpoint(tmp_path / "c.pt", g, step=3)
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    assert ckpt["step"] == 3 and ckpt["splats"]["shN"].shape == (9, 8, 3)
    assert torch.equal(ckpt["splats"]["scales"], g["scales"])
    back = read_gsplat_checkpoint(tmp_path / "c.pt")[0].gaussians
    assert all(torch.equal(back[k], g[k]) for k in g)


def test_export_to_every_format(tmp_path, capsys):
    g = _gaussians(300, 3)
    src = save_ply(tmp_path / "in.ply", g, antialiased=True)
    names = [n for n in BY_NAME if n != "ply"] + ["gsplat-ckpt"]
    args = ["export", str(src)]
    for name in names:
        args += ["--to", name]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("300 Gaussians from") == len(names)
    made = {n: p for n, p in zip(names, ["in.compressed.ply", "in.splat", "in.spz", "in.sog",
                                         "in_sog/meta.json", "in.glb", "in.pt"], strict=True)}
    for name, rel in made.items():
        path = tmp_path / rel
        assert path.is_file(), name
        if name == "gsplat-ckpt":
            back = read_gsplat_checkpoint(path)[0]
        else:
            back = read_gaussians(path)
        assert len(back.gaussians["means"]) == 300, name
        assert math.isclose(float(back.gaussians["means"].mean()), float(g["means"].mean()),
                            abs_tol=1e-3), name  # fmt: skip
        if name in ("compressed-ply", "spz", "sog", "sog-folder"):
            assert back.antialiased, name  # the flag travels where the format holds it
    assert (tmp_path / "in.spz").read_bytes()[:4] == b"NGSP"
    assert main(["export", str(src), "--spz", str(tmp_path / "v3.spz"), "--spz-version", "3"]) == 0
    assert (tmp_path / "v3.spz").read_bytes()[:2] == b"\x1f\x8b"
    assert main(["export", str(tmp_path / "in.sog"), "--to", "ply", "--out",
                 str(tmp_path / "back.ply")]) == 0  # fmt: skip
    assert load_ply(tmp_path / "back.ply")["shN"].shape == (300, 15, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "IN"], "give an output"),
        (["export", "IN", "--spz", "OUT.ply"], "must end in .spz"),
        (["export", "IN", "--to", "glb", "--out", "x.sog"], "must end in .glb"),
        (["export", "IN", "--to", "ply", "--out", "in.ply"], "overwrite the source"),
        (["export", "IN", "--to", "spz", "--out", "a.spz", "--out", "b.spz"], "one per --to"),
        (["export", "IN", "--ply", "nofolder/x.ply"], "does not exist"),
        (["export", "missing.ply", "--ply", "x.ply"], "no run folder, checkpoint or splat"),
        (["export", "BAD", "--ply", "x.ply"], "corrupt gzip stream"),
        (["export", "IN", "--to", "sog"], "SH degree 0-3"),
    ],
)
def test_export_errors_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    save_ply(tmp_path / "in.ply", _gaussians(5, 4))
    (tmp_path / "bad.spz").write_bytes(b"\x1f\x8b" + bytes(10))
    args = [{"IN": "in.ply", "BAD": "bad.spz"}.get(a, a) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_train_init_starts_from_the_files_gaussians(tmp_path, capsys, monkeypatch):
    from tilesplat.data.dataset import load_dataset
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.features.spatial_order import morton_order
    from tilesplat.train.loop.trainer import Trainer

    g = _gaussians(64, 3)
    _gsplat_run(tmp_path / "res", [g])
    data = load_dataset(write_synthetic_dataset(tmp_path / "d", n_train=2, n_test=1, size=16))
    cfg = TrainConfig(steps=1, sh_degree=1, init_file=str(tmp_path / "res"), progress=False,
                      lpips=False)  # fmt: skip
    params = Trainer(cfg, data, tmp_path / "run").params
    order = morton_order(g["means"])  # the trainer keeps its Gaussians sorted in space
    assert torch.equal(params["means"].detach(), g["means"][order])
    assert torch.equal(params["shN"].detach(), g["shN"][order, :3])  # degree 3 cut to 1
    monkeypatch.chdir(tmp_path)
    ply = save_ply(tmp_path / "start.ply", _gaussians(40, 0))
    args = ["train", "--init", str(ply)]
    for s in ("synthetic_size=16", "synthetic_train=2", "synthetic_test=1", "steps=1",
              "sh_degree=1", "progress=false", "lpips=false", f"cache_dir={tmp_path / 'c'}",
              "run_dir=runs/init"):  # fmt: skip
        args += ["--set", s]
    assert main(args) == 0
    out = load_ply(tmp_path / "runs" / "init" / "point_cloud.ply")
    assert out["means"].shape == (40, 3) and out["shN"].shape == (40, 3, 3)
    assert main(["train", "--init", str(tmp_path / "nothing.ply")]) == 2
    assert "no such file" in capsys.readouterr().err
    torch.save({"format": "tilesplat-checkpoint", "params": {}}, tmp_path / "ts.pt")
    with pytest.raises(ValueError, match="tilesplat checkpoint; continue its run with --resume"):
        Trainer(TrainConfig(init_file=str(tmp_path / "ts.pt"), progress=False), data,
                tmp_path / "run2")  # fmt: skip
