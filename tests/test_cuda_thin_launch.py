"""The thin launch path (``backends/cuda/thin_launch.py``) with CUDA replaced by a recorder:
no GPU, no driver. A fake ``cuLaunchKernel`` decodes the parameters the way the driver copies
them (one pointer per parameter, its size from the kernel's image: here from this file's own
reading of numba's ABI, which ``test_cuda_launch_abi.py`` checks against the PTX), and every
context call raises. Each catalogue kernel launched through ``runtime.launch`` makes exactly
one driver call, with the grid, block, stream, pointers, shapes, strides and scalars of its
arguments, compiles once per signature, and falls back to ``kernel[...]`` (one log line)
when the layout check fails."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import struct
import types

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("tests the hardware launch path", allow_module_level=True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402
from numba.core import types as nt  # noqa: E402

from tilesplat.backends.cuda import kernels, runtime, thin_launch  # noqa: E402

SUCCESS, INVALID_CONTEXT = 0, 201


class FakeTensor(torch.Tensor):
    """A CPU tensor that says it lives on GPU ``DEVICE`` (what the packer reads: data_ptr,
    shape, strides, numel, dtype, get_device)."""

    DEVICE = 0
    __torch_function__ = torch._C._disabled_torch_function_impl

    def get_device(self) -> int:
        return self.DEVICE


class OnGPU1(FakeTensor):
    DEVICE = 1


def _param_sizes(argtypes) -> list[tuple[str, int]]:
    """(struct code, bytes) of each flattened parameter, as numba's _prepare_args passes
    them: written here again, apart from ptx_abi, so that the decoding checks the packer."""
    out = []
    for ty in argtypes:
        if isinstance(ty, nt.Array):
            out += [("Q", 8)] * (5 + 2 * ty.ndim)
        else:
            out.append({nt.int64: ("q", 8), nt.int32: ("i", 4), nt.float64: ("d", 8),
                        nt.float32: ("f", 4), nt.boolean: ("?", 1)}[ty])
    return out


class FakeDriver:
    """cuda.bindings.driver's launch API, recording; any other call (cuCtx*) raises."""

    CUresult = types.SimpleNamespace(CUDA_SUCCESS=SUCCESS,
                                     CUDA_ERROR_INVALID_CONTEXT=INVALID_CONTEXT)

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.results: list[int] = []  # results to return before SUCCESS
        self.context_calls: list[tuple] = []
        self.allow_set_current = False

    def CUstream(self, raw):  # noqa: N802 - the driver's name
        return ("stream", raw)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):  # noqa: N802
        sizes = f.sizes
        pointers = (ctypes.c_void_p * len(sizes)).from_address(params)
        values = [struct.unpack("<" + code, ctypes.string_at(pointers[i], size))[0]
                  for i, (code, size) in enumerate(sizes)]
        self.calls.append({"function": f, "grid": (gx, gy, gz), "block": (bx, by, bz),
                           "shmem": shmem, "stream": stream, "values": values,
                           "extra": extra})
        return (self.results.pop(0) if self.results else SUCCESS,)

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        self.context_calls.append(("cuCtxSetCurrent", ctx))
        if not self.allow_set_current:
            raise AssertionError("a context call in the launch path")
        return (SUCCESS,)

    def __getattr__(self, name):
        raise AssertionError(f"the thin path called the driver's {name}")


class FakeFunction:
    def __init__(self, name: str, argtypes) -> None:
        self.name, self.sizes = name, _param_sizes(argtypes)


def _fake_ptx(argtypes) -> str:
    kinds = {"Q": "u64", "q": "u64", "i": "u32", "d": "f64", "f": "f32", "?": "u8"}
    decls = ",\n".join(f"\t.param .{kinds[c]} k_param_{i}"
                       for i, (c, _) in enumerate(_param_sizes(argtypes)))
    return f".visible .entry k(\n{decls}\n)\n{{\n\tret;\n}}\n"


