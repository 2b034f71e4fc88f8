"""Interoperability with PlayCanvas's splat-transform 3.7.0 (the converter behind SuperSplat)
and Niantic's SPZ library (its WebAssembly build, which splat-transform ships).

- splat-transform's outputs of a tilesplat PLY, in every splat format it writes (.ply,
  .compressed.ply, .splat, .spz, .sog, meta.json, .glb), load in tilesplat
  to the same Gaussians within each format's quantisation (the bound of every field where it
  is asserted; the formats that reorder are matched by nearest centre);
- tilesplat's outputs load in splat-transform: its ``--stats json`` per-column statistics
  equal tilesplat's of the same file;
- splat-transform reads no .glb: tilesplat's is checked against the .glb splat-transform
  writes of the same PLY (the same document and values);
- the SPZ frame: splat-transform and Niantic's library (default options) read tilesplat's
  SPZ with the PLY's axes, as they write them (docs/formats.md).

splat-transform is installed by ``make test`` (tests/splat_transform.py says where and when
these tests skip or fail).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import splats_of
from splat_transform import SPZ_WASM, convert, require_splat_transform, run, stats
from tilesplat.constants import SH_C0
from tilesplat.io.gaussians import read_gaussians, save_gaussians

N = 1500  # splat-transform's SOG palette for 1500 Gaussians: 1024 entries (~2 s of k-means)


@pytest.fixture(scope="module")
def model():
    """Gaussians inside every format's range: opacities away from 0 and 1 (their 8-bit codes
    are never 0 or 255, where the two readers clamp differently), SH bands from 8 prototypes
    plus noise (SOG stores a palette of them)."""
    g = torch.Generator().manual_seed(11)
    sh = torch.empty(N, 16, 3)
    sh[:, 0] = torch.rand(N, 3, generator=g) * 2 - 1
    protos = torch.rand(8, 15, 3, generator=g) - 0.5
    sh[:, 1:] = protos[torch.randint(8, (N,), generator=g)] + (
        torch.rand(N, 15, 3, generator=g) * 0.01 - 0.005)  # fmt: skip
    return splats_of(torch.randn(N, 3, generator=g) * 2, torch.randn(N, 4, generator=g),
                     torch.rand(N, 3, generator=g) * 3 - 6, torch.rand(N, generator=g) * 6 - 3,
                     sh)


def _match(ref: dict, got: dict) -> dict:
    """``ref`` reordered to ``got``'s order by nearest centre (formats that sort)."""
    idx = torch.cdist(got["means"].double(), ref["means"].double()).argmin(1)
    assert len(set(idx.tolist())) == len(idx), "centres did not match one to one"
    return {k: v[idx] for k, v in ref.items()}


def _rot(a, b) -> float:
    a = torch.nn.functional.normalize(a.double(), dim=-1)
    b = torch.nn.functional.normalize(b.double(), dim=-1)
    return float((1 - (a * b).sum(-1).abs()).max())


def _axes(a, b) -> float:
    """How far the principal axes of two rotations differ: max |abs(Ra^T Rb) - I|. One
    ellipsoid has many (R, s): turning the frame by a diagonal M gives M R (splat-transform)
    or M R M (tilesplat), whose columns differ in sign only; the covariance is the same."""

    def mat(q):
        w, x, y, z = torch.nn.functional.normalize(q.double(), dim=-1).unbind(-1)
        return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
                           -1).reshape(-1, 3, 3)  # fmt: skip

    return float(((mat(a).transpose(1, 2) @ mat(b)).abs() - torch.eye(3)).abs().max())


def _alpha(a, b) -> float:
    return float((torch.sigmoid(a.double()) - torch.sigmoid(b.double())).abs().max())


