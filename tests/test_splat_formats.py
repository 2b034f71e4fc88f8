"""Compressed PLY, SOG and glTF (.glb) files: round trips within each format's quantisation
(the bound of every field stated where it is asserted), their layouts, the frames of
io/axes.py, and dispatch by name."""

from __future__ import annotations

import json
import math
import struct
import zipfile

import numpy as np
import pytest
import torch

from helpers import all_sh, splats_of
from tilesplat.backends.torch.sh import sh_basis
from tilesplat.constants import SH_C0
from tilesplat.io.axes import SPZ_SYSTEMS, change_frame, frame_matrix
from tilesplat.io.compressed_ply import read_compressed_ply, save_compressed_ply, sort_centers
from tilesplat.io.gaussians import BY_NAME, format_of, read_gaussians, save_gaussians
from tilesplat.io.glb import encode_glb, read_glb, save_glb
from tilesplat.io.ply import read_ply
from tilesplat.io.sog import palette_size, read_sog, save_sog


def _gaussians(n: int, degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    return splats_of(torch.randn(n, 3, generator=g) * 2, torch.randn(n, 4, generator=g),
                     torch.rand(n, 3, generator=g) * 3 - 6, torch.randn(n, generator=g) * 2,
                     torch.rand(n, k, 3, generator=g) * 0.6 - 0.3)


def _rotation_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a = torch.nn.functional.normalize(a.double(), dim=-1)
    b = torch.nn.functional.normalize(b.double(), dim=-1)
    return float((1 - (a * b).sum(-1).abs()).max())


def _alpha_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((torch.sigmoid(a.double()) - torch.sigmoid(b.double())).abs().max())


def _morton(g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``g`` in the order compressed PLY and SOG writers store it."""
    order = sort_centers(g["means"], torch.arange(len(g["means"])))
    return {k: v[order] for k, v in g.items()}


# --- compressed PLY ------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_compressed_ply_round_trip_within_quantisation(tmp_path, degree):
    g = _gaussians(1000, degree)
    back = read_compressed_ply(save_compressed_ply(tmp_path / "a.compressed.ply", g)).gaussians
    want = _morton(g)
    assert all_sh(back).shape == all_sh(want).shape
    ext = (want["means"].max(0).values - want["means"].min(0).values).double()
    # 11-10-11 bits of each chunk's box (a chunk's box is inside the scene's)
    bits = torch.tensor([2047.0, 1023.0, 2047.0], dtype=torch.float64)
    assert ((back["means"] - want["means"]).abs().double() <= 0.5 * ext / bits + 1e-5).all()
    s_ext = float(want["scales"].max() - want["scales"].min())
    assert (back["scales"] - want["scales"]).abs().max() <= 0.5 * s_ext / 1023 + 1e-5
    assert _rotation_error(back["quats"], want["quats"]) < 1e-5  # 10 bits of three components
    assert _alpha_error(back["opacities"], want["opacities"]) <= 0.5 / 255 + 1e-6
    c_ext = float(all_sh(want)[:, 0].max() - all_sh(want)[:, 0].min())  # colour range, 8 bits
    assert (all_sh(back)[:, 0] - all_sh(want)[:, 0]).abs().max() <= 0.5 * c_ext / 255 + 1e-5
    if degree:  # trunc((x / 8 + 0.5) * 256), read at the bucket's centre: 4 / 256
        assert (all_sh(back)[:, 1:] - all_sh(want)[:, 1:]).abs().max() <= 4 / 256 + 1e-6


def test_compressed_ply_is_read_as_ply_and_keeps_the_mip_comment(tmp_path):
    g = _gaussians(300, 1)
    path = save_compressed_ply(tmp_path / "a.compressed.ply", g, antialiased=True)
    assert b"comment SplatRenderMode: mip" in path.read_bytes()[:400]
    data = read_ply(path)  # the PLY reader finds packed_position
    assert data.antialiased and len(data.gaussians["means"]) == 300
    (tmp_path / "b.ply").write_bytes(path.read_bytes())
    assert read_gaussians(tmp_path / "b.ply").gaussians["shN"].shape == (300, 3, 3)
    with pytest.raises(ValueError, match="SH degree 0-3"):
        save_compressed_ply(tmp_path / "c.compressed.ply", _gaussians(5, 4))


def test_compressed_ply_reads_gsplats_writer_and_a_flat_chunk(tmp_path):
    from gsplat.exporter import export_splats

    g = _gaussians(600, 2)
    export_splats(means=g["means"], scales=g["scales"], quats=g["quats"],
                  opacities=g["opacities"], sh0=g["sh0"], shN=g["shN"],
                  format="ply_compressed", save_to=str(tmp_path / "gsplat.ply"))  # fmt: skip
    theirs = read_ply(tmp_path / "gsplat.ply").gaussians
    keep = torch.sigmoid(g["opacities"]) > 1 / 255
    assert len(theirs["means"]) == int(keep.sum())
    # a last chunk of one Gaussian has zero extent: it packs 0, not gsplat's 0/0
    g1 = _gaussians(257, 0)
    back = read_compressed_ply(save_compressed_ply(tmp_path / "x.compressed.ply", g1))
    assert torch.isfinite(back.gaussians["means"]).all()
    assert (back.gaussians["means"] - _morton(g1)["means"]).abs().max() < 0.05


# --- SOG -----------------------------------------------------------------------------------


def _clustered(n: int, degree: int, prototypes: int = 8, noise: float = 0.005):
    """SH bands from a few prototypes plus small noise (trained SH cluster; random SH does
    not, and the palette is what SOG stores)."""
    g = _gaussians(n, degree)
    gen = torch.Generator().manual_seed(5)
    k = (degree + 1) ** 2
    protos = torch.rand(prototypes, k - 1, 3, generator=gen) - 0.5
    pick = torch.randint(prototypes, (n,), generator=gen)
    g["shN"][:] = protos[pick] + (torch.rand(n, k - 1, 3, generator=gen) * 2 - 1) * noise
    return g


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_sog_round_trip_within_quantisation(tmp_path, degree):
    g = _clustered(900, degree)
    path = save_sog(tmp_path / "a.sog", g)
    back = read_sog(path).gaussians
    want = _morton(g)
    with zipfile.ZipFile(path) as z:
        meta = json.loads(z.read("meta.json"))
        assert sorted(z.namelist()) == sorted(["meta.json", "means_l.webp", "means_u.webp",
                                               "quats.webp", "scales.webp", "sh0.webp"]
                                              + (["shN_centroids.webp", "shN_labels.webp"]
                                                 if degree else []))  # fmt: skip
    assert meta["version"] == 2 and meta["count"] == 900
    # means: 16 bits of sign(x) ln(|x| + 1) over the scene's range, d x / d lt = |x| + 1
    span = torch.tensor(meta["means"]["maxs"]) - torch.tensor(meta["means"]["mins"])
    bound = 0.5 * span / 65535 * (want["means"].abs() + 1) * 1.001 + 1e-6
    assert ((back["means"] - want["means"]).abs() <= bound).all()
    # log-scales and dc: the codebook entry nearest each value (256-entry 1-D k-means)
    for key, book, got, ref in (("scales", meta["scales"]["codebook"], back["scales"],
                                 want["scales"]),
                                ("sh0", meta["sh0"]["codebook"], all_sh(back)[:, 0],
                                 all_sh(want)[:, 0])):  # fmt: skip
        book = torch.tensor(book, dtype=torch.float64)
        nearest = book[(ref.double()[..., None] - book).abs().argmin(-1)]
        assert torch.allclose(got.double(), nearest, atol=1e-6), key
        assert (got - ref).abs().max() <= 0.02, key  # the codebook's resolution here
    assert _rotation_error(back["quats"], want["quats"]) < 2e-4  # 8 bits of three components
    assert _alpha_error(back["opacities"], want["opacities"]) <= 0.5 / 255 + 1e-6
    if degree:  # the palette (k-means of 8 clusters) + its 256-entry codebook
        assert meta["shN"]["count"] == palette_size(900) and meta["shN"]["bands"] == degree
        assert (all_sh(back)[:, 1:] - all_sh(want)[:, 1:]).abs().max() <= 0.005 + 0.01


def test_kmeans_fitted_on_a_sample_labels_every_row_by_its_nearest_centroid(monkeypatch):
    from tilesplat.io import kmeans as km

    monkeypatch.setattr(km, "MIN_SAMPLE", 64)  # a sample of 16 x 8 rows from 6000
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(8, 45)).astype(np.float32) * 4
    truth = np.sort(rng.integers(0, 8, 6000))  # grouped: the even seeds hit every cluster
    rows = centres[truth] + rng.normal(size=(6000, 45)).astype(np.float32) * 0.05
    c, labels = km.kmeans(rows, 8, 10)
    assert c.shape == (8, 45) and labels.shape == (6000,)
    d = ((rows[:, None, :] - c[None]) ** 2).sum(-1)
    assert np.array_equal(labels, d.argmin(1))  # every row, not only the sample, assigned
    # the clusters found are the true ones (a label is one true cluster, and back)
    pairs = set(zip(truth.tolist(), labels.tolist(), strict=True))
    assert len(pairs) == 8 and len({t for t, _ in pairs}) == 8
    assert np.abs(c[labels] - centres[truth]).max() < 0.1


def test_sog_loose_folder_and_antialiased_model(tmp_path):
    g = _clustered(200, 1)
    (tmp_path / "scene").mkdir()
    save_sog(tmp_path / "scene" / "meta.json", g, antialiased=True)
    names = sorted(p.name for p in (tmp_path / "scene").iterdir())
    assert names == sorted(["meta.json", "means_l.webp", "means_u.webp", "quats.webp",
                            "scales.webp", "sh0.webp", "shN_centroids.webp",
                            "shN_labels.webp"])  # fmt: skip
    loose = read_gaussians(tmp_path / "scene" / "meta.json")
    bundled = read_gaussians(save_sog(tmp_path / "b.sog", g, antialiased=True))
    assert loose.antialiased and bundled.antialiased
    for k, t in loose.gaussians.items():
        assert torch.equal(t, bundled.gaussians[k]), k
    with pytest.raises(ValueError, match="SH degree 0-3"):
        save_sog(tmp_path / "c.sog", _gaussians(5, 4))


# --- glTF ----------------------------------------------------------------------------------


def _glb_json(raw: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<I", raw[12:16])[0]
    return json.loads(raw[20 : 20 + n]), raw[28 + n :]


@pytest.mark.parametrize("degree", [0, 2, 3])
def test_glb_round_trip_keeps_float32(tmp_path, degree):
    g = _gaussians(400, degree)
    back = read_glb(save_glb(tmp_path / "a.glb", g)).gaussians
    assert torch.equal(back["means"], g["means"])  # a half turn about z, there and back
    assert torch.equal(all_sh(back), all_sh(g))  # each SH coefficient changes sign or not
    assert _rotation_error(back["quats"], g["quats"]) < 1e-12  # stored normalised
    # float32 exp / log and sigmoid / logit
    assert (back["scales"] - g["scales"]).abs().max() <= 1e-6
    assert _alpha_error(back["opacities"], g["opacities"]) <= 1e-7


def test_glb_layout_is_the_extensions(tmp_path):
    g = _gaussians(3, 1)
    g["means"][0] = torch.tensor([1.0, 2.0, 3.0])
    g["quats"][0] = torch.tensor([2.0, 0.0, 0.0, 0.0])
    g["scales"][0] = torch.tensor([0.0, math.log(2.0), -1.0])
    g["opacities"][0] = 0.0
    doc, binary = _glb_json(encode_glb(g))
    assert doc["extensionsUsed"] == ["KHR_gaussian_splatting"]
    prim = doc["meshes"][0]["primitives"][0]
    assert prim["mode"] == 0
    assert prim["extensions"]["KHR_gaussian_splatting"]["kernel"] == "ellipse"
    assert prim["extensions"]["KHR_gaussian_splatting"]["colorSpace"] == "srgb_rec709_display"
    ext = "KHR_gaussian_splatting:"
    assert set(prim["attributes"]) == {"POSITION", "COLOR_0", ext + "ROTATION", ext + "SCALE",
                                       ext + "OPACITY", ext + "SH_DEGREE_0_COEF_0",
                                       *(f"{ext}SH_DEGREE_1_COEF_{m}" for m in range(3))}

    def values(name, width, dtype="<f4"):
        acc = doc["accessors"][prim["attributes"][name]]
        view = doc["bufferViews"][acc["bufferView"]]
        return np.frombuffer(binary, dtype, count=3 * width, offset=view["byteOffset"]).reshape(
            3, width)

    assert values("POSITION", 3)[0].tolist() == [-1.0, -2.0, 3.0]  # RDF -> LUF
    assert values(ext + "ROTATION", 4)[0].tolist() == [0.0, 0.0, 0.0, 1.0]  # x y z w, unit
    assert np.allclose(values(ext + "SCALE", 3)[0], [1.0, 2.0, math.exp(-1)])  # linear
    assert values(ext + "OPACITY", 1)[0, 0] == 0.5
    assert doc["accessors"][prim["attributes"]["POSITION"]]["min"] == values(
        "POSITION", 3).min(0).tolist()  # fmt: skip


def test_glb_reads_quantised_attributes_and_refuses_what_it_cannot(tmp_path):
    g = _gaussians(4, 0)
    raw = encode_glb(g)
    doc, binary = _glb_json(raw)
    prim = doc["meshes"][0]["primitives"][0]
    # OPACITY as normalised unsigned bytes (the spec allows it)
    op = np.round(torch.sigmoid(g["opacities"]).numpy() * 255).astype(np.uint8)
    doc["bufferViews"].append({"buffer": 0, "byteOffset": len(binary), "byteLength": 4})
    doc["accessors"].append({"bufferView": len(doc["bufferViews"]) - 1, "componentType": 5121,
                             "normalized": True, "count": 4, "type": "SCALAR"})  # fmt: skip
    prim["attributes"]["KHR_gaussian_splatting:OPACITY"] = len(doc["accessors"]) - 1
    binary = binary + op.tobytes()
    doc["buffers"][0]["byteLength"] = len(binary)

    def pack(d, b):
        js = json.dumps(d).encode()
        js += b" " * (-len(js) % 4)
        b = b + bytes(-len(b) % 4)
        return (struct.pack("<III", 0x46546C67, 2, 28 + len(js) + len(b))
                + struct.pack("<II", len(js), 0x4E4F534A) + js
                + struct.pack("<II", len(b), 0x004E4942) + b)  # fmt: skip

    (tmp_path / "q.glb").write_bytes(pack(doc, binary))
    back = read_glb(tmp_path / "q.glb").gaussians
    assert np.allclose(torch.sigmoid(back["opacities"]).numpy(), op / 255.0, atol=1e-6)
    for edit, message in (
        (lambda d: d.__setitem__("extensionsRequired", ["KHR_spz_gaussian_splats_compression"]),
         "requires glTF extensions"),
        (lambda d: d["nodes"][0].__setitem__("scale", [2, 2, 2]), "node 0 has a transform"),
        (lambda d: d["meshes"][0]["primitives"][0].pop("extensions"), "no primitive"),
    ):  # fmt: skip
        d = json.loads(json.dumps(doc))
        edit(d)
        (tmp_path / "bad.glb").write_bytes(pack(d, binary))
        with pytest.raises(ValueError, match=message):
            read_glb(tmp_path / "bad.glb")


# --- frames and dispatch -------------------------------------------------------------------


def _covariances(g: dict[str, np.ndarray]) -> np.ndarray:
    q = g["quats"].astype(np.float64)
    w, x, y, z = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    r = np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                  2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                  2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
                 1).reshape(-1, 3, 3)  # fmt: skip
    s2 = np.exp(2 * g["scales"].astype(np.float64))
    return r @ (s2[:, :, None] * np.transpose(r, (0, 2, 1)))


@pytest.mark.parametrize("frame", sorted(SPZ_SYSTEMS.values()))
def test_change_of_frame_moves_every_part_of_a_gaussian(frame):
    g = {k: v.numpy() for k, v in _gaussians(40, 4).items()}
    m = frame_matrix("RDF", frame)
    out = change_frame(g, "RDF", frame)
    assert np.allclose(out["means"], g["means"] @ m.T)
    assert np.allclose(_covariances(out), m @ _covariances(g) @ m.T, atol=1e-9)
    d = np.random.default_rng(0).normal(size=(30, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    def sh(a):
        return np.concatenate([a["sh0"], a["shN"]], axis=1)

    old = np.einsum("mk,nkc->nmc", sh_basis(4, torch.from_numpy(d)).numpy(), sh(g))
    new = np.einsum("mk,nkc->nmc", sh_basis(4, torch.from_numpy(d @ m.T)).numpy(), sh(out))
    assert np.allclose(old, new, atol=1e-5)  # the same colour seen from the same direction
    back = change_frame(out, frame, "RDF")
    assert np.allclose(sh(back), sh(g), atol=1e-6)
    assert np.allclose(_covariances(back), _covariances(g), atol=1e-9)


def test_every_format_has_a_name_and_dispatch_prefers_the_longest_ending(tmp_path):
    assert format_of("x.COMPRESSED.PLY").name == "compressed-ply"
    assert format_of("x.ply").name == "ply" and format_of("dir/meta.json").name == "sog-folder"
    assert set(BY_NAME) == {"ply", "compressed-ply", "splat", "spz", "sog", "sog-folder", "glb"}
    with pytest.raises(ValueError, match="unknown splat file type '.obj'"):
        format_of("m.obj")
    g = _gaussians(30, 1)
    for suffix in (".ply", ".compressed.ply", ".splat", ".spz", ".sog", ".glb"):
        back = read_gaussians(save_gaussians(tmp_path / f"m{suffix}", g)).gaussians
        assert back["means"].shape == (30, 3), suffix
        assert abs(float(all_sh(back)[:, 0].mean() - all_sh(g)[:, 0].mean())) < 0.01 / SH_C0


def test_kmeans_two_level_entries_are_the_means_of_their_rows_and_near_one_level(monkeypatch):
    """The two-level palette (coarse cells, a k-means in each, then a pass over every row
    against its cell's and the nearest cells' entries): each entry is the mean of the rows
    labelled with it, and the error is within 10 % of one level's Lloyd."""
    from tilesplat.io import kmeans as km

    rng = np.random.default_rng(5)
    centres = rng.normal(size=(300, 45)).astype(np.float32)
    rows = centres[rng.integers(0, 300, 6000)] + rng.normal(size=(6000, 45)).astype(
        np.float32
    ) * 0.3
    monkeypatch.setattr(km, "FLAT_MAX", 1024)
    monkeypatch.setattr(km, "FLAT_WORK", 0)
    c1, l1 = km.kmeans(rows, 256, 10)
    monkeypatch.setattr(km, "FLAT_MAX", 64)  # 256 entries: 16 coarse cells
    c2, l2 = km.kmeans(rows, 256, 10)
    assert c2.shape == (256, 45) and l2.shape == (6000,) and l2.max() < 256
    for j in np.unique(l2):
        assert np.allclose(c2[j], rows[l2 == j].mean(0), atol=1e-5), j
    err1, err2 = (float(((rows - c[lab]) ** 2).sum(1).mean()) for c, lab in ((c1, l1), (c2, l2)))
    assert err2 <= 1.1 * err1, (err1, err2)


@pytest.mark.parametrize("flat_max", [1024, 64])  # one level; two levels
def test_kmeans_entries_are_the_weighted_means_of_their_rows(monkeypatch, flat_max):
    from tilesplat.io import kmeans as km

    rng = np.random.default_rng(6)
    rows = rng.normal(size=(3000, 45)).astype(np.float32)
    weights = rng.random(3000) + 0.05
    monkeypatch.setattr(km, "FLAT_MAX", flat_max)
    monkeypatch.setattr(km, "FLAT_WORK", 0)
    c, labels = km.kmeans(rows, 256, 10, weights)
    for j in np.unique(labels):
        m = labels == j
        want = (rows[m] * weights[m, None]).sum(0) / weights[m].sum()
        assert np.allclose(c[j], want, atol=1e-5), j
