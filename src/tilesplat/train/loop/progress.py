"""A one-line progress display: steps/s, loss, PSNR, Gaussian count and time left.

On a terminal the line is redrawn in place (at most 5 times a second); otherwise (a log file,
CI) a full line is printed every tenth of the run and at least every 30 seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from torch import Tensor

# A shown number: a 0-dim tensor (read back only when the line is drawn) or a function
# giving the number (called only then).
Value = float | int | Tensor | Callable[[], float]


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Shows ``step/total`` with named numbers; call :meth:`update` after every step
    (``unit``: what is counted, ``steps`` or e.g. ``frames``)."""

    def __init__(
        self, total: int, initial: int = 0, enabled: bool = True, stream: TextIO | None = None,
        unit: str = "steps",
    ) -> None:
        self.total = total
        self.unit = unit
        self.start_step = initial
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.last_draw = self.t0
        self.every = max(1, (total - initial) // 10)
        self.width = 0

    def update(self, step: int, **values: Value) -> None:
        """``step`` steps are done; ``values`` (e.g. loss, psnr, gaussians) are shown.

        A tensor or function value is read only when the line is drawn, so that a training
        step on a GPU does not wait for its numbers every time."""
        if not self.enabled:
            return
        now = time.perf_counter()
        done = step - self.start_step
        last = step >= self.total
        if self.tty:
            if not last and now - self.last_draw < 0.2:
                return
        elif not last and done % self.every != 0 and now - self.last_draw < 30.0:
            return
        self.last_draw = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else 0.0
        parts = [f"{step}/{self.total}", f"{rate:.2f} {self.unit}/s"]
        for key, value in values.items():
            v = value() if callable(value) else value
            v = float(v) if isinstance(v, Tensor) else v
            parts.append(f"{key} {v:d}" if isinstance(v, int) else f"{key} {v:.4g}")
        parts.append(f"{_clock(now - self.t0)}<{_clock(eta)}")
        line = "  ".join(parts)
        if self.tty:
            pad = " " * max(0, self.width - len(line))
            self.stream.write("\r" + line + pad)
            self.width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the line on a terminal."""
        if self.enabled and self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0