def _err(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


# (their output's name, whether it reorders, the bound of each field: means, rotation as
# 1 - |<q, q'>|, log-scales, alpha, dc, higher SH)
THEIRS = {
    # float32 values as they are
    "out.ply": (False, dict(means=0, rot=1e-12, scales=0, alpha=0, dc=0, rest=0)),
    # Niantic's packer: 12 fractional bits, 9-bit smallest three, log-scale x 16, 8-bit
    # alpha, dc x 0.15 x 255, SH 5 / 4 bits of x 128
    "out.spz": (False, dict(means=0.5 / 4096 + 1e-6, rot=2e-5, scales=0.5 / 16 + 1e-6,
                            alpha=0.5 / 255 + 1e-6, dc=0.5 / (0.15 * 255) + 1e-5,
                            rest=8.5 / 128 + 1e-6)),  # fmt: skip
    # 11-10-11 bits of each chunk's box (y: 10 bits of the scene's 8-unit-wide box here),
    # 8 bits of the chunk's colour range, SH 8 bits of x / 8
    "out.compressed.ply": (True, dict(means=0.5 * 16 / 1023, rot=1e-5, scales=0.5 * 3 / 1023,
                                      alpha=0.5 / 255 + 1e-6, dc=0.5 * 2 / 255 + 1e-4,
                                      rest=4 / 256 + 1e-6)),  # fmt: skip
    # 16 bits of log-space means, 8-bit quaternion components (truncated), 256-entry
    # codebooks of its k-means for log-scales and dc, the SH palette of the 8 prototypes
    "out.sog": (True, dict(means=16 * 9 / 65535, rot=1e-3, scales=0.03, alpha=1 / 255 + 1e-6,
                           dc=0.03, rest=0.02)),  # fmt: skip
    "meta.json": (True, dict(means=16 * 9 / 65535, rot=1e-3, scales=0.03,
                             alpha=1 / 255 + 1e-6, dc=0.03, rest=0.02)),  # fmt: skip
    # antimatter15's records, in the PLY's order: float32 means and linear scales, colour,
    # alpha and (x 128 + 128) quaternion bytes truncated by its writer (< 1/128 a component:
    # 1 - |<q, q'>| <= (2/128)^2 / 2); no SH bands
    "out.splat": (False, dict(means=0, rot=1.25e-4, scales=1e-6, alpha=1 / 255 + 1e-6,
                              dc=1 / (255 * SH_C0) + 1e-6, rest=None)),  # fmt: skip
    # float32 linear scale and sigmoid opacity, turned to glTF's frame and back (rot: the
    # principal axes, see _axes)
    "out.glb": (False, dict(means=1e-5, axes=1e-6, scales=1e-5, alpha=1e-7, dc=1e-6,
                            rest=1e-6)),  # fmt: skip
}


@pytest.mark.parametrize("name", list(THEIRS))
def test_splat_transforms_outputs_load_as_the_same_gaussians(tmp_path, model, name):
    require_splat_transform()
    reorders, bound = THEIRS[name]
    if bound["rest"] is None:  # its .splat writer takes the PLY's quaternion as unit
        model = {**model, "quats": torch.nn.functional.normalize(model["quats"], dim=-1)}
    src = save_gaussians(tmp_path / "in.ply", model)
    out = convert(src, tmp_path / name)
    got = read_gaussians(out).gaussians
    ref = _match(model, got) if reorders else model
    if bound["rest"] is None:  # a format of the base colour only
        assert got["shN"].shape == (N, 0, 3)
        ref = {**ref, "shN": ref["shN"][:, :0]}
    assert got["shN"].shape == ref["shN"].shape
    errors = {
        "means": _err(got["means"], ref["means"]),
        **({"rot": _rot(got["quats"], ref["quats"])} if "rot" in bound else
           {"axes": _axes(got["quats"], ref["quats"])}),  # fmt: skip
        "scales": _err(got["scales"], ref["scales"]),
        "alpha": _alpha(got["opacities"], ref["opacities"]),
        "dc": _err(got["sh0"], ref["sh0"]),
        "rest": _err(got["shN"], ref["shN"]) if bound["rest"] is not None else 0,
    }
    over = {k: (e, bound[k]) for k, e in errors.items() if bound[k] is not None and e > bound[k]}
    assert not over, f"{name}: fields beyond their bound (error, bound): {over}"


def _display(column: str, values: np.ndarray) -> np.ndarray:
    if column == "opacity":
        return 1 / (1 + np.exp(-values))
    if column.startswith("scale_"):
        return np.exp(values)
    if column.startswith("f_dc_"):
        return 0.5 + SH_C0 * values
    return values


def _our_columns(g: dict, normalise_quats: bool) -> dict[str, np.ndarray]:
    """tilesplat's Gaussians as splat-transform's PLY columns (raw values)."""
    q = g["quats"].double()
    if normalise_quats:  # its .splat reader normalises the 8-bit quaternion, ours keeps it
        q = torch.nn.functional.normalize(q, dim=-1)
    n, rest_k = g["shN"].shape[:2]
    rest = g["shN"].transpose(1, 2).reshape(n, 3 * rest_k)  # channel-major
    cols = {"x": g["means"][:, 0], "y": g["means"][:, 1], "z": g["means"][:, 2],
            "opacity": g["opacities"]}  # fmt: skip
    cols |= {f"rot_{i}": q[:, i] for i in range(4)}
    cols |= {f"scale_{i}": g["scales"][:, i] for i in range(3)}
    cols |= {f"f_dc_{i}": g["sh0"][:, 0, i] for i in range(3)}
    cols |= {f"f_rest_{i}": rest[:, i] for i in range(rest.shape[1])}
    return {c: v.double().numpy() for c, v in cols.items()}


OURS = [".ply", ".compressed.ply", ".splat", ".spz", ".sog", "meta.json"]  # .glb: it reads none


@pytest.mark.parametrize("suffix", OURS)
def test_tilesplats_outputs_load_in_splat_transform(tmp_path, model, suffix):
    require_splat_transform()
    path = tmp_path / ("scene/meta.json" if suffix == "meta.json" else f"ours{suffix}")
    path.parent.mkdir(exist_ok=True)
    save_gaussians(path, model, antialiased=True)
    theirs = stats(path)
    ours = read_gaussians(path)
    degree = 0 if suffix == ".splat" else 3
    assert theirs["numGaussians"] == N and theirs["shBands"] == degree
    assert theirs["model"] == ("default" if suffix == ".splat" else "antialiased")
    assert ours.antialiased == (suffix != ".splat")
    cols = _our_columns(ours.gaussians, normalise_quats=suffix == ".splat")
    assert set(cols) <= set(theirs["columns"])
    bad = []
    for c, v in cols.items():
        t = theirs["columns"][c]
        for key, mine in (("min", _display(c, v.min())), ("max", _display(c, v.max())),
                          ("mean", _display(c, v.mean()))):  # fmt: skip
            # theirs: rounded to 6 digits; the same bytes decoded in float32 by both, but for
            # .splat's 8-bit quaternion: b / 255 * 2 - 1 there, antimatter15's (b - 128) / 128
            # here (the viewer's own decode), < 1/128 apart
            tol = 1e-2 if suffix == ".splat" and c.startswith("rot_") else 2e-6
            if not math.isclose(t[key], float(mine), rel_tol=2e-5, abs_tol=tol):
                bad.append((c, key, t[key], float(mine)))
    assert not bad, f"{suffix}: columns where splat-transform and tilesplat differ: {bad[:8]}"


def test_spz_frame_is_the_plys_in_splat_transform_and_niantics_library(tmp_path, model):
    """The decision of io/spz.py: an SPZ holds the PLY's axes. splat-transform writes a PLY
    to SPZ without changing them (the means above match unflipped), and Niantic's library,
    with its default (unspecified) frame, reads tilesplat's SPZ (v4 and v3) as the PLY."""
    require_splat_transform()
    from tilesplat.io.spz import save_spz

    for version in (4, 3):
        path = save_spz(tmp_path / f"v{version}.spz", model, version=version)
        probe = run([Path(__file__).with_name("spz_probe.mjs"), SPZ_WASM, path], cwd=tmp_path)
        out = json.loads(probe.strip().splitlines()[-1])  # the library logs lines before it
        pos = {k: np.array(v["positions"]).reshape(-1, 3) for k, v in out.items()}
        ours = read_gaussians(path).gaussians["means"].double().numpy()
        assert out["UNSPECIFIED"]["numPoints"] == N and out["UNSPECIFIED"]["shDegree"] == 3
        assert np.allclose(pos["UNSPECIFIED"], ours, atol=1e-6)  # the PLY's axes
        assert np.allclose(pos["RUB"], ours, atol=1e-6)  # its nominal frame: taken as stored
        assert np.allclose(pos["RDF"], ours * [1, -1, -1], atol=1e-6)  # asked for RDF: flips



def _glb_attributes(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The JSON of a .glb (less its generator and byte offsets) and each attribute's values."""
    raw = path.read_bytes()
    jlen = int.from_bytes(raw[12:16], "little")
    doc = json.loads(raw[20 : 20 + jlen])
    binary = raw[20 + jlen + 8 :]
    prim = doc["meshes"][0]["primitives"][0]
    kinds = {5126: np.float32, 5121: np.uint8}
    width = {"SCALAR": 1, "VEC3": 3, "VEC4": 4}
    values = {}
    for name, i in prim["attributes"].items():
        acc = doc["accessors"][i]
        view = doc["bufferViews"][acc["bufferView"]]
        start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
        dtype = np.dtype(kinds[acc["componentType"]])
        count = acc["count"] * width[acc["type"]]
        values[name] = np.frombuffer(binary, dtype, count, start).reshape(acc["count"], -1)
    doc["asset"].pop("generator")
    for acc in doc["accessors"]:
        acc.pop("byteOffset", None)
    doc.pop("bufferViews"), doc.pop("buffers")
    return doc, values


def test_tilesplats_glb_is_what_splat_transform_writes(tmp_path, model):
    """splat-transform 3.7.0 reads no .glb, so tilesplat's is checked against its writer:
    the same glTF document (attributes, accessors, the extension's properties, POSITION's
    bounds) and the same values of every attribute (float32; rotations as principal axes,
    see _axes; COLOR_0, 8 bits, within one step)."""
    src = save_gaussians(tmp_path / "in.ply", model)
    theirs_doc, theirs = _glb_attributes(convert(src, tmp_path / "theirs.glb"))
    ours_doc, ours = _glb_attributes(save_gaussians(tmp_path / "ours.glb", model))
    assert ours_doc == theirs_doc
    for name, v in theirs.items():
        if name.endswith(":ROTATION"):  # glTF's (x, y, z, w) as (w, x, y, z)
            err = _axes(torch.from_numpy(ours[name][:, [3, 0, 1, 2]]),
                        torch.from_numpy(v[:, [3, 0, 1, 2]]))  # fmt: skip
            assert err < 1e-5, name
        else:
            tol = 1 if name == "COLOR_0" else 1e-5
            assert np.abs(ours[name].astype(np.float64) - v).max() <= tol, name
