"""The scene name ``run:RUN_DIR``: a training run (a run folder or one checkpoint file) that
the bench replays with the trainer's own step (:mod:`.replay`).

Only the name is parsed here, importing nothing: :mod:`.dispatch` decides by it where a scene
goes (and imports :mod:`.replay` only for runs), and :mod:`.replay` reads the path from it
without importing the dispatcher back.
"""

from __future__ import annotations

RUN_PREFIX = "run:"


def is_run_spec(scene: object) -> bool:
    """Whether ``scene`` names a training run (``run:RUN_DIR``)."""
    return isinstance(scene, str) and scene.startswith(RUN_PREFIX)


def run_target(spec: str) -> str:
    """The run folder or checkpoint file of ``run:RUN_DIR`` (``spec`` itself without the
    prefix).

    Raises:
        ValueError: nothing after the prefix.
    """
    target = spec[len(RUN_PREFIX):] if is_run_spec(spec) else spec
    if not target:
        raise ValueError("--scene run: needs a run folder or a checkpoint file (run:RUN_DIR)")
    return target
