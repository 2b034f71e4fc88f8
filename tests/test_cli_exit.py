"""``cli/_exit.py``: the ``tilesplat`` process ends without the teardown of its modules, and
loses nothing doing so: the exit status of ``sys.exit``, the threads that are not daemons
joined, the ``atexit`` callbacks run, the buffered standard streams written; under a profiler
the usual exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tilesplat.cli._exit import status_of

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from tilesplat.cli._exit import exit_now

    out = Path(sys.argv[1])
    def late():
        time.sleep(0.3)
        (out / "thread").write_text("done")
    threading.Thread(target=late).start()  # not a daemon: joined before the exit
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    if sys.argv[3] == "profiled":
        sys.setprofile(lambda *a: None)
    sys.stdout.write("no newline, still buffered")
    sys.stderr.write("and stderr")
    exit_now(eval(sys.argv[2]))
""")


@pytest.mark.parametrize("code, status", [("None", 0), ("0", 0), ("3", 3), ("'a message'", 1)])
@pytest.mark.parametrize("mode", ["plain", "profiled"])
def test_exit_now_loses_nothing(tmp_path, code, status, mode):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), code, mode],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert proc.stderr.startswith("and stderr")
    if code == "'a message'":
        assert "a message" in proc.stderr
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"


def test_status_of_is_sys_exits(capsys):
    assert [status_of(c) for c in (None, 0, 2, 130)] == [0, 0, 2, 130]
    assert status_of("bad") == 1
    assert capsys.readouterr().err == "bad\n"


@pytest.mark.parametrize("args, status", [(["--help"], 0), ([], 2),
                                          (["train", "--set", "no_such_key=1"], 2)])
def test_the_program_keeps_its_exit_status(args, status):
    proc = subprocess.run([sys.executable, "-m", "tilesplat.cli", *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == status, proc.stderr
    if status == 0:
        assert proc.stdout.startswith("usage: tilesplat")
    else:
        assert "error" in proc.stderr
