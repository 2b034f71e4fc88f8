"""NaN/Inf checks that do not wait for the device: a flag, read one step late.

A public op called directly checks its float inputs for NaN and Inf at once, which costs one
host read (on a GPU, the host waits for the stream to reach the check). The trainer's step
cannot afford that read: inside :func:`deferred_finite_checks` the same checks record a
device flag instead (:class:`FiniteFlag`), the step hands the flag to fused Adam as
``found_inf`` (so a bad step leaves the parameters and the moments as they were, on the
device), and the trainer reads the flag after the next step is queued, through a host copy
made without waiting (:meth:`FiniteFlag.start_read` -> :class:`FlagRead`).

Each tensor is checked by its smallest and largest values (``torch.aminmax``, which
propagates NaN): both are finite exactly when every value is, in one pass in the tensor's
own dtype, with no sum to overflow. A step on the CPU (``FiniteFlag(reads_free=True)``,
where a host read costs nothing) checks the sums first, a third of that time: finite sums
settle it, and only a sum that is not takes the extremes (``ops.validation.
_finite_extremes``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

_FLAG: contextvars.ContextVar[FiniteFlag | None] = contextvars.ContextVar(
    "tilesplat_deferred_finite", default=None
)


class FiniteFlag:
    """The finite checks of one training step, recorded on the device.

    Each check adds the names of its tensors and a [k x m] bool tensor (whether each one's
    values are all finite); :meth:`found_inf` is a 0-dim float32 tensor, 1.0 when any
    check failed, on the device of the checks, as fused Adam's ``found_inf`` takes it.
    """

    def __init__(self, reads_free: bool = False) -> None:
        self.reads_free = reads_free  # the checks may read values back (a step on the CPU)
        self._names: list[tuple[str, ...]] = []
        self._finite: list[Tensor] = []
        self._found: Tensor | None = None
        self._read: FlagRead | None = None

    def record(self, names: tuple[str, ...], finite: Tensor) -> None:
        """Add one check: ``finite`` [len(names) x m] bool, m consecutive results for each
        name (a name is bad when any of its m is false)."""
        per_name = finite.numel() // max(len(names), 1)
        names = tuple(name for name in names for _ in range(per_name))
        self._names.append(names)
        self._finite.append(finite)
        self._found = None

    def found_inf(self, device: torch.device) -> Tensor:
        """0-dim float32 on ``device``: 1.0 when a recorded check failed (no host read)."""
        if self._found is None:
            if self._finite:
                ok = torch.cat([f.to(device) for f in self._finite]).all()
                self._found = (~ok).to(torch.float32)
            else:
                self._found = torch.zeros((), dtype=torch.float32, device=device)
        return self._found

    def start_read(self) -> FlagRead:
        """Start copying the flag and every check's result to the host without waiting (on a
        GPU: into pinned memory, with an event to wait for later). The copy is this
        moment's: a CUDA graph that replays the checks later does not change it."""
        self._read = FlagRead(self)
        return self._read

    def bad_names(self) -> list[str]:
        """The names of the tensors that held NaN or Inf (empty when none did), from the
        read :meth:`start_read` started (started here when none was)."""
        read = getattr(self, "_read", None)
        return (read if read is not None else self.start_read()).bad_names()


class FlagRead:
    """A host copy of a :class:`FiniteFlag`'s results, taken without waiting."""

    def __init__(self, flag: FiniteFlag) -> None:
        self.names = list(flag._names)
        self._host: Tensor | None = None
        self._event: object | None = None
        if not flag._finite:
            return
        device = flag._finite[0].device
        found = flag.found_inf(device)
        values = torch.cat([found.reshape(1)] + [f.to(device).to(torch.float32)
                                                 for f in flag._finite])
        if values.device.type == "cuda":
            self._host = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._event = event
        else:  # the CPU's own tensor; another device's (not CUDA) copied now
            self._host = values.clone() if values.device.type == "cpu" else values.to("cpu")

    def bad_names(self) -> list[str]:
        """The names of the tensors that held NaN or Inf (empty when none did). Waits for
        the copy (by then, a step old) and reads it through NumPy (no device op)."""
        if self._host is None:
            return []
        if self._event is not None:
            self._event.synchronize()  # type: ignore[attr-defined]
        values = self._host.detach().numpy()
        if float(values[0]) == 0.0:
            return []
        flat = [name for names in self.names for name in names]
        bad = [n for n, ok in zip(flat, values[1:].tolist(), strict=True) if not ok]
        return list(dict.fromkeys(bad))  # each name once, in order


@contextlib.contextmanager
def deferred_finite_checks(flag: FiniteFlag) -> Iterator[FiniteFlag]:
    """Inside, every op's NaN/Inf check records into ``flag`` instead of reading its
    result (see the module docstring)."""
    token = _FLAG.set(flag)
    try:
        yield flag
    finally:
        _FLAG.reset(token)


def current_flag() -> FiniteFlag | None:
    """The flag of the enclosing :func:`deferred_finite_checks`, or None."""
    return _FLAG.get()
