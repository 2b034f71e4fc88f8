"""The tilesplat command asks for huge pages for torch's CPU allocations
(THP_MEM_ALLOC_ENABLE=1) before torch loads (issue 14); a library user's process, or a value
the user chose, is left alone."""

import os
import subprocess
import sys

PRINT = "import os, tilesplat, torch; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))\n"


def _run(script_name: str, tmp_path, **env) -> str:
    script = tmp_path / script_name
    script.write_text(PRINT)
    base = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env={**base, **env}, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_command_gets_huge_pages(tmp_path):
    assert _run("tilesplat", tmp_path) == "1"
    assert _run("tilesplat", tmp_path, THP_MEM_ALLOC_ENABLE="0") == "0"
    assert _run("user_script.py", tmp_path) == "None"
