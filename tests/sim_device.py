"""A simulated accelerator for tests on a machine without a GPU: tensors that live "on"
``meta:N`` (N = the rank's local index) and compute on the CPU, with a GPU's rules for where
a tensor may go.

:class:`SimDevice` is a ``TorchDispatchMode``: inside it, every op that takes a tensor on
the simulated device, or is asked to make one (``device=meta:N``, ``.to(meta:N)``), runs on
hidden CPU tensors and returns :class:`SimTensor` wrappers reporting ``meta:N`` as their
device. What a GPU refuses is refused here too:

- an op mixing a simulated tensor with a CPU tensor of more than 0 dims (a CUDA op takes CPU
  scalars only; ``cat``/``stack`` not even those; indexing with CPU indices and ``copy_``
  between the devices are allowed, as on CUDA);
- a tensor on another index of the simulated device (``meta:0`` on rank 1);
- ``.numpy()`` of a simulated tensor.

Every copy to the host (``.cpu()``, ``.to("cpu")``, ``cpu_tensor.copy_(device_tensor)``)
and every host read (``.item()``, ``float()``, ``.tolist()``) is recorded with the stack of
tilesplat frames that made it (:attr:`SimDevice.host_copies`, :attr:`SimDevice.host_reads`),
so a test can say where a run copied tensors to the host. The autograd engine, Adam and
``torch.distributed`` see wrappers whose C++ device is ``meta`` (so the autograd engine runs
them on the calling thread, as CPU work); collectives must receive host tensors, which is
what ``tilesplat.distributed._on_the_wire`` gives gloo for tensors not on the CPU.
"""

from __future__ import annotations

import collections
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

SIM_TYPE = "meta"
# ops that take CPU index tensors beside device tensors, or copy between the devices
_MIXED_OK = ("index", "index_put", "_index_put_impl", "copy", "_to_copy", "lift_fresh")
_NO_SCALARS = ("cat", "stack")


def _site() -> tuple[str, ...]:
    """The tilesplat frames of the current stack, outermost first, as ``file.py:function``
    (files under src/tilesplat only)."""
    out = []
    for f in traceback.extract_stack()[:-2]:
        path = f.filename.replace("\\", "/")
        if "/tilesplat/" in path and "/tests/" not in path:
            out.append(f"{path.split('/tilesplat/')[-1]}:{f.name}")
    return tuple(out)


class SimTensor(torch.Tensor):
    """A tensor on the simulated device: a CPU tensor ``elem`` behind a wrapper reporting
    ``sim_device``. Only usable inside :class:`SimDevice`."""

    elem: torch.Tensor
    sim_device: torch.device

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> SimTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=SIM_TYPE,
            requires_grad=elem.requires_grad)
        r.elem = elem
        r.sim_device = device
        return r

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.sim_device

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a simulated-device tensor outside SimDevice: {func}")

    def tolist(self) -> Any:
        mode = SimDevice.active
        if mode is not None:
            mode.host_reads[_site()] += 1
        return self.elem.tolist()

    def new_tensor(self, data: Any, dtype: torch.dtype | None = None, device: Any = None,
                   requires_grad: bool = False) -> torch.Tensor:
        """As on a GPU: a tensor of ``data`` with self's dtype and device unless given (built
        on the CPU and moved; ``Tensor.new_tensor`` would build a real meta tensor, and the
        backward pass runs without the constructors' function mode)."""
        out = torch.tensor(data, dtype=dtype or self.dtype)
        out = out.to(self.sim_device if device is None else device)
        return out.requires_grad_(requires_grad)

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"can't convert {self.sim_device} device type tensor to numpy. Use "
                        "Tensor.cpu() to copy the tensor to host memory first.")

    def __repr__(self) -> str:
        return f"SimTensor({self.elem!r}, device={self.sim_device})"


_CONSTRUCTORS = (torch.tensor, torch.as_tensor, torch.asarray)


class _Constructors(TorchFunctionMode):
    """``torch.tensor(data, device=meta:N)`` and its kin build a real meta tensor without
    dispatching (no data): they are built on the CPU here and moved to the device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if func in _CONSTRUCTORS and device is not None and torch.device(device).type == SIM_TYPE:
            kwargs["device"] = "cpu"
            return func(*args, **kwargs).to(device)
        return func(*args, **kwargs)


class SimDevice(TorchDispatchMode):
    """The simulated device ``meta:index``; see the module docstring."""

    active: SimDevice | None = None

    def __init__(self, index: int) -> None:
        super().__init__()
        self.device = torch.device(SIM_TYPE, index)
        self.host_copies: collections.Counter = collections.Counter()
        self.host_reads: collections.Counter = collections.Counter()
        self._constructors = _Constructors()

    def __enter__(self) -> SimDevice:
        import torch.optim.optimizer as optimizer

        SimDevice.active = self
        # fused Adam takes the device as it takes CUDA (its kernel runs on the CPU tensors)
        self._fused = optimizer._get_fused_kernels_supported_devices
        optimizer._get_fused_kernels_supported_devices = lambda: [*self._fused(), SIM_TYPE]
        self._constructors.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        import torch.optim.optimizer as optimizer

        SimDevice.active = None
        super().__exit__(*exc)
        self._constructors.__exit__(*exc)
        optimizer._get_fused_kernels_supported_devices = self._fused

    def _target(self, device: Any) -> str | None:
        """'sim' / 'cpu' / None for a ``device=`` argument."""
        if device is None:
            return None
        d = torch.device(device)
        if d.type == SIM_TYPE:
            if d.index is not None and d.index != self.device.index:
                raise RuntimeError(f"a tensor asked for {d} on the rank of {self.device}")
            return "sim"
        return "cpu" if d.type == "cpu" else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = func.overloadpacket.__name__.rstrip("_")
        wrappers: dict[int, SimTensor] = {}
        plain: list[torch.Tensor] = []

        def unwrap(a):
            if isinstance(a, SimTensor):
                if a.sim_device != self.device:
                    raise RuntimeError(f"{func}: a tensor on {a.sim_device} on the rank of "
                                       f"{self.device}")
                wrappers[id(a.elem)] = a
                return a.elem
            if isinstance(a, torch.Tensor):
                if a.device.type == SIM_TYPE:
                    raise RuntimeError(f"{func}: a real meta tensor (a constructor this "
                                       "simulation does not cover)")
                plain.append(a)
            return a

        args, kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        on_sim = bool(wrappers)
        target = self._target(kwargs.get("device"))
        if target == "sim":
            kwargs["device"] = torch.device("cpu")
        if on_sim and plain and name not in _MIXED_OK:
            bad = [p for p in plain if p.dim() > 0 or name in _NO_SCALARS]
            if bad:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, {self.device} and cpu! ({func}, a CPU tensor of shape "
                    f"{tuple(bad[0].shape)})")
        if name == "_local_scalar_dense" and on_sim:
            self.host_reads[_site()] += 1
        if name == "_to_copy" and on_sim and target == "cpu":
            self.host_copies[_site()] += 1
            return func(*args, **kwargs)
        if name == "copy" and on_sim and id(args[0]) not in wrappers:
            self.host_copies[_site()] += 1  # a CPU destination filled from the device
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if not (on_sim or target == "sim"):
            return out

        def wrap(o):
            if isinstance(o, torch.Tensor) and not isinstance(o, SimTensor):
                known = wrappers.get(id(o))
                return known if known is not None else SimTensor(o, self.device)
            return o

        return tree_map(wrap, out)
