"""The camera paths of ``tilesplat render --path`` (``data/trajectory.py``), on rigs whose focus,
up vector and radius are known by construction."""

import numpy as np
import pytest

from tilesplat.data.trajectory import (
    MAX_FRAMES,
    Rig,
    camera_path,
    camera_to_world,
    chain_order,
    look_at,
    slerp,
    world_to_camera,
)

FOCUS = np.array([0.3, -0.2, 0.5])


def tilted_up() -> np.ndarray:
    up = np.array([0.2, 0.1, 1.0])
    return up / np.linalg.norm(up)


def basis(up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.cross(up, [1.0, 0.0, 0.0])
    a /= np.linalg.norm(a)
    return a, np.cross(up, a)


def ring(n=12, radius=(3.0, 2.0), height=1.0, jitter=0.0, seed=0) -> tuple[np.ndarray, dict]:
    """Cameras on an ellipse around FOCUS at ``height`` above it (along a tilted up), all
    looking at FOCUS; their angles, in order, from 0."""
    rng = np.random.default_rng(seed)
    up = tilted_up()
    a, b = basis(up)
    theta = np.linspace(0.0, 2 * np.pi, n, endpoint=False) + 0.4
    pos = (FOCUS + height * up + radius[0] * np.cos(theta)[:, None] * a
           + radius[1] * np.sin(theta)[:, None] * b)
    pos += jitter * rng.normal(size=pos.shape)
    return look_at(pos, FOCUS, up), {"up": up, "a": a, "b": b, "height": height}


def centres_forwards_ups(viewmats):
    c2w = camera_to_world(viewmats)
    return c2w[:, :3, 3], c2w[:, :3, 2], -c2w[:, :3, 1], c2w[:, :3, 0]


def assert_looks_at(viewmats, point):
    centres, forwards, _, _ = centres_forwards_ups(viewmats)
    to_point = point[None] - centres
    to_point /= np.linalg.norm(to_point, axis=1, keepdims=True)
    np.testing.assert_allclose(np.einsum("ci,ci->c", forwards, to_point), 1.0, atol=1e-9)


def assert_rigid(viewmats):
    R = viewmats[:, :3, :3]
    np.testing.assert_allclose(R @ np.transpose(R, (0, 2, 1)), np.eye(3)[None].repeat(len(R), 0),
                               atol=1e-9)
    np.testing.assert_allclose(np.linalg.det(R), 1.0, atol=1e-9)
    np.testing.assert_array_equal(viewmats[:, 3], np.array([[0.0, 0, 0, 1]] * len(R)))


def test_look_at_is_an_opencv_camera():
    # at -3 x looking at the origin with z up: right is -y, down is -z, forward is +x
    v = look_at(np.array([[-3.0, 0.0, 0.0]]), np.zeros(3), np.array([0.0, 0.0, 1.0]))
    c2w = camera_to_world(v)[0]
    np.testing.assert_allclose(c2w[:3, :3], [[0, 0, 1], [-1, 0, 0], [0, -1, 0]], atol=1e-12)
    np.testing.assert_allclose(v[0] @ [0.0, 0.0, 0.0, 1.0], [0, 0, 3, 1], atol=1e-12)  # depth 3
    np.testing.assert_allclose(world_to_camera(camera_to_world(v)), v, atol=1e-12)


def test_the_rig_finds_the_focus_and_the_up_vector():
    views, known = ring(jitter=0.0)
    rig = Rig(views)
    np.testing.assert_allclose(rig.focus, FOCUS, atol=1e-9)
    # each camera's up is the tilted up's part normal to its view; their mean leans to it
    assert rig.up @ known["up"] > 0.99


def test_ellipse_circles_the_focus_at_the_cameras_height():
    views, known = ring(n=10, jitter=0.05)
    rig = Rig(views)
    path = camera_path("ellipse", views, 36)
    assert path.shape == (36, 4, 4)
    assert_rigid(path)
    assert_looks_at(path, rig.focus)
    centres, _, ups, rights = centres_forwards_ups(path)
    rel = centres - rig.focus
    heights = rel @ rig.up
    training_heights = (centres_forwards_ups(views)[0] - rig.focus) @ rig.up
    np.testing.assert_allclose(heights, training_heights.mean(), atol=1e-9)  # one plane
    # centred on the focus: the mean offset in the plane over a full turn is zero
    planar = rel - heights[:, None] * rig.up
    assert np.linalg.norm(planar.mean(0)) < 1e-9
    # its radii are those of the cameras (3 and 2 along the known axes, within the jitter)
    ra = np.abs(planar @ known["a"]).max()
    rb = np.abs(planar @ known["b"]).max()
    assert 2.6 < ra < 3.4 and 1.6 < rb < 2.4, (ra, rb)
    # no roll: every camera's right is level, and its up points up
    np.testing.assert_allclose(rights @ rig.up, 0.0, atol=1e-9)
    assert (ups @ rig.up > 0).all()
    # it starts at the first training camera's angle and turns at an even pace
    c0 = centres_forwards_ups(views)[0][0] - rig.focus
    c0 = c0 - (c0 @ rig.up) * rig.up
    cos = (planar[0] @ c0) / np.linalg.norm(planar[0]) / np.linalg.norm(c0)
    assert cos > 0.99
    steps = np.linalg.norm(np.diff(np.vstack([centres, centres[:1]]), axis=0), axis=1)
    assert steps.max() < 1.6 * steps.min()


def forward_facing(n=9) -> np.ndarray:
    """Cameras on a 3 x 3 grid in a plane, all looking along +y with z up (axes parallel)."""
    xs, zs = np.meshgrid([-0.5, 0.0, 0.5], [-0.3, 0.0, 0.3])
    pos = np.stack([xs.ravel(), np.zeros(n), zs.ravel()], 1)
    views = np.zeros((n, 4, 4))
    for i, p in enumerate(pos):
        views[i] = look_at(p[None], p + [0.0, 1.0, 0.0], np.array([0.0, 0.0, 1.0]))[0]
    return views


def test_spiral_of_a_forward_facing_capture_looks_at_the_points_depth():
    views = forward_facing()
    points = np.random.default_rng(0).normal(size=(500, 3)) * 0.2 + [0.0, 4.0, 0.0]
    rig = Rig(views, points)
    np.testing.assert_allclose(rig.focus, [0.0, 4.0, 0.0], atol=0.1)  # the points' depth
    np.testing.assert_allclose(rig.up, [0.0, 0.0, 1.0], atol=1e-12)
    path = camera_path("spiral", views, 40, points)
    assert_rigid(path)
    assert_looks_at(path, rig.focus)
    centres, _, ups, rights = centres_forwards_ups(path)
    # around the mean camera, within the cameras' spread, in front of the focus
    assert np.abs(centres[:, 0]).max() <= 0.5 + 1e-9 and np.abs(centres[:, 2]).max() <= 0.3 + 1e-9
    assert np.abs(centres[:, 0]).max() > 0.4  # it does go round
    assert (centres[:, 1] < rig.focus[1]).all()
    assert (ups[:, 2] > 0).all() and np.abs(rights[:, 2]).max() < 1e-9
    # without points the focus sits at the cameras' spread in front of them
    np.testing.assert_allclose(Rig(views).focus, [0.0, Rig(views).spread, 0.0], atol=1e-12)


def test_interp_passes_through_the_training_cameras_in_a_chain():
    views, _ = ring(n=8, jitter=0.02)
    shuffled = views[[0, 5, 2, 7, 1, 3, 6, 4]]
    rig = Rig(shuffled)
    order = chain_order(rig)
    # the chain walks round the ring from the first camera (one way or the other)
    ring_index = [0, 5, 2, 7, 1, 3, 6, 4]
    walked = [ring_index[i] for i in order]
    steps = {(b - a) % 8 for a, b in zip(walked, walked[1:], strict=False)}
    assert walked[0] == 0 and (steps == {1} or steps == {7}), walked
    n = 4 * (len(views) - 1) + 1
    path = camera_path("interp", shuffled, n)
    assert_rigid(path)
    for k, i in enumerate(order):  # every 4th frame is a training camera, bit for bit
        assert np.array_equal(path[4 * k], shuffled[i])
    # smooth in between: no frame jumps farther than a quarter of the gap between cameras
    centres = centres_forwards_ups(path)[0]
    gaps = np.linalg.norm(np.diff(centres, axis=0), axis=1)
    key_gap = np.linalg.norm(np.diff(centres[::4], axis=0), axis=1).max()
    assert gaps.max() < 0.4 * key_gap
    # the rotation turns monotonically between neighbouring cameras (slerp)
    forwards = centres_forwards_ups(path)[1]
    for k in range(len(order) - 1):
        seg = forwards[4 * k: 4 * k + 5]
        angles = np.arccos(np.clip(seg @ seg[-1], -1, 1))
        assert (np.diff(angles) < 1e-12).all()


def test_slerp_is_the_constant_speed_arc():
    q0 = np.array([1.0, 0.0, 0.0, 0.0])
    q1 = np.array([np.cos(0.5), 0.0, 0.0, np.sin(0.5)])  # 1 rad about z
    for t in (0.0, 0.25, 0.5, 1.0):
        np.testing.assert_allclose(slerp(q0, q1, t), [np.cos(0.5 * t), 0, 0, np.sin(0.5 * t)],
                                   atol=1e-12)


def test_one_camera_and_one_frame():
    views, _ = ring(n=1)
    for name in ("ellipse", "spiral", "interp"):
        path = camera_path(name, views, 5)
        assert path.shape == (5, 4, 4) and np.isfinite(path).all()
    assert np.array_equal(camera_path("interp", views, 1)[0], views[0])


@pytest.mark.parametrize(
    ("path", "n", "views", "message"),
    [
        ("orbit", 5, None, "--path must be one of"),
        ("ellipse", 0, None, "--frames must be an integer in 1..10000, got 0"),
        ("ellipse", MAX_FRAMES + 1, None, "--frames must be an integer"),
        ("ellipse", True, None, "--frames must be an integer"),
        ("ellipse", 5, np.zeros((3, 3, 4)), "expected camera matrices"),
        ("ellipse", 5, np.full((2, 4, 4), np.nan), "NaN"),
    ],
)
def test_bad_requests(path, n, views, message):
    views = ring(n=4)[0] if views is None else views
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        camera_path(path, views, n)
