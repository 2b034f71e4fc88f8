"""The camera models' dispatch for the native kernels: ``project`` and ``project_vjp`` on a
model's code, written from the table ``backends/cameras.CAMERA_MODELS`` when this module is
imported (a model itself is one module of ``backends/cameras/``).

A kernel takes the code as a runtime integer and Numba compiles for types, not values, so the
dispatch is a chain of comparisons with constant codes, one branch per model and the first
model the fallback (the launchers check the name)::

    def project(model, x, y, z, fx, fy, cx, cy, width, height):
        if model == 1:
            return ortho_proj(x, y, z, fx, fy, cx, cy, width, height)
        if model == 2:
            return fisheye_proj(x, y, z, fx, fy, cx, cy, width, height)
        return pinhole_proj(x, y, z, fx, fy, cx, cy, width, height)

This is the chain the kernels had when it was written by hand, so the models compile to the
same machine code and results; and it compiles for both targets, where a loop over a tuple of
functions (``literal_unroll``) has no CUDA lowering. The source is registered with
``linecache``, so tracebacks and Numba's messages show it.

Numba's cache: a kernel compiled with an older table must not be served after a model is
added. The table and the models are files under ``backends/``, every one of which is in the
digest that ``backends/kernel_cache.py`` adds to each cached kernel's stamp, so any change
there recompiles the kernels once.
"""

from __future__ import annotations

import linecache

from ..cameras import CAMERA_MODELS, camera_module

# the models' modules, in code order: shared.build compiles their FUNCTIONS too
CAMERA_MODULES = tuple(camera_module(name) for name in CAMERA_MODELS)

FUNCTIONS = ("project", "project_vjp")

_ARGS = "x, y, z, fx, fy, cx, cy, width, height"
_DOCS = {
    "project": "(u, v, J) of camera model code ``model``",
    "project_vjp": "(v_x, v_y, v_z) of :func:`project` for model code ``model``, from v_u, "
                   "v_v and v_J",
}  # fmt: skip


def dispatch_source(function: str, suffix: str, args: str) -> str:
    """The source of ``function(model, args)``: each model's ``<name><suffix>(args)`` under
    its code, the first model's as the fallback."""
    lines = [f"def {function}(model, {args}):", f'    """{_DOCS[function]}."""']
    for code, name in enumerate(CAMERA_MODELS[1:], start=1):
        lines += [f"    if model == {code}:", f"        return {name}{suffix}({args})"]
    lines.append(f"    return {CAMERA_MODELS[0]}{suffix}({args})")
    return "\n".join(lines) + "\n"


def _write_dispatch() -> None:
    """Define ``project`` and ``project_vjp`` here from the table, with every model's pair
    beside them (plain Python calls them from here; ``shared.build`` from its namespace)."""
    for name, module in zip(CAMERA_MODELS, CAMERA_MODULES, strict=True):
        for suffix in ("_proj", "_proj_vjp"):
            fn = getattr(module, name + suffix, None)
            if fn is None:
                raise AttributeError(f"camera model {name!r}: {module.__name__} defines no "
                                     f"{name}{suffix}")  # fmt: skip
            globals()[name + suffix] = fn
    source = (dispatch_source("project", "_proj", _ARGS) + "\n\n"
              + dispatch_source("project_vjp", "_proj_vjp", _ARGS + ", vu, vv, vj"))
    filename = f"<{__name__}: the dispatch on {', '.join(CAMERA_MODELS)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), globals())  # our own source, from the table


_write_dispatch()