class Recorder:
    """The Backend: a fake driver, device 0 current, stream 777 (+ index), a fake compile."""

    def __init__(self) -> None:
        self.driver = FakeDriver()
        self.compiled: list[tuple] = []
        self.guards: list[int] = []
        self.ptx_of = _fake_ptx

    def compile(self, kernel, argtypes, index):
        self.compiled.append((kernel, argtypes, index))
        return thin_launch.Compiled(FakeFunction(kernel.py_func.__name__, argtypes),
                                    self.ptx_of(argtypes), context=("ctx", index),
                                    param_info=self.param_info(argtypes))

    @staticmethod
    def param_info(argtypes):
        """cuKernelGetParamInfo as a driver reports it: offsets at natural alignment."""
        layout, at = [], 0
        for _, size in _param_sizes(argtypes):
            at = (at + size - 1) // size * size
            layout.append((at, size))
            at += size
        return lambda i: layout[i] if i < len(layout) else None

    def guard(self, index):
        self.guards.append(index)
        return _NoGuard()

    def backend(self) -> thin_launch.Backend:
        return thin_launch.Backend(self.driver, lambda: 0, lambda i: 777 + i, self.compile,
                                   self.guard)


class _NoGuard:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class NoContext:
    """Stands for numba.cuda in runtime: any use (cuda.gpus[i], external_stream) raises."""

    def __getattr__(self, name):
        raise AssertionError(f"numba's cuda.{name} used on the thin path")


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(runtime, "cuda", NoContext())

    def no_context(device):
        raise AssertionError("runtime.device_context entered on the thin path")

    monkeypatch.setattr(runtime, "device_context", no_context)
    monkeypatch.setattr(torch.cuda, "current_stream", no_context)
    thin_launch.set_enabled(True)
    with thin_launch.installed(r.backend()):
        yield r
    thin_launch.set_enabled(None)


def _args_for(argtypes, rng, cls=FakeTensor):
    """Arguments of ``argtypes``: tensors of random small shapes, Python scalars."""
    dtypes = {nt.float32: torch.float32, nt.float64: torch.float64, nt.int32: torch.int32,
              nt.int64: torch.int64, nt.boolean: torch.bool}
    out = []
    for ty in argtypes:
        if isinstance(ty, nt.Array):
            shape = tuple(int(s) for s in rng.integers(1, 5, size=ty.ndim))
            out.append(torch.zeros(shape, dtype=dtypes[ty.dtype]).as_subclass(cls))
        elif ty == nt.boolean:
            out.append(bool(rng.integers(0, 2)))
        elif ty == nt.int64:
            out.append(int(rng.integers(-(2**40), 2**40)))
        elif ty == nt.float64:
            out.append(float(rng.normal()))
        else:
            raise AssertionError(f"a catalogue type this test does not build: {ty}")
    return out


