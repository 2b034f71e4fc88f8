"""The tilesplat command sets OMP_WAIT_POLICY=PASSIVE and THP_MEM_ALLOC_ENABLE=1 (huge pages for
torch's CPU allocations) before torch loads (issue 14); a library user's process, or a value
the user chose, is left alone."""

import os
import subprocess
import sys

import pytest

from tilesplat.command_env import is_tilesplat_command

PRINT = "import os, tilesplat, torch; print(os.environ.get({!r}))\n"


@pytest.mark.parametrize(
    "argv,want",
    [
        (["/venv/bin/python", "/venv/bin/tilesplat", "train"], True),
        (["python", "-u", "-X", "importtime", "-m", "tilesplat.cli", "bench"], True),
        (["python", "-m", "pytest", "tests"], False),
        (["python", "train.py", "tilesplat"], False),
        (["python", "-c", "import tilesplat"], False),
        (["python"], False),
    ],
)
def test_is_tilesplat_command(argv, want):
    assert is_tilesplat_command(argv) is want


def _run(script_name: str, tmp_path, variable: str, **env) -> str:
    """What ``variable`` is after ``import tilesplat, torch`` in a script named script_name,
    run with the environment less the variable, plus env."""
    script = tmp_path / script_name
    script.write_text(PRINT.format(variable))
    base = {k: v for k, v in os.environ.items() if k != variable}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env={**base, **env}, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_command_gets_passive_policy(tmp_path):
    var = "OMP_WAIT_POLICY"
    assert _run("tilesplat", tmp_path, var) == "PASSIVE"
    assert _run("tilesplat", tmp_path, var, OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert _run("user_script.py", tmp_path, var) == "None"


def test_command_gets_huge_pages(tmp_path):
    var = "THP_MEM_ALLOC_ENABLE"
    assert _run("tilesplat", tmp_path, var) == "1"
    assert _run("tilesplat", tmp_path, var, THP_MEM_ALLOC_ENABLE="0") == "0"
    assert _run("user_script.py", tmp_path, var) == "None"
