"""``tilesplat bench``: timing, parity and self-noise of backends, measured in one run.

Python entry points (each returns a JSON-ready dict; :mod:`.report` formats it as text):

- :func:`run_bench` — every arm (``backend[:scheme][@device]``) timed per stage and per
  training step, interleaved, with pair evaluations per second against this machine's ceiling
  (:func:`calibrate`), peak memory and a parity gate against the first arm;
- :func:`run_parity` — every output and gradient of two arms, PASS/FAIL per tensor;
- :func:`run_self_noise` — K passes of each arm against the first (0 = deterministic).

Kernels (the calibration micro-kernel and the pair counter) compile on first use, never on
import.
"""

from .arms import Arm, parse_arm, parse_arms
from .ceiling import calibrate
from .dispatch import run_parity, run_self_noise
from .report import format_bench, format_parity, format_self_noise, machine_info, write_json
from .runner import SCHEMA, run_bench

__all__ = [
    "SCHEMA",
    "Arm",
    "calibrate",
    "format_bench",
    "format_parity",
    "format_self_noise",
    "machine_info",
    "parse_arm",
    "parse_arms",
    "run_bench",
    "run_parity",
    "run_self_noise",
    "write_json",
]