def _expected(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            size = a.element_size()
            out += [0, 0, a.numel(), size, a.data_ptr(), *a.shape,
                    *(s * size for s in a.stride())]
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("spec", kernels.KERNELS, ids=lambda s: s.name)
def test_every_catalogue_kernel_is_one_driver_call(rec, spec):
    rng = np.random.default_rng(len(spec.name))
    for ft in spec.float_types:
        F = nt.float32 if ft is np.float32 else nt.float64
        kernel = cuda.jit(spec.body(ft))
        device = torch.device("cuda", 0)
        runtime.reset_launch_stats()
        launches = [((3, 2, 1), (16, 16)), (5, 256), ((7, 1), 32)]
        for grid, block in launches:
            args = _args_for(spec.args(F), rng)  # new tensors and scalars every launch
            before = len(rec.driver.calls)
            runtime.launch(kernel, grid, block, device, *args)
            assert len(rec.driver.calls) == before + 1, "one driver call per launch"
            call = rec.driver.calls[-1]
            g = (*grid, 1, 1)[:3] if isinstance(grid, tuple) else (grid, 1, 1)
            b = (*block, 1, 1)[:3] if isinstance(block, tuple) else (block, 1, 1)
            assert (call["grid"], call["block"], call["shmem"]) == (g, b, 0)
            assert call["stream"] == ("stream", 777) and call["extra"] == 0
            assert call["values"] == _expected(args), "decoded pointers, shapes, scalars"
        # compiled once, for exactly the catalogue's signature, on device 0
        mine = [c for c in rec.compiled if c[0] is kernel]
        assert [(c[1], c[2]) for c in mine] == [(tuple(spec.args(F)), 0)]
        assert runtime.launch_stats()["launches"] == len(launches)
    assert rec.driver.context_calls == [] and rec.guards == []


def _numba_values(argtypes, args) -> list:
    """What numba-cuda's own ``_Kernel._prepare_args`` passes for ``args`` (called unbound,
    on numba device arrays over the tensors' pointers), as plain numbers."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.dispatcher import _Kernel

    class Memory:
        def __init__(self, ptr):
            self.device_ctypes_pointer = ctypes.c_void_p(ptr)

    stub = types.SimpleNamespace(extensions=[])
    kernelargs: list = []
    for ty, a in zip(argtypes, args, strict=True):
        if isinstance(a, torch.Tensor):
            size = a.element_size()
            a = DeviceNDArray(tuple(a.shape), tuple(s * size for s in a.stride()),
                              np.dtype(str(a.dtype).removeprefix("torch.")),
                              gpu_data=Memory(a.data_ptr()))
        _Kernel._prepare_args(stub, ty, a, 0, [], kernelargs)
    return [v.value if isinstance(v, ctypes._SimpleCData) else v for v in kernelargs]


@pytest.mark.parametrize("spec", kernels.KERNELS, ids=lambda s: s.name)
def test_the_packer_writes_what_numba_passes(rec, spec):
    """Parity with numba's own argument preparation, value by value, for every kernel."""
    rng = np.random.default_rng(7)
    for ft in spec.float_types:
        F = nt.float32 if ft is np.float32 else nt.float64
        args = _args_for(spec.args(F), rng)
        runtime.launch(cuda.jit(spec.body(ft)), 2, 32, torch.device("cuda", 0), *args)
        assert rec.driver.calls[-1]["values"] == _numba_values(spec.args(F), args)


def _small_kernel():
    def fill(out, n, value, flag):
        i = cuda.grid(1)
        if flag and i < n:
            out[i] = value

    return cuda.jit(fill)


def test_types_devices_and_layouts_select_plans(rec):
    kernel = _small_kernel()
    dev0 = torch.device("cuda", 0)
    out = torch.zeros(8).as_subclass(FakeTensor)
    runtime.launch(kernel, 1, 8, dev0, out, 8, 1.5, True)
    runtime.launch(kernel, 1, 8, dev0, out, 8, 2.5, False)
    assert len(rec.compiled) == 1 and len(rec.driver.calls) == 2
    assert rec.driver.calls[1]["values"][-3:] == [8, 2.5, False]
    # another dtype, a non-contiguous tensor, a numpy float32 scalar: new signatures
    runtime.launch(kernel, 1, 8, dev0, torch.zeros(8, dtype=torch.float64)
                   .as_subclass(FakeTensor), 8, 1.5, True)
    strided = torch.zeros(16)[::2].as_subclass(FakeTensor)
    runtime.launch(kernel, 1, 8, dev0, strided, 8, 1.5, True)
    assert rec.driver.calls[-1]["values"][6] == 8, "strides in bytes, as they are"
    runtime.launch(kernel, 1, 8, dev0, out, 8, np.float32(0.25), True)
    sigs = [c[1] for c in rec.compiled]
    assert sigs[1][0] == nt.Array(nt.float64, 1, "C")
    assert sigs[2][0] == nt.Array(nt.float32, 1, "A")
    assert sigs[3][2] == nt.float32 and rec.driver.calls[-1]["values"][-2] == 0.25
    assert len(rec.driver.calls) == 5
    # GPU 1's tensors on cuda:1 while device 0 is current: a plan for GPU 1, under a guard
    runtime.launch(kernel, 2, 4, torch.device("cuda", 1),
                   torch.zeros(8).as_subclass(OnGPU1), 8, 1.0, True)
    assert rec.compiled[-1][2] == 1 and rec.guards == [1]
    assert rec.driver.calls[-1]["stream"] == ("stream", 778)
    assert rec.driver.context_calls == []


def test_arguments_that_do_not_fit_go_to_numba(rec, monkeypatch):
    """A CPU tensor (or one of another GPU), an int beyond int64, an unknown type: that
    launch is numba's kernel[...], as before; nothing compiled for it."""
    kernel = _small_kernel()
    seen = []

    class Recording(type(kernel)):
        def __getitem__(self, config):
            return lambda *argv: seen.append((config, argv))

    kernel.__class__ = Recording
    monkeypatch.setattr(runtime, "device_context", lambda device: _NoGuard())
    monkeypatch.setattr(runtime, "view", lambda t: ("view", t.data_ptr()))
    monkeypatch.setattr(runtime, "stream", lambda device: "numba-stream")
    dev0 = torch.device("cuda", 0)
    cpu = torch.zeros(8)
    runtime.launch(kernel, 1, 8, dev0, cpu, 8, 1.0, True)
    runtime.launch(kernel, 1, 8, dev0, torch.zeros(8).as_subclass(OnGPU1), 8, 1.0, True)
    runtime.launch(kernel, 1, 8, dev0, torch.zeros(8).as_subclass(FakeTensor), 8, "x", True)
    assert rec.compiled == [] and rec.driver.calls == [] and len(seen) == 3
    out = torch.zeros(8).as_subclass(FakeTensor)
    runtime.launch(kernel, 1, 8, dev0, out, 8, 1.0, True)  # a plan now
    runtime.launch(kernel, 1, 8, dev0, out, 2**64, 1.0, True)  # beyond int64
    assert len(rec.driver.calls) == 1 and len(seen) == 4
    assert seen[-1][0] == (1, 8, "numba-stream")


def test_a_layout_difference_keeps_numba_with_one_log_line(rec, monkeypatch, caplog):
    kernel = _small_kernel()
    seen = []

    class Recording(type(kernel)):
        def __getitem__(self, config):
            return lambda *argv: seen.append(argv)

    kernel.__class__ = Recording
    monkeypatch.setattr(runtime, "device_context", lambda device: _NoGuard())
    monkeypatch.setattr(runtime, "view", lambda t: "view")
    monkeypatch.setattr(runtime, "stream", lambda device: 0)
    # the kernel's PTX, with its boolean declared 4 bytes wide
    rec.ptx_of = lambda argtypes: _fake_ptx(argtypes).replace(".u8", ".u32")
    out = torch.zeros(8).as_subclass(FakeTensor)
    with caplog.at_level(logging.WARNING, logger=thin_launch.__name__):
        for _ in range(3):
            runtime.launch(kernel, 1, 8, torch.device("cuda", 0), out, 8, 1.0, True)
    assert len(seen) == 3 and rec.driver.calls == [] and len(rec.compiled) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "keeps numba's kernel[...] launch" in lines[0]
    assert "parameter 9 (argument 3 value)" in lines[0] and ".u32" in lines[0]
    assert "fill" in lines[0]
    assert isinstance(thin_launch.plans_of(kernel), str)


def test_the_real_ptx_passes_the_startup_check(rec):
    """The check a device runs before a kernel's first launch, on the PTX numba makes."""
    spec = next(s for s in kernels.KERNELS if s.name == "isect_offset_encode")
    rec.ptx_of = lambda argtypes: cuda.compile_ptx(spec.body(np.float32), argtypes,
                                                   cc=(9, 0))[0]
    kernel = cuda.jit(spec.body(np.float32))
    args = _args_for(spec.args(nt.float32), np.random.default_rng(0))
    runtime.launch(kernel, 4, 256, torch.device("cuda", 0), *args)
    assert len(rec.driver.calls) == 1 and isinstance(thin_launch.plans_of(kernel), list)


def test_a_thread_without_a_context_gets_it_once(rec):
    kernel = _small_kernel()
    out = torch.zeros(8).as_subclass(FakeTensor)
    rec.driver.allow_set_current = True
    rec.driver.results = [INVALID_CONTEXT]
    runtime.launch(kernel, 1, 8, torch.device("cuda", 0), out, 8, 1.0, True)
    assert rec.driver.context_calls == [("cuCtxSetCurrent", ("ctx", 0))]
    assert len(rec.driver.calls) == 2  # refused, then launched
    rec.driver.results = [700]  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: 700"):
        runtime.launch(kernel, 1, 8, torch.device("cuda", 0), out, 8, 1.0, True)


def test_a_first_launch_the_driver_rejects_goes_to_numba(rec, monkeypatch, caplog):
    kernel = _small_kernel()
    seen = []

    class Recording(type(kernel)):
        def __getitem__(self, config):
            return lambda *argv: seen.append(argv)

    kernel.__class__ = Recording
    monkeypatch.setattr(runtime, "device_context", lambda device: _NoGuard())
    monkeypatch.setattr(runtime, "view", lambda t: "view")
    monkeypatch.setattr(runtime, "stream", lambda device: 0)
    rec.driver.results = [400]  # CUDA_ERROR_INVALID_HANDLE: nothing was launched
    out = torch.zeros(8).as_subclass(FakeTensor)
    with caplog.at_level(logging.WARNING, logger=thin_launch.__name__):
        runtime.launch(kernel, 1, 8, torch.device("cuda", 0), out, 8, 1.0, True)
        runtime.launch(kernel, 1, 8, torch.device("cuda", 0), out, 8, 1.0, True)
    assert len(seen) == 2 and len(rec.driver.calls) == 1
    assert len(caplog.records) == 1 and "first cuLaunchKernel failed: 400" in caplog.text


def test_the_drivers_parameter_offsets_are_checked(rec, caplog):
    kernel = _small_kernel()
    out = torch.zeros(8).as_subclass(FakeTensor)
    sizes = Recorder.param_info
    rec.param_info = lambda argtypes: (lambda i: sizes(argtypes)(i) if i < 9 else (40, 8))
    thin_launch.set_enabled(True)
    assert not thin_launch.launch(kernel, 1, 8, torch.device("cuda", 0), (out, 8, 1.0, True))
    assert "the driver puts parameter 9 (value of argument 3) at offset 40" in caplog.text
    other = _small_kernel()
    rec.param_info = lambda argtypes: (lambda i: sizes(argtypes)(i) if i < 10 else (72, 8))
    assert not thin_launch.launch(other, 1, 8, torch.device("cuda", 0), (out, 8, 1.0, True))
    assert "the driver reports more than the packer's 10 parameters" in caplog.text
    third = _small_kernel()
    rec.param_info = lambda argtypes: (lambda i: None)  # a driver that cannot tell
    assert thin_launch.launch(third, 1, 8, torch.device("cuda", 0), (out, 8, 1.0, True))


def test_switches(monkeypatch, caplog):
    monkeypatch.setenv(thin_launch.ENV, "0")
    thin_launch.set_enabled(None)
    assert thin_launch.enabled() is False
    monkeypatch.setenv(thin_launch.ENV, "maybe")
    thin_launch.set_enabled(None)
    with pytest.raises(ValueError, match="TILESPLAT_CUDA_THIN_LAUNCH must be 0 or 1"):
        thin_launch.enabled()
    monkeypatch.delenv(thin_launch.ENV)
    thin_launch.set_enabled(None)
    assert thin_launch.enabled() is True
    with pytest.raises(TypeError):
        thin_launch.set_enabled(1)
    # off: not even a plan is looked for
    thin_launch.set_enabled(False)
    assert thin_launch.launch(_small_kernel(), 1, 1, torch.device("cuda", 0), ()) is False
    thin_launch.set_enabled(None)
    # a numba-cuda outside the checked versions: off, one log line
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "0.29.1")
    saved = thin_launch._backend[0], thin_launch._disabled_why[0]
    thin_launch._backend[0], thin_launch._disabled_why[0] = None, None
    try:
        with caplog.at_level(logging.WARNING, logger=thin_launch.__name__):
            assert thin_launch._default_backend() is None
            assert thin_launch._default_backend() is None
        assert len(caplog.records) == 1
        assert "numba-cuda 0.29.1 is outside the versions" in caplog.records[0].getMessage()
    finally:
        thin_launch._backend[0], thin_launch._disabled_why[0] = saved


def test_the_host_benchmark_runs_both_arms():
    """``python -m tilesplat.bench.launch_cost`` (docs/benchmarks.md): the thin arm goes
    through runtime.launch and the thin path, the numba arm through numba's _prepare_args.
    Times are not asserted (a shared machine); that both arms ran and what they timed is."""
    from tilesplat.bench import launch_cost

    res = launch_cost.host_packing(n=20, repeats=2)
    assert res["kernel"] == "rasterize_bwd_per_pixel"
    assert (res["arguments"], res["arrays"]) == (28, 18)
    assert res["thin_us_per_launch"] > 0 and res["numba_prepare_args_us_per_launch"] > 0
    assert len(res["ratios"]) == 2
    assert thin_launch.plans_of(object()) is None  # the benchmark's plans are gone again
