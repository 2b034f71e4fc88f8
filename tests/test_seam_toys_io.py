"""Issue 39's seams outside the trainer, each proven by a toy: a camera model, a splat file format
and a data source are each added to a copy of the package as one new module and its
registration line, and nothing else (the diff of the copy against the package says so), then a
fresh process with the copy on ``PYTHONPATH`` uses the toy through the public calls.

- camera: ``backends/cameras/toy.py`` (a pinhole with a 2x zoom) and its name in
  ``CAMERA_MODELS``. ``rasterization(camera_model="toy")`` on ``torch`` and ``cpu`` must give
  the images and gradients of the same scene through the pinhole camera with doubled focal
  lengths (forward 1e-5, gradients 1e-4, abs and rel: the contract's tolerances), the two
  backends must agree with each other, and an unknown model's error lists the toy. Before the
  toy is added, the copy compiles the CPU projection kernels into the Numba cache the toy run
  then uses: a kernel compiled for the old table must not be served (its dispatch would fall
  back to the pinhole and lose the zoom).
- file format: ``io/toy.py`` (an ``.npz`` under its own field names) and its line in
  ``FORMATS``: Gaussians round-trip bitwise through ``save_gaussians`` / ``load_gaussians`` by
  the suffix, and ``tilesplat export --to toy`` writes it.
- data source: ``data/toy.py`` (a ``toy.json`` of posed PNGs) and its ``Layout`` line in
  ``LAYOUTS``: ``load_dataset`` finds it and its frames load.

Cost: 56 s on the shared 2-core machine (pytest, one process), nearly all of it Numba
compiling the CPU projection kernels and then the whole CPU rasterizer for the camera into a
fresh cache; the other two seams take 3 s each.
"""

from __future__ import annotations

import difflib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import assert_close

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tilesplat"
TIMEOUT = 900  # seconds for one child process (cold Numba compiles on a loaded 2-core box)
FORWARD_TOL = 1e-5
GRADIENT_TOL = 1e-4


