"""The cheap gsplat 1.5.3 names with real implementations that are not ops: SelectiveAdam
(gsplat's step rule) and export_splats (against gsplat's exporter). The ops among them
(world_to_cam, proj, rasterize_to_indices_in_range, accumulate) are tested in tests/ops."""

import pytest
import torch

import tilesplat
from helpers import assert_close

pytest.importorskip("gsplat.cuda._torch_impl")  # the oracle: gsplat 1.5.3 (the dev extra)


def test_selective_adam_updates_only_visible_rows():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    opt = tilesplat.SelectiveAdam([{"params": [p], "lr": 0.1}], eps=1e-8, betas=(0.9, 0.99))
    m, v, ref = torch.zeros(5, 3), torch.zeros(5, 3), p.detach().clone()
    visible = torch.tensor([True, False, True, True, False])
    for _ in range(3):
        p.grad = torch.randn(5, 3)
        g = p.grad.clone()
        opt.step(visibility=visible)
        m_new, v_new = 0.9 * m + 0.1 * g, 0.99 * v + 0.01 * g * g
        upd = 0.1 * m_new / (v_new.sqrt() + 1e-8)  # gsplat's kernel: no bias correction
        rows = visible[:, None]
        m, v = torch.where(rows, m_new, m), torch.where(rows, v_new, v)
        ref = torch.where(rows, ref - upd, ref)
        assert_close("param", p.detach(), ref, 1e-6, 1e-6)
    st = opt.state[p]
    assert_close("exp_avg", st["exp_avg"], m, 1e-7, 1e-6)
    assert not st["exp_avg_sq"][~visible].any()
    with pytest.raises(ValueError, match="first dimension"):
        opt.step(visibility=torch.ones(4, dtype=torch.bool))


def _splats(n=700, k=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        means=torch.randn(n, 3, generator=g) * 3,
        scales=torch.randn(n, 3, generator=g) - 2,
        quats=torch.randn(n, 4, generator=g),
        opacities=torch.randn(n, generator=g) * 3,
        sh0=torch.randn(n, 1, 3, generator=g),
        shN=torch.randn(n, k - 1, 3, generator=g) * 0.3,
    )


def test_export_splats_formats(tmp_path):
    from gsplat import exporter as theirs

    from tilesplat.io.ply import load_ply
    from tilesplat.io.splat import load_splat

    s = _splats()
    assert tilesplat.export_splats(**s, format="ply_compressed") == theirs.export_splats(
        **s, format="ply_compressed")

    data = tilesplat.export_splats(**s, format="ply", save_to=str(tmp_path / "a.ply"))
    assert (tmp_path / "a.ply").read_bytes() == data
    (tmp_path / "gsplat.ply").write_bytes(theirs.export_splats(**s, format="ply"))
    ours, want = load_ply(tmp_path / "a.ply"), load_ply(tmp_path / "gsplat.ply")
    for key in want:
        assert torch.equal(ours[key], want[key]), key
    assert torch.equal(ours["shN"], s["shN"])

    (tmp_path / "b.splat").write_bytes(tilesplat.export_splats(**s, format="splat"))
    got = load_splat(tmp_path / "b.splat")
    assert len(got["means"]) == 700
    order = torch.argsort(got["means"][:, 0])
    assert_close("splat means", got["means"][order],
                 s["means"][torch.argsort(s["means"][:, 0])], 1e-6, 1e-6)


def test_export_splats_drops_non_finite_and_checks_shapes():
    s = _splats(n=10, k=1)
    s["means"][3, 1] = float("nan")
    s["opacities"][5] = float("inf")
    assert len(tilesplat.export_splats(**s, format="splat")) == 8 * 32
    with pytest.raises(ValueError, match="sh0"):
        tilesplat.export_splats(**{**s, "sh0": s["sh0"][:, 0]})
    with pytest.raises(ValueError, match="format"):
        tilesplat.export_splats(**s, format="spz")
