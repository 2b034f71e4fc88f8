"""scripts/scale_splats.py (issue 36) at a small size: every format written and read (in this
process, for speed: --in-process), the round trips within each format's quantisation, and a
well-formed report; one format through the child processes the script uses at scale.
Timings and memory are reported, never asserted."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "scale_splats.py"
# the largest error each format may leave, per key, for the script's random model (None: the
# format drops the key); lossless formats must give the values back exactly
LOSSLESS = {"means": 0.0, "scales": 0.0, "quats": 1e-6, "opacities": 1e-5, "sh0": 0.0,
            "shN": 0.0}  # fmt: skip
TOLERANCE = {
    "ply": LOSSLESS,
    "gsplat-ckpt": LOSSLESS,
    "glb": LOSSLESS,
    "splat": {"means": 0.0, "scales": 1e-6, "quats": 0.01, "opacities": 0.1, "sh0": 0.01,
              "shN": None},  # fmt: skip
    "compressed-ply": {"means": 0.02, "scales": 0.01, "quats": 0.01, "opacities": 0.1,
                       "sh0": 0.01, "shN": 0.02},  # fmt: skip
    "spz": {"means": 0.001, "scales": 0.04, "quats": 0.01, "opacities": 0.1, "sh0": 0.02,
            "shN": 0.07},  # fmt: skip
    # SOG: the means to 16 bits of a log range, 256-entry codebooks, an SH palette
    "sog": {"means": 0.01, "scales": 0.05, "quats": 0.01, "opacities": 0.1, "sh0": 0.05,
            "shN": 0.6},  # fmt: skip
}


def _script():
    spec = importlib.util.spec_from_file_location("scale_splats", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("scale")
    script = _script()
    assert script.main(["--gaussians", "3000", "--out", str(out / "files"), "--in-process",
                        "--json", str(out / "report.json")]) == 0  # fmt: skip
    return json.loads((out / "report.json").read_text())


def test_report_is_well_formed(report: dict) -> None:
    script = _script()
    assert report["gaussians"] == 3000 and report["sh_degree"] == 3
    assert report["model_bytes"] == 3000 * (3 + 3 + 4 + 1 + 3 + 45) * 4
    assert list(report["formats"]) == list(script.FORMATS)
    for fmt, row in report["formats"].items():
        assert row["write"]["bytes"] > 0, fmt
        for action in ("write", "read"):
            for key in ("seconds", "cpu_seconds", "baseline", "peak"):
                value = row[action][key]
                assert isinstance(value, (int, float)) and math.isfinite(value), (fmt, key)
                assert value >= 0, (fmt, action, key)
    table = script.table(report)
    assert table.count("\n| ") == 1 + len(script.FORMATS)  # header row + one per format


@pytest.mark.parametrize("fmt", list(TOLERANCE))
def test_round_trip(report: dict, fmt: str) -> None:
    errors = report["formats"][fmt]["read"]["max_err"]
    for key, limit in TOLERANCE[fmt].items():
        if limit is None:
            assert errors[key] is None, (fmt, key)
        else:
            assert errors[key] is not None and errors[key] <= limit, (fmt, key, errors[key])


def test_child_process_reports(tmp_path: Path) -> None:
    script = _script()
    assert script.main(["--gaussians", "500", "--formats", "splat", "--out", str(tmp_path),
                        "--json", str(tmp_path / "r.json")]) == 0  # fmt: skip
    row = json.loads((tmp_path / "r.json").read_text())["formats"]["splat"]
    assert row["read"]["max_err"]["means"] == 0.0 and row["read"]["max_err"]["shN"] is None
    assert row["write"]["peak"] >= 0 and row["read"]["baseline"] > 0


def test_model_cells_are_distinct() -> None:
    """The round trip matches rows by grid cell: every Gaussian has its own."""
    script = _script()
    m = script.make_model(5000, seed=3)["means"]
    cells = {tuple(c) for c in ((m + script.BOX) // script.CELL).astype(int).tolist()}
    assert len(cells) == 5000
    assert all(v.dtype.name == "float32" for v in script.make_model(10).values())
