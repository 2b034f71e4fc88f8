"""PLY export / import in the original 3DGS layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tilesplat.io.ply import load_ply, save_ply, sh_rest_count


def _gaussians(n: int, degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    out = {
        "means": torch.randn(n, 3, generator=g) * 10,
        "quats": torch.randn(n, 4, generator=g),
        "log_scales": torch.randn(n, 3, generator=g) - 4,
        "opacity_logits": torch.randn(n, generator=g) * 3,
        "sh": torch.randn(n, k, 3, generator=g),
    }
    # values that a lossy path (float64 detour, text formatting) would not keep bit for bit
    out["means"][0] = torch.tensor([-0.0, 1e-38, 3.4e38])
    out["sh"][-1, 0] = torch.tensor([float.fromhex("0x1.fffffep-1"), -1e-45, 7.0])
    return out


def _header(path) -> tuple[list[str], int]:
    raw = path.read_bytes()
    end = raw.index(b"end_header\n") + len(b"end_header\n")
    return raw[:end].decode("ascii").splitlines(), end


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_is_bitwise(tmp_path, degree):
    g = _gaussians(17, degree)
    path = save_ply(tmp_path / "a.ply", **g)
    back = load_ply(path)
    assert set(back) == set(g)
    for name, t in g.items():
        assert back[name].dtype == torch.float32 and back[name].shape == t.shape, name
        assert torch.equal(back[name].view(torch.int32), t.view(torch.int32)), name


def test_header_layout_and_size(tmp_path):
    n = 5
    path = save_ply(tmp_path / "a.ply", **_gaussians(n, 3))
    lines, end = _header(path)
    props = [ln.split()[2] for ln in lines if ln.startswith("property")]
    assert lines[:3] == ["ply", "format binary_little_endian 1.0", f"element vertex {n}"]
    assert all(ln.startswith("property float ") for ln in lines if ln.startswith("property"))
    expected = (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(45)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )
    assert props == expected
    assert path.stat().st_size == end + n * 62 * 4
    assert [sh_rest_count(d) for d in range(4)] == [0, 9, 24, 45]


def test_f_rest_is_channel_major_and_raw_values(tmp_path):
    n, degree = 2, 2
    k = (degree + 1) ** 2
    g = _gaussians(n, degree)
    # sh[i, b, c] = 100 c + b (+ 1000 i): channel-major f_rest_j = sh[i, 1 + j % (k-1), j // (k-1)]
    idx = torch.arange(n)[:, None, None] * 1000.0
    g["sh"] = idx + torch.arange(k)[None, :, None] + 100.0 * torch.arange(3)[None, None, :]
    path = save_ply(tmp_path / "a.ply", **g)
    lines, end = _header(path)
    props = [ln.split()[2] for ln in lines if ln.startswith("property")]
    data = np.frombuffer(path.read_bytes()[end:], dtype="<f4").reshape(n, len(props))
    col = {p: data[:, i] for i, p in enumerate(props)}
    for j in range(3 * (k - 1)):
        c, b = divmod(j, k - 1)
        np.testing.assert_array_equal(col[f"f_rest_{j}"], np.arange(n) * 1000.0 + 1 + b + 100 * c)
    np.testing.assert_array_equal(col["f_dc_1"], np.arange(n) * 1000.0 + 100)
    np.testing.assert_array_equal(col["opacity"], g["opacity_logits"].numpy())
    np.testing.assert_array_equal(col["scale_2"], g["log_scales"][:, 2].numpy())
    np.testing.assert_array_equal(col["rot_0"], g["quats"][:, 0].numpy())  # w first
    np.testing.assert_array_equal(col["nx"], np.zeros(n))


def test_truncated_file_names_the_file(tmp_path):
    path = save_ply(tmp_path / "a.ply", **_gaussians(4, 1))
    raw = path.read_bytes()
    _, end = _header(path)
    for cut in (len(raw) - 1, end + 3, end, end - 5, 10, 0):
        bad = tmp_path / f"cut{cut}.ply"
        bad.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match=f"cut{cut}.ply"):
            load_ply(bad)


def _write_header_ply(path, props: list[str], n: int = 2, fmt: str = "binary_little_endian"):
    header = f"ply\nformat {fmt} 1.0\nelement vertex {n}\n"
    header += "".join(f"property float {p}\n" for p in props) + "end_header\n"
    path.write_bytes(header.encode() + np.zeros(n * len(props), "<f4").tobytes())
    return path


BASE = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"]
TAIL = ["scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]


def test_malformed_headers(tmp_path):
    ok = load_ply(_write_header_ply(tmp_path / "ok.ply", BASE + TAIL))  # no normals: accepted
    assert ok["sh"].shape == (2, 1, 3)
    with pytest.raises(ValueError, match=r"missing.*opacity"):
        load_ply(_write_header_ply(tmp_path / "m.ply", BASE[:-1] + TAIL))
    rest = [f"f_rest_{i}" for i in range(10)]
    with pytest.raises(ValueError, match="f_rest"):
        load_ply(_write_header_ply(tmp_path / "r.ply", BASE + rest + TAIL))
    with pytest.raises(ValueError, match="binary_little_endian"):
        load_ply(_write_header_ply(tmp_path / "be.ply", BASE + TAIL, fmt="binary_big_endian"))
    (tmp_path / "junk.ply").write_bytes(b"\x00\x01 not a ply")
    with pytest.raises(ValueError, match="junk.ply"):
        load_ply(tmp_path / "junk.ply")
    (tmp_path / "hdr.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nbogus\nend_header\n")
    with pytest.raises(ValueError, match="malformed PLY header"):
        load_ply(tmp_path / "hdr.ply")
    with pytest.raises(FileNotFoundError, match="nothere.ply"):
        load_ply(tmp_path / "nothere.ply")


def test_double_properties_are_read(tmp_path):
    props = BASE + TAIL
    header = "ply\nformat binary_little_endian 1.0\ncomment x\nelement vertex 1\n"
    header += "".join(f"property double {p}\n" for p in props) + "end_header\n"
    values = np.arange(len(props), dtype="<f8")
    (tmp_path / "d.ply").write_bytes(header.encode() + values.tobytes())
    out = load_ply(tmp_path / "d.ply")
    assert out["means"].tolist() == [[0.0, 1.0, 2.0]]
    assert out["quats"].tolist() == [[10.0, 11.0, 12.0, 13.0]]


def test_save_is_atomic_and_checks_shapes(tmp_path):
    g = _gaussians(3, 1)
    save_ply(tmp_path / "a.ply", **g)
    save_ply(tmp_path / "a.ply", **g)  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ply"]
    with pytest.raises(ValueError, match="quats"):
        save_ply(tmp_path / "b.ply", **{**g, "quats": g["quats"][:, :3]})
    with pytest.raises(ValueError, match="square"):
        save_ply(tmp_path / "b.ply", **{**g, "sh": torch.zeros(3, 5, 3)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ply"]


def test_reads_gsplat_export_and_matches_it(tmp_path):
    """Interop with an independent writer: gsplat 1.5.3's own PLY exporter (no normals)."""
    from gsplat.exporter import export_splats

    g = _gaussians(9, 3)
    export_splats(
        means=g["means"],
        scales=g["log_scales"],
        quats=g["quats"],
        opacities=g["opacity_logits"],
        sh0=g["sh"][:, :1],
        shN=g["sh"][:, 1:],
        format="ply",
        save_to=str(tmp_path / "gsplat.ply"),
    )
    theirs = load_ply(tmp_path / "gsplat.ply")
    ours = load_ply(save_ply(tmp_path / "ours.ply", **g))
    for name, t in g.items():
        assert torch.equal(theirs[name], t), name
        assert torch.equal(ours[name], t), name
