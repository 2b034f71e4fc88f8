"""Every splat-file reader against damaged files: truncations at every header boundary and
through the data, flipped bytes, counts claiming more than the file holds, huge dimensions,
NaN. A few thousand cases, each bounded in time and memory; every case either ends in a
``ValueError`` naming the file, or decodes to finite Gaussians of consistent shapes (a flipped
byte inside a position is still a valid file). Never another exception, a hang or an
allocation out of proportion to the file.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import struct
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch

from helpers import splats_of
from tilesplat.io.gaussians import FORMATS, format_of, save_gaussians

CASE_SECONDS = 2.0  # one damaged file of ~2 KB: decode or refuse within this
CASE_BYTES = 64 << 20  # traced allocations of one case (the valid decode takes < 1 MB)
FLIPS = 300


def _gaussians(n: int = 12, degree: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    k = (degree + 1) ** 2
    return splats_of(torch.randn(n, 3, generator=g), torch.randn(n, 4, generator=g),
                     torch.rand(n, 3, generator=g) * 3 - 5, torch.randn(n, generator=g),
                     torch.rand(n, k, 3, generator=g) - 0.5)


def _boundaries(raw: bytes) -> list[int]:
    """Offsets of header structure: every byte of the first 96, every line end of a text
    header, and 48 cuts through the rest."""
    cuts = set(range(min(len(raw), 96)))
    head = raw[:4096]
    cuts |= {i + 1 for i, b in enumerate(head) if b == 10}
    cuts |= set(np.linspace(0, len(raw) - 1, 48).astype(int).tolist())
    return sorted(cuts)


def _flips(raw: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(FLIPS):
        b = bytearray(raw)
        for _ in range(rng.choice((1, 1, 2, 4))):
            i = rng.randrange(len(b)) if rng.random() < 0.6 else rng.randrange(min(len(b), 64))
            b[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
        out.append(bytes(b))
    return out


# --- format-specific damage: counts, dimensions, NaN -------------------------------------


def _ply_special(raw: bytes) -> list[bytes]:
    end = raw.index(b"end_header\n") + 11
    head, body = raw[:end], raw[end:]
    out = [head.replace(b"vertex 12", f"vertex {c}".encode()) + body
           for c in (13, 10**7, 2**31, 2**40 - 1, 10**30)]  # fmt: skip
    nan = bytearray(body)
    nan[4:8] = struct.pack("<f", float("nan"))
    out += [head + bytes(nan), head.replace(b"float x", b"double x") + body,
            head.replace(b"format binary_little_endian", b"format ascii") + body,
            head.replace(b"property float f_rest_0", b"property list uchar float f_rest_0") + body]
    return out


def _compressed_special(raw: bytes) -> list[bytes]:
    end = raw.index(b"end_header\n") + 11
    head, body = raw[:end], raw[end:]
    out = [head.replace(b"vertex 12", f"vertex {c}".encode()) + body for c in (13, 10**9)]
    out += [head.replace(b"chunk 1", b"chunk 9999999") + body,
            head.replace(b"sh 12", b"sh 100000000") + body]
    nan = bytearray(body)
    nan[0:4] = struct.pack("<f", float("nan"))
    out.append(head + bytes(nan))
    inf = bytearray(body)
    inf[28:32] = struct.pack("<f", float("inf"))  # max_scale_y
    out.append(head + bytes(inf))
    return out


def _splat_special(raw: bytes) -> list[bytes]:
    nan = bytearray(raw)
    nan[12:16] = struct.pack("<f", float("nan"))
    neg = bytearray(raw)
    neg[16:20] = struct.pack("<f", -1.0)
    return [bytes(nan), bytes(neg), raw + b"x", raw[:32] * 0]


def _spz_special(raw: bytes) -> list[bytes]:
    out = []
    for n in (13, 10**6, 2**31, 2**32 - 1):
        out.append(raw[:8] + struct.pack("<I", n) + raw[12:])
    for degree in (4, 5, 255):
        out.append(raw[:12] + bytes([degree]) + raw[13:])
    out.append(raw[:15] + bytes([9]) + raw[16:])  # stream count
    out.append(raw[:16] + struct.pack("<I", 2**31) + raw[20:])  # TOC offset
    toc = bytearray(raw)
    toc[32:40] = struct.pack("<Q", 2**62)  # compressed size of the first stream
    out.append(bytes(toc))
    toc[40:48] = struct.pack("<Q", 2**62)  # and its decompressed size
    out.append(bytes(toc))
    legacy = gzip.compress(struct.pack("<IIIBBBB", 0x5053474E, 3, 10**9, 0, 12, 0, 0), mtime=0)
    out += [legacy, gzip.compress(bytes(1 << 20), mtime=0)]
    return out


def _sog_members(raw: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _sog_pack(members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _sog_special(raw: bytes) -> list[bytes]:
    members = _sog_members(raw)
    meta = json.loads(members["meta.json"])
    out = []

    def edit(fn):
        m = json.loads(json.dumps(meta))
        fn(m)
        out.append(_sog_pack({**members, "meta.json": json.dumps(m).encode()}))

    for count in (17, 10**6, 10**12, -1, 0, "12", 1.5):  # 16 texels hold 12 Gaussians
        edit(lambda m, c=count: m.__setitem__("count", c))
    edit(lambda m: m["scales"]["codebook"].__setitem__(0, float("nan")))
    edit(lambda m: m["means"].__setitem__("mins", [float("inf"), 0, 0]))
    edit(lambda m: m["sh0"].__setitem__("codebook", [0.0]))
    edit(lambda m: m["shN"].__setitem__("count", 70000))
    edit(lambda m: m["shN"].__setitem__("bands", 3))
    edit(lambda m: m["quats"].__setitem__("files", ["../../etc/passwd"]))
    edit(lambda m: m["quats"].__setitem__("files", ["missing.webp"]))
    edit(lambda m: m.pop("version"))
    edit(lambda m: m.__setitem__("version", 3))
    edit(lambda m: m.pop("means"))
    # a huge image: the lossless header of quats.webp patched to 16384 x 16384 texels
    big = bytearray(members["quats.webp"])
    assert big[12:16] == b"VP8L" and big[20] == 0x2F
    bits = int.from_bytes(big[21:25], "little")
    bits = (bits & ~((1 << 28) - 1)) | 16383 | (16383 << 14)
    big[21:25] = bits.to_bytes(4, "little")
    out.append(_sog_pack({**members, "quats.webp": bytes(big)}))
    out.append(_sog_pack({**members, "scales.webp": b"RIFF" + bytes(40)}))
    # a zip bomb: meta.json of 20 MB of spaces deflates to ~20 KB
    out.append(_sog_pack({**members, "meta.json": members["meta.json"] + b" " * (20 << 20)},
                         zipfile.ZIP_DEFLATED))
    out.append(b"PK\x03\x04" + bytes(30))
    return out


def _glb_parts(raw: bytes) -> tuple[dict, bytes]:
    jlen = struct.unpack("<I", raw[12:16])[0]
    return json.loads(raw[20 : 20 + jlen]), raw[20 + jlen + 8 :]


def _glb_pack(doc: dict, binary: bytes) -> bytes:
    js = json.dumps(doc).encode()
    js += b" " * (-len(js) % 4)
    total = 12 + 8 + len(js) + 8 + len(binary)
    return (struct.pack("<III", 0x46546C67, 2, total) + struct.pack("<II", len(js), 0x4E4F534A)
            + js + struct.pack("<II", len(binary), 0x004E4942) + binary)  # fmt: skip


def _glb_special(raw: bytes) -> list[bytes]:
    doc, binary = _glb_parts(raw)
    out = []

    def edit(fn, data=binary):
        d = json.loads(json.dumps(doc))
        fn(d)
        out.append(_glb_pack(d, data))

    for count in (13, 2**31, 10**15, 0, -5, "12"):
        edit(lambda d, c=count: d["accessors"][0].__setitem__("count", c))
    edit(lambda d: d["bufferViews"][0].__setitem__("byteLength", 2**40))
    edit(lambda d: d["bufferViews"][0].__setitem__("byteOffset", 2**40))
    edit(lambda d: d["bufferViews"][0].__setitem__("byteStride", 1))
    edit(lambda d: d["accessors"][2].__setitem__("componentType", 9999))
    edit(lambda d: d["accessors"][2].__setitem__("type", "MAT4"))
    edit(lambda d: d["accessors"][0].__setitem__("sparse", {}))
    edit(lambda d: d["nodes"][0].__setitem__("translation", [1, 0, 0]))
    edit(lambda d: d.__setitem__("extensionsRequired", ["EXT_meshopt_compression"]))
    edit(lambda d: d["meshes"][0]["primitives"][0]["attributes"].__setitem__(
        "KHR_gaussian_splatting:SCALE", 99))  # fmt: skip
    edit(lambda d: d["buffers"][0].__setitem__("uri", "x.bin"))
    nan = bytearray(binary)
    nan[0:4] = struct.pack("<f", float("nan"))
    out.append(_glb_pack(doc, bytes(nan)))
    out.append(raw[:8] + struct.pack("<I", 2**31) + raw[12:])
    out.append(raw[:12] + struct.pack("<I", 2**31) + raw[16:])
    return out


SPECIAL = {".ply": _ply_special, ".compressed.ply": _compressed_special, ".splat": _splat_special,
           ".spz": _spz_special, ".sog": _sog_special, ".glb": _glb_special}  # fmt: skip


def _check_case(path, data: bytes) -> str:
    """'refused' or 'decoded'; fails on anything else, or past the time or memory bound."""
    path.write_bytes(data)
    read = format_of(path).read
    tracemalloc.start()
    start = time.perf_counter()
    try:
        out = read(path)
    except ValueError as exc:
        assert str(path) in str(exc), f"error does not name the file: {exc}"
        result = "refused"
    else:
        g = out.gaussians
        n = len(g["means"])
        assert n >= 1 and all(len(v) == n for v in g.values())
        assert all(bool(torch.isfinite(v).all()) for v in g.values())
        result = "decoded"
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert seconds < CASE_SECONDS, f"took {seconds:.2f} s"
    assert peak < CASE_BYTES, f"allocated {peak / 1e6:.1f} MB"
    return result


@pytest.mark.parametrize("suffix", list(SPECIAL))
def test_damaged_files_end_in_value_error_within_bounds(tmp_path, suffix):
    good = save_gaussians(tmp_path / f"good{suffix}", _gaussians())
    raw = good.read_bytes()
    assert _check_case(tmp_path / f"same{suffix}", raw) == "decoded"
    cases = [raw[:cut] for cut in _boundaries(raw)] + _flips(raw, len(suffix))
    specials = SPECIAL[suffix](raw)
    results = {"refused": 0, "decoded": 0}
    for i, data in enumerate(cases + specials):
        try:
            results[_check_case(tmp_path / f"case{suffix}", data)] += 1
        except AssertionError as exc:
            raise AssertionError(f"case {i} of {suffix}: {exc}") from None
    for i, data in enumerate(specials):  # counts, sizes, NaN: each must be refused
        assert _check_case(tmp_path / f"s{suffix}", data) == "refused", f"special case {i}"
    assert results["refused"] >= len(_boundaries(raw)) - 1  # every truncation but the whole


def test_loose_sog_folder_is_checked_the_same(tmp_path):
    save_gaussians(tmp_path / "meta.json", _gaussians())
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["count"] = 10**9
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="meta.json"):
        format_of(tmp_path / "meta.json").read(tmp_path / "meta.json")
    meta["count"] = 12
    meta["scales"]["files"] = ["../outside.webp"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="plain file name"):
        format_of(tmp_path / "meta.json").read(tmp_path / "meta.json")


def test_every_format_is_fuzzed():
    assert set(SPECIAL) | {"meta.json"} == set(FORMATS)
