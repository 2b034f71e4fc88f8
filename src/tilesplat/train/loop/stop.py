"""Ctrl-C during training: a flag the loop reads between steps, so that a checkpoint is whole."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopRequest:
    """Turns Ctrl-C into ``requested`` (a second Ctrl-C stops at once); a context manager that
    installs its handler on the main thread and restores the previous one."""

    def __init__(self) -> None:
        self.requested = False
        self.installed = False
        self.previous: Any = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            # None means a handler not set from Python; the default is the closest.
            previous = self.previous if self.previous is not None else signal.default_int_handler
            signal.signal(signal.SIGINT, previous)
