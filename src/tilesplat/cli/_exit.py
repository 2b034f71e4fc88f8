"""The end of the ``tilesplat`` process, without the interpreter's teardown of its modules.

When a command has returned, the interpreter still tears down every module it imported; with
torch that takes ~0.4 s (0.6 s after a training run), the same for every command, a twentieth of
a short training run. :func:`exit_now` ends the process as the interpreter would, less that
teardown: the threads that are not daemons joined (``threading``'s own shutdown, which first
tells the executors' idle workers to stop), the ``atexit`` callbacks run (``weakref.finalize``,
``logging``, a profiler's or coverage's hooks), the standard streams flushed, then ``os._exit``.
What the commands write is closed by then (``io/atomic.py`` renames complete files).

Under a profiler or a tracer (``python -m cProfile``, a debugger), whose report is written after
the program returns, the process exits the usual way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def status_of(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives: 0 for None, an int as it is, else 1 (the
    value printed to stderr, as the interpreter prints it)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_now(code: object) -> NoReturn:
    """End the process with ``code`` (as ``sys.exit`` takes it), without the module teardown."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None or sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    status = status_of(code)
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None
            pass
    os._exit(status)
