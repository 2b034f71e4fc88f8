"""Where a scene goes: the bench's three entry points, each sending a ``run:RUN_DIR`` scene to
the replay of the run (:mod:`.replay`, the trainer's own step on its checkpoint) and any other
scene to the staged passes (:mod:`.runner`, :mod:`.parity`).

This is the only place that asks which kind a scene is (:func:`.run_spec.is_run_spec`), and
:mod:`.replay` is imported only for runs: other scenes never import the trainer and its image
I/O (Pillow, which a bare GPU machine's python3 may lack: ``scripts/gpu_check.py`` needs only
torch and numba).
"""

from __future__ import annotations

from typing import Any

import torch

from ..data.scenes import Scene, load_scene
from .arms import Arm, check_usable, parse_arm
from .parity import Hook, check_sh_degree, parity_of_scene, self_noise_of_scene
from .run_spec import is_run_spec
from .runner import SceneWorkload, Workload, measure
from .tolerance import ATOL, RTOL


def _load(scene: Scene | str, dtype: torch.dtype) -> Scene:
    return load_scene(scene, dtype=dtype) if isinstance(scene, str) else scene


def _arm(spec: Arm | str) -> Arm:
    arm = spec if isinstance(spec, Arm) else parse_arm(spec)
    check_usable(arm)
    return arm


def run_bench(
    scene: Scene | str,
    arms: list[str | Arm] | str,
    iters: int | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    sh_degree: int = 3,
    tile_size: int = 16,
    seed: int = 0,
    calibrate: bool = True,
    calibration_seconds: float = 0.5,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Measures every arm on one scene; returns a JSON-ready dict (schema ``SCHEMA``).

    Args:
        scene: a Scene, a name for ``load_scene`` (``garden``, ``synthetic:N:WxH``), or
            ``run:RUN_DIR``: a training run's checkpoint, whose training step is the trainer's
            own (:mod:`.replay`; ``sh_degree`` and ``tile_size`` are then the run's).
        arms: specs ``backend[:scheme][@device]``; the first is the baseline of the ratios
            and of the parity gate.
        iters: timed iterations per repeat; repeats: repeats (the statistics are over the
            repeats, each one the mean of its iterations); warmup: untimed passes first (>= 1).
            None: 3, 3, 1 (run scenes: 50, 3, 10).
        calibrate: measure the per-pair ceiling (:func:`.ceiling.calibrate`).
        threads: Numba and torch threads for the run (None: as configured).
        hook: test hook called with each arm's first warm-up pass (see :mod:`.parity`).
    """
    workload: Workload
    if is_run_spec(scene):
        from .replay import RunWorkload, open_run

        workload = RunWorkload(open_run(scene))
    else:
        workload = SceneWorkload(scene)
    return measure(workload, arms, iters, repeats, warmup, sh_degree, tile_size, seed,
                   calibrate, calibration_seconds, dtype, threads, hook)


def run_parity(
    scene: Scene | str,
    arm_a: Arm | str,
    arm_b: Arm | str,
    sh_degree: int = 3,
    tile_size: int = 16,
    seed: int = 0,
    atol: float = ATOL,
    rtol: float = RTOL,
    dtype: torch.dtype = torch.float32,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Runs one staged pass per arm under one shared upstream gradient and compares them.

    The second arm's stages are fed the first arm's stage inputs (see ``staged_pass``), so
    every op is compared on identical inputs. ``radii`` are integers from a ``ceil`` and may
    differ by one pixel where the float radius sits on an integer: such elements are counted
    (``off_by_one``) and pass; any larger difference fails.

    ``scene`` may be ``run:RUN_DIR``: then each arm runs one step of the run's trainer on
    its checkpoint (:func:`.replay.run_parity_on_run`: the loss, every parameter gradient
    under the checkpoint's names, the rasterizer's gradients, the tile offsets exactly and
    the intersection order, reported and not gated); ``sh_degree``, ``tile_size``, ``seed``
    and ``dtype`` are then the run's.

    Arms on different device types may have a few failing elements per tensor (the policy
    of :mod:`.tolerance`); the same device type, none.

    Returns:
        dict with ``kind`` "parity", ``arms``, ``scene``, ``atol``, ``rtol``,
        ``cross_device``, ``tensors`` (one row per tensor: ``n_fail``, ``numel_a``,
        ``allowed``, ``max_abs``, ``max_rel``, ``verdict``, ...), ``summary`` (one line) and
        ``passed`` (every gated row passed).
    """
    if is_run_spec(scene):
        from .replay import open_run, run_parity_on_run

        return run_parity_on_run(open_run(scene), _arm(arm_a), _arm(arm_b), atol, rtol, hook)
    sc = _load(scene, dtype)
    check_sh_degree(sh_degree)
    a, b = _arm(arm_a), _arm(arm_b)
    return parity_of_scene(sc, a, b, sh_degree, tile_size, seed, atol, rtol, hook)


def run_self_noise(
    scene: Scene | str,
    arms: list[Arm | str] | Arm | str,
    k: int = 3,
    sh_degree: int = 3,
    tile_size: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Self-noise of each arm: K forward + backward passes under one upstream gradient, and
    per gradient tensor the max abs / rel difference to the first pass (0 = deterministic).

    ``scene`` may be ``run:RUN_DIR``: each pass is then one step of the run's trainer on a
    fresh copy of its checkpoint (:func:`.replay.run_self_noise_on_run`), the loss included.

    Returns:
        dict with ``kind`` "self_noise", ``scene``, ``passes`` and ``arms`` (one entry per arm).
    """
    arm_list = [_arm(a) for a in ([arms] if isinstance(arms, (str, Arm)) else arms)]
    if not arm_list:
        raise ValueError("self-noise needs at least one arm")
    if is_run_spec(scene):
        from .replay import open_run, run_self_noise_on_run

        return run_self_noise_on_run(open_run(scene), arm_list, k, hook)
    sc = _load(scene, dtype)
    check_sh_degree(sh_degree)
    return self_noise_of_scene(sc, arm_list, k, sh_degree, tile_size, seed, hook)
