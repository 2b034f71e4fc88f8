"""`.splat` (antimatter15) and `.spz` (Niantic, versions 1-4) files: round trips within each
format's quantisation, the byte layout, untrusted input, and `tilesplat export` as converter."""

from __future__ import annotations

import gzip
import math
import struct

import numpy as np
import pytest
import torch

from helpers import all_sh, splats_of
from tilesplat.cli import main
from tilesplat.constants import SH_C0
from tilesplat.io.gaussians import load_gaussians, save_gaussians
from tilesplat.io.ply import load_ply, save_ply
from tilesplat.io.splat import load_splat, save_splat, splat_order
from tilesplat.io.spz import (
    EXT_COORDINATE_SYSTEM,
    HEADER,
    HEADER_V4,
    MAGIC,
    encode_spz,
    load_spz,
    pack_quats_v3,
    read_spz,
    save_spz,
    unpack_quats_v3,
)


def _gaussians(n: int, degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Values inside every format's range (SH in [-0.9, 0.9], colours in [0, 1])."""
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    sh = torch.rand(n, k, 3, generator=g) * 1.8 - 0.9
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) / SH_C0 * 0.95
    return splats_of(torch.randn(n, 3, generator=g) * 3, torch.randn(n, 4, generator=g),
                     torch.rand(n, 3, generator=g) * 6 - 8, torch.randn(n, generator=g) * 2, sh)