def _copy_package(tmp_path: Path) -> Path:
    """A copy of the package under ``tmp_path / "src"`` (no caches); returns that folder."""
    root = tmp_path / "src"
    shutil.copytree(PACKAGE, root / "tilesplat",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    return root


def _add_toy(root: Path, module: str, source: str, table: str, after: str, line: str) -> None:
    """Write the toy module ``module`` and insert the registration ``line`` after the one line
    of ``table`` that is ``after`` (both paths relative to the package)."""
    path = root / "tilesplat" / module
    assert not path.exists(), path
    path.write_text(textwrap.dedent(source).lstrip())
    table_path = root / "tilesplat" / table
    lines = table_path.read_text().splitlines(keepends=True)
    at = [i for i, text in enumerate(lines) if text.rstrip("\n") == after]
    assert len(at) == 1, f"{table}: {len(at)} lines read {after!r}"
    lines.insert(at[0] + 1, line + "\n")
    table_path.write_text("".join(lines))


def _changes(root: Path) -> tuple[list[str], dict[str, list[str]]]:
    """(files new in the copy, {changed file: its diff lines}) against the package."""
    def files(base: Path) -> set[str]:
        return {p.relative_to(base).as_posix() for p in base.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts
                and p.suffix not in (".pyc", ".nbi", ".nbc")}  # fmt: skip

    ours, copy = files(PACKAGE), files(root / "tilesplat")
    assert not ours - copy, f"files gone from the copy: {sorted(ours - copy)}"
    changed = {}
    for rel in sorted(ours):
        a = (PACKAGE / rel).read_bytes()
        b = (root / "tilesplat" / rel).read_bytes()
        if a != b:
            changed[rel] = [d for d in difflib.unified_diff(
                a.decode().splitlines(), b.decode().splitlines(), lineterm="", n=0)
                if d[:1] in "+-" and not d.startswith(("+++", "---"))]  # fmt: skip
    return sorted(copy - ours), changed


def _assert_one_module_and_its_line(root: Path, module: str, table: str, line: str) -> None:
    new, changed = _changes(root)
    assert new == [module], new
    assert changed == {table: ["+" + line]}, changed


def _run(root: Path, tmp_path: Path, *blocks: str) -> str:
    """Run the code ``blocks`` (each indented as it likes) in a fresh Python with the copy
    first on its path and a Numba cache of its own; its stdout. A child past :data:`TIMEOUT`
    is ended, with its process group, by its PID."""
    env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "TILESPLAT_POISON": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    prelude = ("import tilesplat\n"
               f"assert tilesplat.__file__.startswith({str(root)!r}), tilesplat.__file__\n")
    code = prelude + "".join(textwrap.dedent(block) for block in blocks)
    proc = subprocess.Popen([sys.executable, "-c", code],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the child process ran past {TIMEOUT} s")
    assert proc.returncode == 0, f"child failed (exit {proc.returncode}):\n{err[-6000:]}"
    return out


# --- camera model ------------------------------------------------------------------------

TOY_CAMERA = '''
    """A toy camera model: the pinhole with its focal lengths doubled (a 2x zoom)."""

    from __future__ import annotations

    from torch import Tensor

    from ..scalar_types import like
    from .pinhole import pinhole_proj, pinhole_proj_vjp, pinhole_torch

    FUNCTIONS = ("toy_proj", "toy_proj_vjp")


    def toy_proj(x, y, z, fx, fy, cx, cy, width, height):
        two = like(fx, 2.0)
        return pinhole_proj(x, y, z, two * fx, two * fy, cx, cy, width, height)


    def toy_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj):
        two = like(fx, 2.0)
        return pinhole_proj_vjp(x, y, z, two * fx, two * fy, cx, cy, width, height, vu, vv, vj)


    def toy_torch(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
        zoom = Ks.new_tensor([[2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 1.0]])
        return pinhole_torch(means_c, Ks * zoom, width, height)
'''

# the scene: 60 Gaussians in front of two 24 x 20 cameras; every tensor a gradient asks for
CAMERA_RUN = """
    import torch
    from tilesplat import fully_fused_projection, rasterization

    g = torch.Generator().manual_seed(0)
    n, w, h = 60, 24, 20
    means = torch.randn(n, 3, generator=g) * torch.tensor([0.8, 0.7, 0.5]) + torch.tensor(
        [0.0, 0.0, 4.0])
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.15 + 0.05
    opacities = torch.rand(n, generator=g) * 0.8 + 0.1
    sh = torch.randn(n, 4, 3, generator=g) * 0.3
    viewmats = torch.eye(4).repeat(2, 1, 1)
    viewmats[1, :3, 3] = torch.tensor([0.3, -0.2, 0.5])
    Ks = torch.tensor([[12.0, 0.0, 12.0], [0.0, 11.0, 10.0], [0.0, 0.0, 1.0]]).repeat(2, 1, 1)
    zoomed = Ks.clone()
    zoomed[:, 0, 0] *= 2
    zoomed[:, 1, 1] *= 2
    up = torch.randn(2, h, w, 3, generator=g), torch.randn(2, h, w, 1, generator=g)
"""


def test_toy_camera_model_is_one_module_and_one_line(tmp_path):
    root = _copy_package(tmp_path)
    # the CPU projection kernels of the old table, compiled into the cache the toy uses next
    _run(root, tmp_path, CAMERA_RUN, """
        means.requires_grad_(True)
        out = fully_fused_projection(means, None, quats, scales, viewmats, Ks, w, h,
                                     backend="cpu")
        (out[1].sum() + out[3].sum()).backward()
    """)
    cached = list((tmp_path / "numba").rglob("projection_*.nbi"))
    assert cached, "the projection kernels were not cached"

    line = '    "toy",'
    _add_toy(root, "backends/cameras/toy.py", TOY_CAMERA, "backends/cameras/__init__.py",
             '    "fisheye",', line)
    _assert_one_module_and_its_line(root, "backends/cameras/toy.py",
                                    "backends/cameras/__init__.py", line)
    _run(root, tmp_path, CAMERA_RUN, f"""
        import pytest

        with pytest.raises(ValueError, match=r"camera_model to be one of \\[.*'toy'\\]"):
            rasterization(means, quats, scales, opacities, sh, viewmats, Ks, w, h, sh_degree=1,
                          camera_model="toy2", backend="cpu")
        out = {{}}
        cases = (("toy", "toy", Ks), ("pinhole2x", "pinhole", zoomed), ("pinhole", "pinhole", Ks))
        for name, model, K in cases:  # the whole render, on the reference
            inputs = [t.clone().requires_grad_(True)
                      for t in (means, quats, scales, opacities, sh, viewmats)]
            colors, alphas, _ = rasterization(*inputs[:5], inputs[5], K, w, h, sh_degree=1,
                                              packed=False, camera_model=model,
                                              backend="torch")
            ((colors * up[0]).sum() + (alphas * up[1]).sum()).backward()
            out[name, "render"] = [colors.detach(), alphas.detach()] + [t.grad for t in inputs]
        for backend in ("torch", "cpu"):  # the projection, where a camera model acts
            for name, model, K in cases:
                inputs = [t.clone().requires_grad_(True)
                          for t in (means, quats, scales, viewmats)]
                proj = fully_fused_projection(inputs[0], None, inputs[1], inputs[2],
                                              inputs[3], K, w, h, camera_model=model,
                                              backend=backend)
                radii, means2d, depths, conics = proj[:4]
                (means2d * up[0][..., :2].reshape(-1, 2)[:means2d.shape[1]]).sum().backward(
                    retain_graph=True)
                (depths.sum() + conics.sum()).backward()
                out[name, backend] = [means2d.detach(), radii.float()] + [
                    t.grad for t in inputs]
        torch.save(out, {str(tmp_path / "camera.pt")!r})
    """)
    out = torch.load(tmp_path / "camera.pt")
    renders = ("colors", "alphas", "v_means", "v_quats", "v_scales", "v_opacities", "v_sh",
               "v_viewmats")
    projections = ("means2d", "radii", "v_means", "v_quats", "v_scales", "v_viewmats")

    def close(label, names, got, want):
        for name, a, b in zip(names, got, want, strict=True):
            tol = FORWARD_TOL if name in ("colors", "alphas", "means2d", "radii") else (
                GRADIENT_TOL)
            assert_close(f"{label} {name}", a, b, tol, tol)

    close("toy vs pinhole 2x (render)", renders, out["toy", "render"], out["pinhole2x", "render"])
    # the zoom shows: the plain pinhole sees another image (and covers more of it)
    assert (out["toy", "render"][0] - out["pinhole", "render"][0]).abs().max() > 0.1
    assert out["toy", "render"][1].mean() > 0.05  # the Gaussians are in view
    for backend in ("torch", "cpu"):
        close(f"toy vs pinhole 2x ({backend})", projections, out["toy", backend],
              out["pinhole2x", backend])
        assert (out["toy", backend][0] - out["pinhole", backend][0]).abs().max() > 0.1
    close("toy cpu vs torch", projections, out["toy", "cpu"], out["toy", "torch"])


# --- file format -------------------------------------------------------------------------

TOY_FORMAT = '''
    """A toy splat format: the Gaussians as one NumPy ``.npz`` under the file's own names."""

    from __future__ import annotations

    from pathlib import Path

    import numpy as np
    import torch

    from ._checks import SplatData, all_sh, as_arrays, decoded, malformed, split_sh
    from .atomic import atomic_writer


    def save_toy(path: str | Path, splats: dict[str, torch.Tensor],
                 antialiased: bool = False) -> Path:
        a = as_arrays(splats)
        path = Path(path)
        with atomic_writer(path) as f:
            np.savez(f, xyz=a["means"], log_scale=a["scales"], wxyz=a["quats"],
                     alpha_logit=a["opacities"], sh=all_sh(a), mip=np.array(antialiased))
        return path


    def read_toy(path: str | Path) -> SplatData:
        path = Path(path)
        with malformed(path, "toy"), np.load(path) as z:
            arrays = {"means": z["xyz"], "scales": z["log_scale"], "quats": z["wxyz"],
                      "opacities": z["alpha_logit"], **split_sh(z["sh"])}
            antialiased = bool(z["mip"])
        return decoded(path, arrays, antialiased)
'''


def test_toy_file_format_is_one_module_and_one_line(tmp_path):
    root = _copy_package(tmp_path)
    line = '    ".toy": Format("toy", "toy"),  # the seam test\'s toy'
    _add_toy(root, "io/toy.py", TOY_FORMAT, "io/gaussians.py",
             '    ".glb": Format("glb", "glb"),  # glTF 2.0 + KHR_gaussian_splatting', line)
    _assert_one_module_and_its_line(root, "io/toy.py", "io/gaussians.py", line)
    _run(root, tmp_path, """
        import torch
        from tilesplat.cli import main
        from tilesplat.io.gaussians import BY_NAME, load_gaussians, read_gaussians, save_gaussians

        g = torch.Generator().manual_seed(1)
        n = 50
        splats = {"means": torch.randn(n, 3, generator=g), "scales": torch.randn(n, 3) - 3,
                  "quats": torch.randn(n, 4, generator=g), "opacities": torch.randn(n),
                  "sh0": torch.randn(n, 1, 3), "shN": torch.randn(n, 8, 3)}
        assert BY_NAME["toy"] == ".toy"
        data = read_gaussians(save_gaussians("model.toy", splats, antialiased=True))
        assert data.antialiased
        for key, t in splats.items():
            assert torch.equal(data.gaussians[key], t), key
        back = load_gaussians("model.toy")
        assert all(torch.equal(back[k], t) for k, t in splats.items())
        # the CLI's --to choices come from the table
        save_gaussians("model.ply", splats)
        assert main(["export", "model.ply", "--to", "toy", "--out", "out.toy"]) == 0
        again = load_gaussians("out.toy")
        assert all(torch.equal(again[k], t) for k, t in splats.items())
    """)


# --- data source -------------------------------------------------------------------------

TOY_SOURCE = '''
    """A toy data source: ``toy.json`` lists posed PNGs, each with its pinhole intrinsics and
    world-to-camera matrix (OpenCV axes); every third image, by name, is a test view."""

    from __future__ import annotations

    import json
    from collections.abc import Callable
    from pathlib import Path

    import numpy as np
    import torch

    from ..io.images import read_image
    from .frames import Frame, SceneDataset, cameras_extent, image_to_tensors, split_every


    def load_toy(path: str | Path, *, downscale: int = 1, white_background: bool = True,
                 test_every: int = -1, masks_dir: str | Path | None = None,
                 log: Callable[[str], None] | None = None) -> SceneDataset:
        root = Path(path)
        if downscale != 1 or masks_dir:
            raise ValueError("the toy source loads full-size images without masks")
        frames = []
        for item in json.loads((root / "toy.json").read_text())["frames"]:
            image, alpha = image_to_tensors(read_image(root / item["image"]), (0.0, 0.0, 0.0))
            fx, fy, cx, cy = item["intrinsics"]
            K = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
            frames.append(Frame(Path(item["image"]).stem, torch.tensor(item["viewmat"]), K,
                                image.shape[1], image.shape[0], image, alpha))
        train, test = split_every([f.name for f in frames], 3 if test_every < 0 else test_every)
        centers = np.stack([f.camera_center.double().numpy() for f in frames])
        center = centers.mean(0)
        return SceneDataset([frames[i] for i in train], [frames[i] for i in test], None, None,
                            torch.from_numpy(center).float(), cameras_extent(centers, center),
                            (0.0, 0.0, 0.0), kind="toy", path=root)
'''


def test_toy_data_source_is_one_module_and_its_layout_line(tmp_path):
    root = _copy_package(tmp_path)
    line = ('    Layout("toy", lambda p: (p / "toy.json").is_file(), "toy.json (the seam test\'s '
            'toy)", "toy"),')
    _add_toy(root, "data/toy.py", TOY_SOURCE, "data/dataset.py",
             '           "sparse/0/ with cameras, images, points3D (COLMAP)", "colmap"),', line)
    _assert_one_module_and_its_line(root, "data/toy.py", "data/dataset.py", line)
    _run(root, tmp_path, """
        import json
        from pathlib import Path

        import numpy as np
        import torch
        from tilesplat.data.dataset import detect_layout, load_dataset
        from tilesplat.io.images import write_png

        scene = Path("scene")
        scene.mkdir()
        rng = np.random.default_rng(0)
        frames, pixels = [], {}
        for i in range(4):
            image = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
            write_png(scene / f"v{i}.png", image)
            pixels[f"v{i}"] = image
            view = np.eye(4)
            view[:3, 3] = [0.1 * i, 0.0, 2.0]
            frames.append({"image": f"v{i}.png", "intrinsics": [9.0, 9.5, 4.0, 3.0],
                           "viewmat": view.tolist()})
        (scene / "toy.json").write_text(json.dumps({"frames": frames}))
        assert detect_layout(scene) == "toy"
        data = load_dataset(scene)
        assert data.kind == "toy"
        assert [f.name for f in data.train] == ["v1", "v2"]
        assert [f.name for f in data.test] == ["v0", "v3"]
        for f in data.train + data.test:
            assert (f.width, f.height) == (8, 6) and f.K[1, 1].item() == 9.5
            assert torch.equal((f.image * 255).round().to(torch.uint8),
                               torch.from_numpy(pixels[f.name]))
        assert data.train[0].viewmat[0, 3].item() == np.float32(0.1)
    """)
