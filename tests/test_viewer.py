"""The viewer without a browser: camera math, splat buffers, render-mode scheduling, the
live view's fast path, and `tilesplat view`'s errors (viser missing included)."""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import pytest
import torch

from helpers import splats_of
from tilesplat.cli import main
from tilesplat.io.ply import save_ply
from tilesplat.viewer.scene import (
    default_pose,
    intrinsics,
    look_at_pose,
    render_view,
    rotation_to_wxyz,
    splat_buffers,
    viewmat_from_pose,
)
from tilesplat.viewer.server import INSTALL_HINT, access_lines


def _model(n: int = 50, degree: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return splats_of(torch.randn(n, 3, generator=g) * 0.3, torch.randn(n, 4, generator=g),
                     torch.randn(n, 3, generator=g) * 0.3 - 3, torch.randn(n, generator=g),
                     torch.randn(n, (degree + 1) ** 2, 3, generator=g) * 0.3)


def test_look_at_puts_the_target_in_the_image_centre():
    wxyz, pos = look_at_pose((1.0, -2.0, 3.0), (0.2, 0.1, -0.4), up=(0.0, -1.0, 0.0))
    view = viewmat_from_pose(wxyz, pos)
    K = intrinsics(math.radians(60), 200, 100)
    p = K @ (view @ np.array([0.2, 0.1, -0.4, 1.0]))[:3]
    assert p[2] > 0 and np.allclose(p[:2] / p[2], [100.0, 50.0])
    above = K @ (view @ np.array([0.2, -0.9, -0.4, 1.0]))[:3]  # world -y is up on screen
    assert above[1] / above[2] < 50.0
    assert K[1, 1] == pytest.approx(50.0 / math.tan(math.radians(30)))


@pytest.mark.parametrize("seed", range(5))
def test_rotation_to_wxyz_round_trips(seed):
    q = np.random.default_rng(seed).normal(size=4)
    q /= np.linalg.norm(q)
    rot = viewmat_from_pose(q, np.zeros(3))[:3, :3].T  # camera-to-world rotation of q
    back = rotation_to_wxyz(rot)
    assert abs(abs(back @ q) - 1.0) < 1e-9


def test_splat_buffers_covariance_and_colour():
    m = _model(20)
    b = splat_buffers(m)
    q = torch.nn.functional.normalize(m["quats"][3].double(), dim=0).numpy()
    rot = viewmat_from_pose(q, np.zeros(3))[:3, :3].T
    s = np.exp(m["scales"][3].double().numpy())
    assert np.allclose(b.covariances[3], rot @ np.diag(s**2) @ rot.T, rtol=1e-4, atol=1e-9)
    assert b.rgbs.shape == (20, 3) and b.opacities.shape == (20, 1)
    assert np.allclose(b.rgbs[0], np.clip(0.5 + 0.28209479 * m["sh0"][0, 0].numpy(), 0, 1))


def test_render_view_modes():
    m = _model(200)
    wxyz, pos, _ = default_pose(m)
    view, K = viewmat_from_pose(wxyz, pos), intrinsics(1.0, 48, 32)
    rgb = render_view(m, view, K, 48, 32, backend="torch")
    depth = render_view(m, view, K, 48, 32, mode="depth", backend="torch")
    alpha = render_view(m, view, K, 48, 32, mode="alpha", backend="torch")
    assert rgb.shape == depth.shape == alpha.shape == (32, 48, 3) and rgb.dtype == np.uint8
    assert (rgb != 255).any() and alpha.max() > 100 and depth.max() == 255
    assert np.array_equal(alpha[..., 0], alpha[..., 2])
    with pytest.raises(ValueError, match="mode must be one of"):
        render_view(m, view, K, 48, 32, mode="normals")


def test_access_lines_offer_ssh_forwarding_for_loopback():
    lines = access_lines("127.0.0.1", 8123)
    assert lines[0] == "open http://127.0.0.1:8123 in a browser"
    assert "ssh -N -L 8123:127.0.0.1:8123" in lines[1]
    assert "anyone who can reach it" in access_lines("0.0.0.0", 8123)[1]


def test_view_without_viser_is_one_line(tmp_path, capsys, monkeypatch):
    save_ply(tmp_path / "m.ply", _model())
    monkeypatch.setitem(sys.modules, "viser", None)  # import viser raises ImportError
    assert main(["view", str(tmp_path / "m.ply")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tilesplat view: error: {INSTALL_HINT}"
    assert 'pip install "tilesplat[viewer]"' in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["view", "missing.ply"], "no run folder, checkpoint or splat file"),
        (["view", "m.ply", "--port", "70000"], "--port must be in 0..65535"),
        (["view", "notes.txt"], "expected a run folder, a checkpoint"),
    ],
)
def test_view_errors_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    pytest.importorskip("viser")
    monkeypatch.chdir(tmp_path)
    save_ply(tmp_path / "m.ply", _model())
    (tmp_path / "notes.txt").write_text("hello")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_live_view_without_a_browser_touches_nothing(monkeypatch):
    pytest.importorskip("viser")
    from tilesplat.viewer import live

    viewer = live.LiveViewer(0, log=lambda _: None)
    try:
        monkeypatch.setattr(live, "gaussians_from_params", lambda p: pytest.fail("copied"))
        params = {"means": torch.zeros(3, 3)}
        t0 = time.perf_counter()
        for step in range(10_000):
            viewer.after_step(step, 0.1, 20.0, params)
        per_call = (time.perf_counter() - t0) / 10_000
        assert per_call < 20e-6, per_call  # one attribute read and one Event check
        assert viewer.pushes == 0 and viewer.step == -1
        assert viewer.server.get_host() == "127.0.0.1"  # loopback unless told otherwise
    finally:
        viewer.close()


def test_render_mode_marks_rapid_camera_updates_as_moving():
    from tilesplat.viewer.server import SETTLE_S, ViewServer, _ClientView

    server = ViewServer.__new__(ViewServer)  # only the scheduling state, no viser
    import threading

    server._lock = threading.Lock()
    view = _ClientView(client=None, wake=threading.Event())
    server._touch(view, moving=True)
    assert not view.moving  # the first update after a pause renders at full quality
    server._touch(view, moving=True)
    assert view.moving and view.version == 2
    time.sleep(SETTLE_S * 1.2)
    server._touch(view, moving=True)
    assert not view.moving


def test_viewer_port_is_a_checked_config_key():
    from tilesplat.train.config import TrainConfig, apply_overrides

    assert TrainConfig().viewer_port == 0  # off unless asked for
    assert apply_overrides(TrainConfig(), ["viewer_port=8080"]).viewer_port == 8080
    with pytest.raises(ValueError, match="viewer_port must be in 0..65535"):
        apply_overrides(TrainConfig(), ["viewer_port=70000"])


def test_loopback_by_default_and_never_a_share_tunnel():
    from pathlib import Path

    from tilesplat.cli import build_parser

    assert build_parser().parse_args(["view", "m.ply"]).host == "127.0.0.1"
    src = Path(__file__).resolve().parents[1] / "src" / "tilesplat" / "viewer"
    for path in src.glob("*.py"):
        assert "share_url" not in path.read_text(), f"{path} opens a share tunnel"
