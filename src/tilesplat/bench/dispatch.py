"""Where a scene goes: a ``run:RUN_DIR`` scene to the replay of the run (:mod:`.replay`, the
trainer's own step on its checkpoint), any other scene to the staged passes (:mod:`.parity`;
for the bench, :mod:`.workload`). Parity and self-noise are routed here; the bench asks
:func:`open_workload` for what it times.

This is the only place that asks which kind a scene is (:func:`.run_spec.is_run_spec`), and
:mod:`.replay` is imported only for runs: other scenes never import the trainer and its image
I/O (Pillow, which a bare GPU machine's python3 may lack: ``scripts/gpu_check.py`` needs only
torch and numba).
"""

from __future__ import annotations

from typing import Any

import torch

from ..constants import TILE_SIZE
from ..data.scenes import Scene
from .arms import Arm, check_usable, parse_arm
from .parity import Hook, check_sh_degree, parity_of_scene, self_noise_of_scene
from .run_spec import is_run_spec
from .tolerance import ATOL, RTOL
from .workload import SceneWorkload, Workload


def _arm(spec: Arm | str) -> Arm:
    arm = spec if isinstance(spec, Arm) else parse_arm(spec)
    check_usable(arm)
    return arm


def open_workload(scene: Scene | str) -> Workload:
    """What :func:`.runner.run_bench` times on ``scene``: a run's replay for ``run:RUN_DIR``
    (opened here: a missing run fails before anything else is checked), else the scene itself
    (loaded later, by :meth:`~.workload.Workload.load`).

    Raises:
        FileNotFoundError, ValueError: a run that cannot be opened (:func:`.replay.open_run`).
    """
    if is_run_spec(scene):
        from .replay import RunWorkload, open_run

        return RunWorkload(open_run(scene))
    return SceneWorkload(scene)


def run_parity(
    scene: Scene | str,
    arm_a: Arm | str,
    arm_b: Arm | str,
    sh_degree: int = 3,
    tile_size: int = TILE_SIZE,
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
    sc = SceneWorkload(scene).load(dtype)
    check_sh_degree(sh_degree)
    a, b = _arm(arm_a), _arm(arm_b)
    return parity_of_scene(sc, a, b, sh_degree, tile_size, seed, atol, rtol, hook)


def run_self_noise(
    scene: Scene | str,
    arms: list[Arm | str] | Arm | str,
    k: int = 3,
    sh_degree: int = 3,
    tile_size: int = TILE_SIZE,
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
    sc = SceneWorkload(scene).load(dtype)
    check_sh_degree(sh_degree)
    return self_noise_of_scene(sc, arm_list, k, sh_degree, tile_size, seed, hook)
