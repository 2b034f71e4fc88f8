"""`.splat` (antimatter15) and `.spz` (Niantic, version 3) files: round trips within each
format's quantisation, the byte layout, untrusted input, and `tilesplat export` as converter."""

from __future__ import annotations

import gzip
import math
import struct

import numpy as np
import pytest
import torch

from tilesplat.cli import main
from tilesplat.constants import SH_C0
from tilesplat.io.gaussians import load_gaussians, save_gaussians
from tilesplat.io.ply import load_ply, save_ply
from tilesplat.io.splat import load_splat, save_splat, splat_order
from tilesplat.io.spz import (
    FLIP_SH,
    HEADER,
    MAGIC,
    encode_spz,
    load_spz,
    pack_quats_v3,
    save_spz,
    unpack_quats_v3,
)


def _gaussians(n: int, degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Values inside every format's range (SH in [-0.9, 0.9], colours in [0, 1])."""
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    sh = torch.rand(n, k, 3, generator=g) * 1.8 - 0.9
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) / SH_C0 * 0.95
    return {
        "means": torch.randn(n, 3, generator=g) * 3,
        "quats": torch.randn(n, 4, generator=g),
        "log_scales": torch.rand(n, 3, generator=g) * 6 - 8,
        "opacity_logits": torch.randn(n, generator=g) * 2,
        "sh": sh,
    }


