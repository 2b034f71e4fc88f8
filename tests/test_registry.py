"""Backend selection: argument, context manager, setter, environment, auto and fallback."""

import subprocess
import sys
import warnings

import pytest
import torch

import tilesplat
from tilesplat.backends import registry


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match=r"backend must be one of \['auto', 'torch'"):
        tilesplat.spherical_harmonics(0, torch.zeros(1, 3), torch.zeros(1, 1, 3), backend="gpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        tilesplat.set_backend("metal")


def test_explicit_backend_missing_op_raises(monkeypatch):
    registry._load("torch")
    monkeypatch.delitem(registry._impls, ("spherical_harmonics", "torch"))
    with pytest.raises(NotImplementedError, match="'spherical_harmonics'.*backend 'torch'"):
        registry.resolve("spherical_harmonics", torch.device("cpu"), "torch")


def test_auto_falls_back_with_one_warning(monkeypatch):
    registry._load("cpu")
    monkeypatch.delitem(registry._impls, ("isect_offset_encode", "cpu"), raising=False)
    monkeypatch.setattr(registry, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            name = registry.resolve_name("isect_offset_encode", torch.device("cpu"), "auto")
    assert name == "torch"
    msgs = [str(w.message) for w in caught if "falls back" in str(w.message)]
    assert len(msgs) == 1 and "isect_offset_encode" in msgs[0]


def test_selection_order(monkeypatch):
    monkeypatch.delenv("TILESPLAT_BACKEND", raising=False)
    assert tilesplat.current_backend() == "auto"
    monkeypatch.setenv("TILESPLAT_BACKEND", "torch")
    assert tilesplat.current_backend() == "torch"
    tilesplat.set_backend("cpu")
    try:
        assert tilesplat.current_backend() == "cpu"
        with tilesplat.use_backend("torch"):
            assert tilesplat.current_backend() == "torch"
            with tilesplat.use_backend("auto"):
                assert tilesplat.current_backend() == "auto"
            assert tilesplat.current_backend() == "torch"
        assert tilesplat.current_backend() == "cpu"
    finally:
        tilesplat.set_backend(None)
    monkeypatch.setenv("TILESPLAT_BACKEND", "bogus")
    with pytest.raises(ValueError, match="TILESPLAT_BACKEND"):
        tilesplat.current_backend()


def test_backward_scheme_selection(monkeypatch):
    monkeypatch.delenv("TILESPLAT_BACKWARD_SCHEME", raising=False)
    assert tilesplat.current_backward_scheme() == "per_pixel"
    monkeypatch.setenv("TILESPLAT_BACKWARD_SCHEME", "per_splat")
    assert tilesplat.current_backward_scheme() == "per_splat"
    tilesplat.set_backward_scheme("per_pixel")
    try:
        assert tilesplat.current_backward_scheme() == "per_pixel"
        assert tilesplat.current_backward_scheme("per_splat") == "per_splat"
    finally:
        tilesplat.set_backward_scheme(None)
    with pytest.raises(ValueError, match="backward_scheme must be one of"):
        tilesplat.set_backward_scheme("sideways")


def test_cuda_backend_needs_cuda_tensors_without_simulator(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    if registry._load("cuda") is not None:
        with pytest.raises(NotImplementedError, match="backend 'cuda' cannot be used"):
            registry.resolve("spherical_harmonics", torch.device("cpu"), "cuda")
    else:
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            registry.resolve("spherical_harmonics", torch.device("cpu"), "cuda")


def test_import_compiles_nothing():
    code = (
        "import sys, tilesplat\n"
        "bad = [m for m in sys.modules if m.startswith(('numba', 'tilesplat.backends.cpu',"
        " 'tilesplat.backends.cuda', 'tilesplat.backends.torch'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_numpy_aliases_are_restored_only_where_numpy_lacks_them(monkeypatch):
    """numba-cuda 0.30.4 overloads np.row_stack, which NumPy 2.5 removed (the H200's image)."""
    import numpy as np

    from tilesplat.backends.numpy_aliases import restore_numpy_aliases

    if hasattr(np, "row_stack"):
        own = getattr(np, "row_stack")  # noqa: B009 - the name ruff's NPY201 flags
        assert restore_numpy_aliases() == [] and getattr(np, "row_stack") is own  # noqa: B009
        monkeypatch.delattr(np, "row_stack")
    else:
        monkeypatch.setattr(np, "row_stack", None, raising=False)
        monkeypatch.delattr(np, "row_stack")
    assert restore_numpy_aliases() == ["np.row_stack = np.vstack"]
    assert getattr(np, "row_stack") is np.vstack  # noqa: B009
    assert restore_numpy_aliases() == []