def _rotation_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest 1 - |<a, b>| of unit quaternions (q and -q are one rotation)."""
    a = torch.nn.functional.normalize(a.double(), dim=-1)
    b = torch.nn.functional.normalize(b.double(), dim=-1)
    return float((1 - (a * b).sum(-1).abs()).max())


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x.double())


# --- .spz --------------------------------------------------------------------------------


def _spz_bounds(back, g, degree, version=4):
    """The quantisation of each field (Niantic's layout): asserted per field."""
    assert all_sh(back).shape == all_sh(g).shape
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 4096 + 1e-6  # 12 fractional bits
    assert (back["scales"] - g["scales"]).abs().max() <= 0.5 / 16 + 1e-6
    rot = 2e-5 if version >= 3 else 1e-2  # 9 bits of |q| / sqrt(1/2); v2: 8 bits of x, y, z
    assert _rotation_error(back["quats"], g["quats"]) < rot
    alpha = (_sigmoid(back["opacities"]) - _sigmoid(g["opacities"])).abs()
    assert alpha.max() <= 0.5 / 255 + 1e-6
    assert (all_sh(back)[:, 0] - all_sh(g)[:, 0]).abs().max() <= 0.5 / (0.15 * 255) + 1e-5
    if degree >= 1:  # 5 bits for degree 1, 4 for the rest, after rounding to 1/128
        err1 = (all_sh(back)[:, 1:4] - all_sh(g)[:, 1:4]).abs().max()
        assert err1 <= (4 + 0.5) / 128 + 1e-6
    if degree >= 2:
        assert (all_sh(back)[:, 4:] - all_sh(g)[:, 4:]).abs().max() <= (8 + 0.5) / 128 + 1e-6


@pytest.mark.parametrize("degree", [0, 1, 3, 4])
@pytest.mark.parametrize("version", [4, 3, 2])
def test_spz_round_trip_within_quantisation(tmp_path, degree, version):
    g = _gaussians(500, degree)
    back = load_spz(save_spz(tmp_path / "a.spz", g, version=version))
    _spz_bounds(back, g, degree, version)


def _v4_parts(raw: bytes):
    import zstandard

    fields = HEADER_V4.unpack(raw[:32])
    n_streams, toc = fields[6], fields[7]
    entries = [struct.unpack("<QQ", raw[toc + 16 * i : toc + 16 * (i + 1)])
               for i in range(n_streams)]  # fmt: skip
    at, out = toc + 16 * n_streams, []
    for comp, size in entries:
        out.append(zstandard.ZstdDecompressor().decompress(raw[at : at + comp]))
        assert len(out[-1]) == size
        at += comp
    assert at == len(raw)
    return fields, out


def test_spz_v4_layout_is_the_specs_and_keeps_the_ply_axes(tmp_path):
    g = _gaussians(3, 1)
    g["means"][0] = torch.tensor([1.0, 2.0, -0.5])
    g["scales"][0] = torch.tensor([-10.0, 0.0, 5.9])
    g["opacities"][0] = 0.0
    g["quats"][0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    raw = save_spz(tmp_path / "a.spz", g, antialiased=True).read_bytes()
    assert raw[:4] == b"NGSP"
    fields, (pos, alphas, _, scales, rot, sh) = _v4_parts(raw)
    assert fields[:8] == (MAGIC, 4, 3, 1, 12, 1, 6, 32) and fields[8] == bytes(12)
    assert [len(pos), len(alphas), len(scales), len(rot), len(sh)] == [27, 3, 9, 12, 27]
    p = np.frombuffer(pos, np.uint8).reshape(3, 3, 3).astype(np.int32)
    fixed = p[..., 0] | p[..., 1] << 8 | p[..., 2] << 16
    fixed = np.where(fixed >= 1 << 23, fixed - (1 << 24), fixed)
    assert fixed[0].tolist() == [4096, 8192, -2048]  # the PLY's axes, unflipped
    assert alphas[0] == 128 and list(scales[:3]) == [0, 160, 254]
    word = struct.unpack("<I", rot[:4])[0]
    assert word >> 30 == 3 and word & ((1 << 30) - 1) == 0  # identity: w largest, rest 0
    assert read_spz(tmp_path / "a.spz").antialiased
    # degree 0: the empty SH stream is left out (5 streams)
    g0 = _gaussians(4, 0)
    assert HEADER_V4.unpack(encode_spz(g0)[:32])[6] == 5
    assert load_spz(save_spz(tmp_path / "d0.spz", g0))["shN"].shape == (4, 0, 3)


def test_spz_v3_layout(tmp_path):
    g = _gaussians(3, 1)
    g["means"][0] = torch.tensor([1.0, 2.0, -0.5])
    raw = gzip.decompress(save_spz(tmp_path / "a.spz", g, version=3).read_bytes())
    assert HEADER.unpack(raw[:16]) == (MAGIC, 3, 3, 1, 12, 0, 0)
    assert len(raw) == 16 + 3 * (9 + 1 + 3 + 3 + 4 + 9)
    assert raw[16:19] == bytes([0, 16, 0])  # x = 4096 little endian, unflipped


def test_spz_version_1_float16_positions(tmp_path):
    n = 2
    pos = np.array([[1.5, -2.0, 0.25], [3.0, 0.0, -1.0]], "<f2").tobytes()
    body = (pos + bytes([255, 0]) + bytes([128] * 6) + bytes([160] * 6)
            + bytes([128, 128, 128] * 2))  # fmt: skip
    (tmp_path / "v1.spz").write_bytes(gzip.compress(HEADER.pack(MAGIC, 1, n, 0, 0, 0, 0) + body,
                                                    mtime=0))  # fmt: skip
    back = load_spz(tmp_path / "v1.spz")
    assert back["means"].tolist() == [[1.5, -2.0, 0.25], [3.0, 0.0, -1.0]]
    assert back["scales"].tolist() == [[0.0] * 3] * 2
    assert torch.allclose(back["quats"][0], torch.tensor([1.0, 0, 0, 0]), atol=0.01)


def test_spz_smallest_three_against_exact_quaternions():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2000, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[:4] = np.eye(4)  # each axis the largest once
    back = unpack_quats_v3(pack_quats_v3(q))
    assert np.abs(np.linalg.norm(back, axis=1) - 1).max() < 1e-6
    assert (1 - np.abs((back * q).sum(1))).max() < 2e-5


def test_spz_large_coordinates_use_fewer_fractional_bits(tmp_path):
    g = _gaussians(10, 0)
    g["means"][0, 0] = 5000.0
    bits = HEADER_V4.unpack(encode_spz(g)[:32])[4]
    assert bits == 10  # 5000 * 2^10 < 2^23 <= 5000 * 2^11
    back = load_spz(save_spz(tmp_path / "a.spz", g))
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 1024 + 1e-4
    g["means"][0, 0] = 1e7
    with pytest.raises(ValueError, match="24-bit range"):
        encode_spz(g)


def _with_records(raw: bytes, records: bytes) -> bytes:
    """A v4 file with extension records inserted before its TOC (flag 0x2 set)."""
    f = list(HEADER_V4.unpack(raw[:32]))
    f[5] |= 0x2
    f[7] = 32 + len(records)
    return HEADER_V4.pack(*f) + records + raw[32:]


def test_spz_extension_records_are_honoured_or_skipped(tmp_path):
    g = _gaussians(20, 2)
    raw = encode_spz(g)
    plain = load_spz(save_spz(tmp_path / "plain.spz", g))
    rub = struct.pack("<III", EXT_COORDINATE_SYSTEM, 4, 4)  # the data is stored right-up-back
    unknown = struct.pack("<II", 0x12340001, 5) + b"hello"
    orbit = struct.pack("<II3f", 0xADBE0002, 12, 0.0, 1.0, 2.0)
    (tmp_path / "ext.spz").write_bytes(_with_records(raw, unknown + orbit + rub))
    data = read_spz(tmp_path / "ext.spz")
    assert any("0x12340001" in n for n in data.notes) and any("orbit" in n for n in data.notes)
    back = data.gaussians
    # RUB -> RDF: y and z flip; degree-1 SH (y, z, x) flip as y, z; the rotation's y, z flip
    assert torch.equal(back["means"], plain["means"] * torch.tensor([1.0, -1.0, -1.0]))
    flip1 = torch.tensor([-1.0, -1, 1])[:, None]
    assert torch.allclose(all_sh(back)[:, 1:4], all_sh(plain)[:, 1:4] * flip1)
    assert torch.allclose(back["quats"], plain["quats"] * torch.tensor([1.0, 1, -1, -1]))
    # the same records at the end of a v3 gzip stream
    v3 = gzip.decompress(encode_spz(g, version=3))
    v3 = v3[:14] + bytes([v3[14] | 2]) + v3[15:] + rub
    (tmp_path / "v3ext.spz").write_bytes(gzip.compress(v3, mtime=0))
    assert torch.equal(load_spz(tmp_path / "v3ext.spz")["means"], back["means"])
    for bad, message in (
        (struct.pack("<II", 0x12340001, 50) + b"short", "extension record 0x12340001"),
        (struct.pack("<III", EXT_COORDINATE_SYSTEM, 4, 99), "unknown SPZ coordinate system"),
        (b"abc", "extension record header"),
    ):
        (tmp_path / "bad.spz").write_bytes(_with_records(raw, bad))
        with pytest.raises(ValueError, match=message):
            load_spz(tmp_path / "bad.spz")


def test_spz_sh_flip_matches_niantics_parity_table():
    """The fitted SH change of frame (io/axes.py) RDF -> RUB is Niantic's sign table
    (splat-types.h: y, z, x, xy, yz, 1, xz, 1, y, xyz, y, z, x, z, x, ... with x = 1,
    y = z = -1), but for the last degree-4 function: x c3 - y s3 = x^4 - 6 x^2 y^2 + y^4 is
    even in y, where the table says y (it matters only for degree-4 files between frames)."""
    from tilesplat.io.axes import _sh_matrix, frame_matrix

    x, y, z = 1, -1, -1
    table = [y, z, x, x * y, y * z, 1, x * z, 1, y, x * y * z, y, z, x, z, x,
             x * y, y * z, x * y, y * z, 1, x * z, 1, x * z, 1]  # fmt: skip
    a = _sh_matrix(tuple(frame_matrix("RDF", "RUB").ravel().tolist()), 4)
    assert np.allclose(a, np.diag([1, *table]), atol=1e-9)


def _spz_bytes(header: tuple, body: bytes = b"") -> bytes:
    # mtime=0: the same bytes in every process (pytest-xdist workers must collect the same ids)
    return gzip.compress(HEADER.pack(*header) + body, mtime=0)


def _v4(n=1, degree=0, streams=5, toc=32, tail=b"") -> bytes:
    return HEADER_V4.pack(MAGIC, 4, n, degree, 12, 0, streams, toc, bytes(12)) + tail


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "neither an NGSP header nor gzip"),
        (b"NGSX not compressed", "neither"),
        (b"\x1f\x8b\x08\x00garbage-garbage", "corrupt gzip"),
        (gzip.compress(b"short", mtime=0), "no complete 16-byte header"),
        (_spz_bytes((0x12345678, 3, 1, 0, 12, 0, 0)), "magic"),
        (_spz_bytes((MAGIC, 7, 1, 0, 12, 0, 0)), "version 7 is not supported"),
        (_spz_bytes((MAGIC, 4, 1, 0, 12, 0, 0)), "version 4 inside gzip"),
        (_spz_bytes((MAGIC, 3, 1, 5, 12, 0, 0)), "SH degree 5"),
        (_spz_bytes((MAGIC, 3, 1, 0, 30, 0, 0)), "fractional bits"),
        (_spz_bytes((MAGIC, 3, 0, 0, 12, 0, 0)), "no Gaussians"),
        (_spz_bytes((MAGIC, 3, 4_000_000_000, 0, 12, 0, 0)), "decompression bomb"),
        (_spz_bytes((MAGIC, 3, 2, 0, 12, 0, 0), bytes(20)), "truncated .spz"),
        (b"NGSP", "truncated"),
        (_v4(n=4_000_000_000), "header of 4000000000 Gaussians .* decompression bomb"),
        (_v4(streams=6), "6 streams in the header"),
        (_v4(toc=10), "TOC offset 10"),
        (_v4(tail=bytes(80) + b"x"), "TOC lists 0 compressed bytes, the file holds 1"),
        (_v4(tail=struct.pack("<QQ", 3, 9) + bytes(64) + b"abc"), "corrupt zstd stream"),
        (_v4(tail=struct.pack("<QQ", 3, 10) + bytes(64) + b"abc"), "stream positions holds 10"),
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


def test_spz_v4_of_constant_fields_reads_back_and_a_bomb_is_refused(tmp_path):
    # An initialised model: one opacity, one scale, no rotation, zero SH rest. zstd shrinks
    # each of those streams far past 1024x; the whole file does not, so it reads back.
    n = 60_000
    g = {"means": torch.randn(n, 3, generator=torch.Generator().manual_seed(5)),
         "quats": torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1),
         "scales": torch.full((n, 3), -4.0), "opacities": torch.full((n,), -2.2),
         "sh0": torch.zeros(n, 1, 3), "shN": torch.zeros(n, 15, 3)}  # fmt: skip
    path = save_spz(tmp_path / "init.spz", g)
    assert load_spz(path)["means"].shape == (n, 3)
    # the same streams under a header claiming 2000x the Gaussians: refused before inflating
    raw = bytearray(path.read_bytes())
    raw[8:12] = struct.pack("<I", n * 2000)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="decompression bomb"):
        load_spz(path)