def _rotation_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest 1 - |<a, b>| of unit quaternions (q and -q are one rotation)."""
    a = torch.nn.functional.normalize(a.double(), dim=-1)
    b = torch.nn.functional.normalize(b.double(), dim=-1)
    return float((1 - (a * b).sum(-1).abs()).max())


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x.double())


# --- .spz --------------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 1, 3, 4])
def test_spz_round_trip_within_quantisation(tmp_path, degree):
    g = _gaussians(500, degree)
    back = load_spz(save_spz(tmp_path / "a.spz", **g))
    assert back["sh"].shape == g["sh"].shape
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 4096 + 1e-6  # 12 fractional bits
    assert (back["log_scales"] - g["log_scales"]).abs().max() <= 0.5 / 16 + 1e-6
    assert _rotation_error(back["quats"], g["quats"]) < 2e-5  # 9 bits of |q| / sqrt(1/2)
    alpha = (_sigmoid(back["opacity_logits"]) - _sigmoid(g["opacity_logits"])).abs()
    assert alpha.max() <= 0.5 / 255 + 1e-6
    assert (back["sh"][:, 0] - g["sh"][:, 0]).abs().max() <= 0.5 / (0.15 * 255) + 1e-5
    if degree >= 1:  # 5 bits for degree 1, 4 for the rest, after rounding to 1/128
        err1 = (back["sh"][:, 1:4] - g["sh"][:, 1:4]).abs().max()
        assert err1 <= (4 + 0.5) / 128 + 1e-6
    if degree >= 2:
        assert (back["sh"][:, 4:] - g["sh"][:, 4:]).abs().max() <= (8 + 0.5) / 128 + 1e-6


def test_spz_layout_is_the_specs(tmp_path):
    g = _gaussians(3, 1)
    g["means"][0] = torch.tensor([1.0, 2.0, -0.5])
    g["log_scales"][0] = torch.tensor([-10.0, 0.0, 5.9])
    g["opacity_logits"][0] = 0.0
    g["quats"][0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    raw = gzip.decompress(save_spz(tmp_path / "a.spz", **g).read_bytes())
    magic, version, n, degree, bits, flags, reserved = HEADER.unpack(raw[:16])
    assert (magic, version, n, degree, bits, flags, reserved) == (MAGIC, 3, 3, 1, 12, 0, 0)
    assert raw[:16][:4] == b"NGSP"
    assert len(raw) == 16 + 3 * (9 + 1 + 3 + 3 + 4 + 9)
    pos = np.frombuffer(raw[16 : 16 + 27], np.uint8).reshape(3, 3, 3).astype(np.int32)
    fixed = pos[..., 0] | pos[..., 1] << 8 | pos[..., 2] << 16
    fixed = np.where(fixed >= 1 << 23, fixed - (1 << 24), fixed)
    # RDF (3DGS) -> RUB (SPZ): y and z flip
    assert fixed[0].tolist() == [4096, -8192, 2048]
    alphas = raw[16 + 27 : 16 + 30]
    assert alphas[0] == 128  # sigmoid(0) * 255 = 127.5 rounds to even... or up: both decode
    scales = raw[16 + 30 + 9 : 16 + 30 + 18]
    assert list(scales[:3]) == [0, 160, 254]
    rot = struct.unpack("<I", raw[16 + 48 : 16 + 52])[0]
    assert rot >> 30 == 3  # the largest component of the identity is w (index 3 of x, y, z, w)
    assert rot & ((1 << 30) - 1) == 0


def test_spz_smallest_three_against_exact_quaternions():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2000, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[:4] = np.eye(4)  # each axis the largest once
    back = unpack_quats_v3(pack_quats_v3(q))
    assert np.abs(np.linalg.norm(back, axis=1) - 1).max() < 1e-6
    assert (1 - np.abs((back * q).sum(1))).max() < 2e-5


def test_spz_version_2_reads_and_sh_flip_is_an_involution(tmp_path):
    g = _gaussians(200, 2)
    back = load_spz(save_spz(tmp_path / "v2.spz", **g, version=2))
    # 8 bits of x, y, z; w is recomputed, so it is poor where w is small (why v3 exists)
    assert _rotation_error(back["quats"], g["quats"]) < 1e-2
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 4096 + 1e-6
    assert set(FLIP_SH.tolist()) == {1.0, -1.0} and len(FLIP_SH) == 24


def test_spz_large_coordinates_use_fewer_fractional_bits(tmp_path):
    g = _gaussians(10, 0)
    g["means"][0, 0] = 5000.0
    raw = gzip.decompress(encode_spz(**g))
    bits = HEADER.unpack(raw[:16])[4]
    assert bits == 10  # 5000 * 2^10 < 2^23 <= 5000 * 2^11
    back = load_spz(save_spz(tmp_path / "a.spz", **g))
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 1024 + 1e-4
    g["means"][0, 0] = 1e7
    with pytest.raises(ValueError, match="24-bit range"):
        encode_spz(**g)


def _spz_bytes(header: tuple, body: bytes = b"") -> bytes:
    # mtime=0: the same bytes in every process (pytest-xdist workers must collect the same ids)
    return gzip.compress(HEADER.pack(*header) + body, mtime=0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "gzip"),
        (b"NGSP not compressed", "gzip"),
        (b"\x1f\x8b\x08\x00garbage-garbage", "corrupt gzip"),
        (gzip.compress(b"short", mtime=0), "no complete 16-byte header"),
        (_spz_bytes((0x12345678, 3, 1, 0, 12, 0, 0)), "magic"),
        (_spz_bytes((MAGIC, 1, 1, 0, 12, 0, 0)), "version 1 is not supported"),
        (_spz_bytes((MAGIC, 7, 1, 0, 12, 0, 0)), "version 7 is not supported"),
        (_spz_bytes((MAGIC, 3, 1, 5, 12, 0, 0)), "SH degree 5"),
        (_spz_bytes((MAGIC, 3, 1, 0, 30, 0, 0)), "fractional bits"),
        (_spz_bytes((MAGIC, 3, 1, 0, 12, 2, 0)), "extensions"),
        (_spz_bytes((MAGIC, 3, 0, 0, 12, 0, 0)), "no Gaussians"),
        (_spz_bytes((MAGIC, 3, 4_000_000_000, 0, 12, 0, 0)), "more than"),
        (_spz_bytes((MAGIC, 3, 2, 0, 12, 0, 0), bytes(20)), "truncated .spz"),
    ],
    ids=lambda v: v if isinstance(v, str) else "bytes",
)
def test_spz_rejects_malformed_files(tmp_path, data, message):
    path = tmp_path / "bad.spz"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message) as info:
        load_spz(path)
    assert str(path) in str(info.value)


def test_spz_does_not_inflate_past_what_the_header_needs(tmp_path):
    # 1 Gaussian of degree 0 needs 20 bytes; a 200 MB tail of zeros must not be inflated
    path = tmp_path / "bomb.spz"
    comp = gzip.compress(HEADER.pack(MAGIC, 3, 1, 0, 12, 0, 0) + bytes(20) + bytes(200 << 20))
    path.write_bytes(comp)
    assert len(comp) < 1 << 20
    assert load_spz(path)["means"].shape == (1, 3)


# --- .splat ------------------------------------------------------------------------------


def test_splat_round_trip_within_quantisation(tmp_path):
    g = _gaussians(400, 2)
    path = save_splat(tmp_path / "a.splat", **g)
    assert path.stat().st_size == 400 * 32
    back = load_splat(path)
    order = torch.from_numpy(splat_order(g["log_scales"].numpy(), g["opacity_logits"].numpy()))
    want = {k: v[order] for k, v in g.items()}
    assert torch.equal(back["means"], want["means"])  # float32 kept exactly
    assert (back["log_scales"] - want["log_scales"]).abs().max() < 1e-5
    assert back["sh"].shape == (400, 1, 3)
    assert (back["sh"][:, 0] - want["sh"][:, 0]).abs().max() <= 0.5 / 255 / SH_C0 + 1e-5
    alpha = (_sigmoid(back["opacity_logits"]) - _sigmoid(want["opacity_logits"])).abs()
    assert alpha.max() <= 0.5 / 255 + 1e-6
    assert _rotation_error(back["quats"], want["quats"]) < 2e-3  # 8 bits per component
    # largest first: volume x opacity never increases along the file
    key = want["log_scales"].double().sum(1) + torch.log(_sigmoid(want["opacity_logits"]))
    assert bool((key[1:] <= key[:-1]).all())


def test_splat_layout(tmp_path):
    g = _gaussians(1, 0)
    g["means"][0] = torch.tensor([1.0, -2.0, 3.0])
    g["log_scales"][0] = torch.log(torch.tensor([0.5, 1.0, 2.0]))
    g["quats"][0] = torch.tensor([2.0, 0.0, 0.0, 0.0])
    g["opacity_logits"][0] = 100.0
    g["sh"][0, 0] = torch.tensor([0.5, -0.5, 0.0]) / SH_C0
    raw = save_splat(tmp_path / "a.splat", **g).read_bytes()
    assert np.frombuffer(raw[:24], "<f4").tolist() == [1.0, -2.0, 3.0, 0.5, 1.0, 2.0]
    assert list(raw[24:]) == [255, 0, 128, 255, 255, 128, 128, 128]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no Gaussians"),
        (bytes(33), "not a multiple"),
        (np.array([0, 0, 0, 1, 1, 1], "<f4").tobytes() + bytes(4) + bytes([128] * 4),
         "rotation of Gaussian 0 is zero"),
        (np.array([0, 0, 0, 1, 0, 1], "<f4").tobytes() + bytes(4) + bytes([255] * 4),
         "scale of Gaussian 0"),
        (np.array([np.nan, 0, 0, 1, 1, 1], "<f4").tobytes() + bytes(4) + bytes([255] * 4),
         "means of Gaussian 0 is not finite"),
    ],
)  # fmt: skip
def test_splat_rejects_malformed_files(tmp_path, data, message):
    path = tmp_path / "bad.splat"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message):
        load_splat(path)


# --- dispatch and the CLI ----------------------------------------------------------------


def test_load_and_save_by_suffix(tmp_path):
    g = _gaussians(20, 1)
    for suffix in (".ply", ".splat", ".spz"):
        back = load_gaussians(save_gaussians(tmp_path / f"m{suffix}", g))
        assert back["means"].shape == (20, 3)
    with pytest.raises(ValueError, match="unknown splat file type '.obj'"):
        load_gaussians(tmp_path / "m.obj")
    with pytest.raises(FileNotFoundError):
        load_gaussians(tmp_path / "missing.spz")


def test_export_converts_between_formats(tmp_path, capsys):
    g = _gaussians(50, 3)
    ply = save_ply(tmp_path / "in.ply", **g)
    assert main(["export", str(ply), "--spz", str(tmp_path / "o.spz"),
                 "--splat", str(tmp_path / "o.splat")]) == 0  # fmt: skip
    assert "50 Gaussians" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "o.spz"), "--ply", str(tmp_path / "back.ply")]) == 0
    back = load_ply(tmp_path / "back.ply")
    assert back["sh"].shape == (50, 16, 3)
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 4096 + 1e-6
    assert math.isclose(float(load_splat(tmp_path / "o.splat")["means"].abs().sum()),
                        float(g["means"].abs().sum()), rel_tol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "IN"], "give at least one output"),
        (["export", "IN", "--spz", "OUT.ply"], "must end in .spz"),
        (["export", "IN", "--ply", "nofolder/x.ply"], "does not exist"),
        (["export", "missing.ply", "--ply", "x.ply"], "no run folder, checkpoint or splat"),
        (["export", "BAD", "--ply", "x.ply"], "corrupt gzip stream"),
    ],
)
def test_export_errors_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    save_ply(tmp_path / "in.ply", **_gaussians(5, 0))
    (tmp_path / "bad.spz").write_bytes(b"\x1f\x8b" + bytes(10))
    args = [{"IN": "in.ply", "BAD": "bad.spz"}.get(a, a) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
