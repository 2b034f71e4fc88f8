"""``import tilesplat as gsplat``: every public name of the gsplat 1.5.3 wheel (top level and the
submodules its trainer imports) exists in tilesplat with gsplat's parameters, and each name
either works or raises NotImplementedError when called (never when imported)."""

import dataclasses
import enum
import importlib
import inspect

import pytest

import tilesplat

gsplat = pytest.importorskip("gsplat")

SUBMODULES = ("strategy", "optimizers", "compression", "exporter", "distributed")

# Deliberate differences, each with its reason. A gsplat call still binds the same way.
DEFAULT_EXCEPTIONS = {
    # tilesplat 0.1 callers pass means_lr= instead, so lr may be left out
    ("MCMCStrategy.step_post_backward", "lr"): (inspect.Parameter.empty, None),
}

NOT_IMPLEMENTED = {"rasterization_2dgs_inria_wrapper", "rasterization_inria_wrapper"}


def _public(module) -> dict[str, object]:
    """Functions and classes a gsplat module defines or re-exports from gsplat (no modules,
    no typing or torch names)."""
    out = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(
            obj, "__module__", ""
        ).startswith("gsplat"):
            out[name] = obj
    return out


def _norm(value):
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.name, value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, dataclasses.asdict(value))
    return value


def _compare(where: str, theirs: inspect.Signature, ours: inspect.Signature) -> list[str]:
    """gsplat's parameters must lead ours in name, kind and default; ours may add only
    keyword-only parameters with defaults (tilesplat's ``backend=`` and the like)."""
    problems = []
    a, b = list(theirs.parameters.values()), list(ours.parameters.values())
    for i, p in enumerate(a):
        if i >= len(b):
            problems.append(f"{where}: missing parameter {p.name!r}")
            continue
        q = b[i]
        if (p.name, p.kind) != (q.name, q.kind):
            problems.append(f"{where}: parameter {i} is {q.name} ({q.kind}), gsplat has "
                            f"{p.name} ({p.kind})")
            continue
        want, got = _norm(p.default), _norm(q.default)
        if (where, p.name) in DEFAULT_EXCEPTIONS:
            want = _norm(DEFAULT_EXCEPTIONS[(where, p.name)][1])
        if want != got and not (want is inspect.Parameter.empty and got is want):
            problems.append(f"{where}({p.name}=...): default {got!r}, gsplat's is {want!r}")
    for q in b[len(a):]:
        if q.kind is not inspect.Parameter.KEYWORD_ONLY or q.default is inspect.Parameter.empty:
            problems.append(f"{where}: extra parameter {q.name!r} must be keyword-only "
                            "with a default")
    return problems


def _compare_object(where: str, theirs, ours) -> list[str]:
    if ours is None:
        return [f"{where}: missing"]
    if inspect.isclass(theirs):
        if not inspect.isclass(ours):
            return [f"{where}: not a class"]
        if issubclass(theirs, enum.Enum):
            want = {m.name: m.value for m in theirs}
            got = {m.name: m.value for m in ours} if issubclass(ours, enum.Enum) else None
            return [] if want == got else [f"{where}: members {got}, gsplat has {want}"]
        problems = _compare(where, inspect.signature(theirs), inspect.signature(ours))
        for name, member in vars(theirs).items():
            if name.startswith("_") or not callable(member):
                continue
            mine = getattr(ours, name, None)
            if mine is None:
                problems.append(f"{where}.{name}: missing")
            else:
                problems += _compare(f"{theirs.__name__}.{name}",
                                     inspect.signature(member), inspect.signature(mine))
        return problems
    return _compare(where, inspect.signature(theirs), inspect.signature(ours))


def test_top_level_names_and_signatures():
    names = set(gsplat.all) | set(_public(gsplat))
    assert len(names) >= 27
    missing = sorted(n for n in names if not hasattr(tilesplat, n))
    assert not missing, f"gsplat names missing from tilesplat: {missing}"
    problems = []
    for name in sorted(names - {"__version__"}):
        problems += _compare_object(name, getattr(gsplat, name), getattr(tilesplat, name))
    assert not problems, "\n".join(problems)
    assert isinstance(tilesplat.__version__, str)


@pytest.mark.parametrize("sub", SUBMODULES)
def test_submodule_names_and_signatures(sub):
    theirs = importlib.import_module(f"gsplat.{sub}")
    ours = importlib.import_module(f"tilesplat.{sub}")
    assert getattr(tilesplat, sub) is ours
    names = _public(theirs)
    assert names, sub
    problems = []
    for name, obj in sorted(names.items()):
        problems += _compare_object(f"{sub}.{name}", obj, getattr(ours, name, None))
    assert not problems, "\n".join(problems)


def test_the_comparison_catches_a_difference():
    def theirs(a, b: int = 1, c="x"):
        pass

    def ours_renamed(a, bb: int = 1, c="x"):
        pass

    def ours_default(a, b: int = 2, c="x", *, backend=None):
        pass

    def ours_positional_extra(a, b: int = 1, c="x", d=None):
        pass

    sig = inspect.signature
    assert _compare("f", sig(theirs), sig(ours_renamed))
    assert _compare("f", sig(theirs), sig(ours_default))
    assert _compare("f", sig(theirs), sig(ours_positional_extra))
    assert not _compare("f", sig(theirs), sig(lambda a, b=1, c="x", *, backend=None: 0))


@pytest.mark.parametrize("name", sorted(NOT_IMPLEMENTED))
def test_missing_features_raise_when_called(name):
    fn = getattr(tilesplat, name)
    n_required = sum(
        1 for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    with pytest.raises(NotImplementedError, match=name):
        fn(*([None] * n_required))


def test_stubbed_submodules_raise_naming_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="splats is missing"):  # the codec: test_png_compression
        tilesplat.PngCompression().compress(str(tmp_path), {})
    with pytest.raises(ValueError, match="ftheta.*fully_fused_projection_with_ut"):
        tilesplat.proj(None, None, None, 4, 4, camera_model="ftheta")


def test_rasterization_refuses_3dgut_arguments_as_gsplat_does():
    """gsplat's asserts, as ValueErrors naming the argument (tests/test_ut_reference.py has
    the rest)."""
    import torch

    args = (torch.zeros(1, 3), torch.ones(1, 4), torch.zeros(1, 3), torch.ones(1),
            torch.ones(1, 3), torch.eye(4)[None], torch.eye(3)[None], 8, 8)
    # gsplat also asserts packed=False with with_ut; tilesplat renders packed (test_ut_reference)
    with pytest.raises(ValueError, match="sparse_grad"):
        tilesplat.rasterization(*args, with_ut=True, sparse_grad=True)
    with pytest.raises(ValueError, match="rolling_shutter.*needs with_ut=True"):
        tilesplat.rasterization(
            *args, rolling_shutter=tilesplat.RollingShutterType.ROLLING_TOP_TO_BOTTOM
        )
    with pytest.raises(ValueError, match="camera_model='ftheta'.*needs with_ut=True"):
        tilesplat.rasterization(*args, camera_model="ftheta")