# --- .splat ------------------------------------------------------------------------------


def test_splat_round_trip_within_quantisation(tmp_path):
    g = _gaussians(400, 2)
    path = save_splat(tmp_path / "a.splat", g)
    assert path.stat().st_size == 400 * 32
    back = load_splat(path)
    order = torch.from_numpy(splat_order(g["scales"].numpy(), g["opacities"].numpy()))
    want = {k: v[order] for k, v in g.items()}
    assert torch.equal(back["means"], want["means"])  # float32 kept exactly
    assert (back["scales"] - want["scales"]).abs().max() < 1e-5
    assert all_sh(back).shape == (400, 1, 3)
    assert (all_sh(back)[:, 0] - all_sh(want)[:, 0]).abs().max() <= 0.5 / 255 / SH_C0 + 1e-5
    alpha = (_sigmoid(back["opacities"]) - _sigmoid(want["opacities"])).abs()
    assert alpha.max() <= 0.5 / 255 + 1e-6
    assert _rotation_error(back["quats"], want["quats"]) < 2e-3  # 8 bits per component
    # largest first: volume x opacity never increases along the file
    key = want["scales"].double().sum(1) + torch.log(_sigmoid(want["opacities"]))
    assert bool((key[1:] <= key[:-1]).all())


def test_splat_layout(tmp_path):
    g = _gaussians(1, 0)
    g["means"][0] = torch.tensor([1.0, -2.0, 3.0])
    g["scales"][0] = torch.log(torch.tensor([0.5, 1.0, 2.0]))
    g["quats"][0] = torch.tensor([2.0, 0.0, 0.0, 0.0])
    g["opacities"][0] = 100.0
    g["sh0"][0, 0] = torch.tensor([0.5, -0.5, 0.0]) / SH_C0
    raw = save_splat(tmp_path / "a.splat", g).read_bytes()
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
    for suffix in (".ply", ".splat", ".spz"):  # every format: tests/test_splat_formats.py
        back = load_gaussians(save_gaussians(tmp_path / f"m{suffix}", g))
        assert back["means"].shape == (20, 3)
    with pytest.raises(ValueError, match="unknown splat file type '.obj'"):
        load_gaussians(tmp_path / "m.obj")
    with pytest.raises(FileNotFoundError):
        load_gaussians(tmp_path / "missing.spz")


def test_export_converts_between_formats(tmp_path, capsys):
    g = _gaussians(50, 3)
    ply = save_ply(tmp_path / "in.ply", g)
    assert main(["export", str(ply), "--spz", str(tmp_path / "o.spz"),
                 "--splat", str(tmp_path / "o.splat")]) == 0  # fmt: skip
    assert "50 Gaussians" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "o.spz"), "--ply", str(tmp_path / "back.ply")]) == 0
    back = load_ply(tmp_path / "back.ply")
    assert all_sh(back).shape == (50, 16, 3)
    assert (back["means"] - g["means"]).abs().max() <= 0.5 / 4096 + 1e-6
    assert math.isclose(float(load_splat(tmp_path / "o.splat")["means"].abs().sum()),
                        float(g["means"].abs().sum()), rel_tol=1e-6)  # fmt: skip
