"""The exposure criterion of issue 40 on the judging captures, at the CI size: the room
(cameras around the object inside textured walls) and the outward ring (cameras looking out
at the walls), 18 training photos of 64x48 with per-photo gains x0.6-1.5 and offsets +-0.05,
6 clean test views, 300 steps on the cpu backend (tests/exposure_helpers.py).

With ``post_processing = "bilateral_grid"`` at its defaults (the rate and warm-up scaled to the
run, the grid's shape from the image size, the mean transform held at the identity) the test
views' cc PSNR recovers at least half of the gap between no compensation and the clean twin.
Measured (deterministic on cpu): room 26.51 -> 27.79 dB of 28.01 (0.85 of the gap), outward
30.79 -> 32.24 dB of 32.82 (0.71). gsplat's settings (16x16x8, 2e-3, 1,000 warm-up steps)
recovered 0.13 of it on the room at 128x96 and 1,000 steps (docs/training.md).
"""

from __future__ import annotations

import pytest

from exposure_helpers import CAPTURES, judge, share

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WIDTH, HEIGHT, STEPS = 64, 48, 300
GAP_SHARE = 0.5  # the issue's: at least half of the gap (measured 0.85 and 0.71)
GAP_DB = 1.0  # the exposure change must cost this much, or the share says nothing (1.5, 2.0)


@pytest.mark.parametrize("kind", CAPTURES)
def test_the_grid_recovers_half_the_gap_to_the_clean_twin(kind, tmp_path):
    result = judge(tmp_path, kind, WIDTH, HEIGHT, STEPS)
    assert result["clean"] - result["none"] >= GAP_DB, result
    assert share(result, "bilateral_grid") >= GAP_SHARE, result
