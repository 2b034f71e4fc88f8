"""Checks of user input shared by every public op, so every backend gets the same errors.

Errors name the argument, what was expected and what came, e.g.
``ValueError: expected means2d [..., N, 2], got (4, 3)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import re
from collections.abc import Iterable, Iterator
from numbers import Integral, Real

import torch
from torch import Tensor

from .deferred_checks import current_flag

_FLOATS = (torch.float32, torch.float64)
_INTS = (torch.int32, torch.int64)
_settings: dict[str, bool | None] = {"finite": None}


def set_check_finite(enabled: bool | None) -> None:
    """Turns the NaN/Inf check of float inputs on or off (None: back to the default).

    The default is on, or what ``TILESPLAT_CHECK_FINITE`` says (``0`` turns it off). The check
    reads every input once; turn it off in a tight training loop once the inputs are trusted.
    """
    _settings["finite"] = enabled


def check_finite_enabled() -> bool:
    if _settings["finite"] is not None:
        return bool(_settings["finite"])
    return os.environ.get("TILESPLAT_CHECK_FINITE", "1") not in ("0", "false", "False", "no")


# set inside internal_call(): the ops' inputs are what tilesplat's own kernels produced
_INTERNAL: contextvars.ContextVar[bool] = contextvars.ContextVar("tilesplat_internal",
                                                                  default=False)


@contextlib.contextmanager
def internal_call() -> Iterator[None]:
    """Inside, the ops skip the checks that read their inputs' values (NaN/Inf, index ranges,
    sortedness): :func:`tilesplat.rasterization` checks what the caller gave once, at its
    entry, and passes between its ops only what its own kernels made of it, which need not be
    read again (each read of a GPU value waits for the stream). Shape, dtype and argument
    checks, which read no values, still run."""
    token = _INTERNAL.set(True)
    try:
        yield
    finally:
        _INTERNAL.reset(token)


def values_trusted() -> bool:
    """Whether the current op call comes from inside :func:`internal_call`."""
    return _INTERNAL.get()


_TOKEN = re.compile(r"\.\.\.|[A-Za-z_][A-Za-z0-9_]*|\d+")


@functools.lru_cache(maxsize=256)
def _parse(pattern: str) -> tuple[tuple[str, ...], tuple[str | int, ...], bool]:
    """``"..., N, 2"`` -> (tokens, the fixed dims with numbers as ints, whether ``...`` leads);
    parsed once per pattern (a training step checks a few dozen shapes)."""
    tokens = tuple(_TOKEN.findall(pattern))
    if "..." in tokens and tokens[0] != "...":
        raise AssertionError("'...' must lead a pattern")
    fixed = tuple(int(tok) if tok.isdigit() else tok for tok in tokens if tok != "...")
    return tokens, fixed, "..." in tokens


class Shapes:
    """Checks tensor shapes against patterns like ``"..., N, 2"``, binding named sizes.

    ``...`` binds the leading batch dimensions on first use; later patterns must agree.
    """

    def __init__(self, **known: int | tuple[int, ...]) -> None:
        self.dims: dict[str, int | tuple[int, ...]] = dict(known)

    def _fail(self, name: str, pattern: str, tokens: tuple[str, ...], shape: tuple) -> None:
        bound = ", ".join(f"{k}={v}" for k, v in self.dims.items() if k in tokens)
        where = f" (with {bound})" if bound else ""
        raise ValueError(f"expected {name} [{pattern}]{where}, got {shape}")

    def check(self, name: str, t: Tensor, pattern: str) -> None:
        tokens, fixed, batched = _parse(pattern)
        shape = tuple(t.shape)
        if batched:
            if len(shape) < len(fixed):
                self._fail(name, pattern, tokens, shape)
            lead, rest = shape[: len(shape) - len(fixed)], shape[len(shape) - len(fixed) :]
            if "..." in self.dims and self.dims["..."] != lead:
                self._fail(name, pattern, tokens, shape)
        else:
            if len(shape) != len(fixed):
                self._fail(name, pattern, tokens, shape)
            lead, rest = (), shape
        new: dict[str, int | tuple[int, ...]] = {}
        for tok, size in zip(fixed, rest, strict=True):
            if isinstance(tok, int):
                if size != tok:
                    self._fail(name, pattern, tokens, shape)
            else:
                want = self.dims.get(tok, new.get(tok))
                if want is not None and want != size:
                    self._fail(name, pattern, tokens, shape)
                new[tok] = size
        if batched:
            new["..."] = lead
        self.dims.update(new)

    def __getitem__(self, key: str):
        return self.dims[key]


def check_tensor(name: str, t: object, kind: str = "float") -> Tensor:
    """Checks that ``t`` is a tensor of the given kind: ``float``, ``int`` or ``bool``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"expected {name} to be a torch.Tensor, got {type(t).__name__}")
    if kind == "float" and t.dtype not in _FLOATS:
        raise TypeError(f"expected {name} of dtype float32 or float64, got {t.dtype}")
    if kind == "int" and t.dtype not in _INTS:
        raise TypeError(f"expected {name} of dtype int32 or int64, got {t.dtype}")
    if kind == "bool" and t.dtype != torch.bool:
        raise TypeError(f"expected {name} of dtype bool, got {t.dtype}")
    return t


def common_float(named: dict[str, Tensor | None]) -> tuple[torch.dtype, torch.device]:
    """The one float dtype and device of all given tensors; mixed ones raise.

    Float tensors must share a dtype (no silent float32/float64 mixing); every tensor
    (floats, ints, masks) must be on one device.
    """
    dtype = device = None
    first_f = first_d = None
    for name, t in named.items():
        if t is None:
            continue
        if t.is_floating_point():
            if dtype is None:
                dtype, first_f = t.dtype, name
            elif t.dtype != dtype:
                raise TypeError(
                    f"mixed float dtypes: {first_f} is {dtype} but {name} is {t.dtype}; "
                    "convert them to one dtype"
                )
        if device is None:
            device, first_d = t.device, name
        elif t.device != device:
            raise ValueError(
                f"tensors on different devices: {first_d} is on {device} but {name} is on "
                f"{t.device}"
            )
    if dtype is None:
        raise TypeError("expected at least one float tensor")
    return dtype, device


def _distinct(t: Tensor) -> Tensor:
    """t without its broadcast dimensions (stride 0, e.g. from ``expand``): the same values,
    each once."""
    index = tuple(0 if st == 0 and n > 1 else slice(None)
                  for st, n in zip(t.stride(), t.shape, strict=True))
    return t[index]


def _all_finite(t: Tensor) -> bool:
    """One reduction instead of a mask: a NaN or Inf makes the sum non-finite. A finite sum
    proves every element finite; a non-finite one may be an overflow of large finite values,
    so it is checked element by element."""
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def _finite_extremes(tensors: Iterable[Tensor], sums_first: bool = False) -> Tensor:
    """[2k] bool: whether each tensor's smallest and largest values (in turn) are finite;
    both are exactly when all its values are (``aminmax`` propagates NaN). One pass in the
    tensor's own dtype: no overflow to flag, and no float64 copy (a float32 tensor's
    float64 sum costs ~50x its float32 one on the CPU).

    With ``sums_first`` (a step on the CPU, where reading a value back costs nothing), the
    tensors' sums in their own dtype come first (a third of aminmax's time): finite sums
    prove every value finite; a sum that is not (a NaN, an Inf, or finite values that
    overflow it) leaves the answer to the extremes."""
    tensors = list(tensors)
    if sums_first and all(t.device.type == "cpu" for t in tensors):
        if bool(torch.isfinite(torch.stack([t.sum() for t in tensors])).all()):
            return torch.ones(2 * len(tensors), dtype=torch.bool)
    return torch.isfinite(torch.stack([x for t in tensors for x in torch.aminmax(t)]))


def check_finite(named: dict[str, Tensor | None]) -> None:
    """Rejects NaN or Inf in float tensors (unless switched off by set_check_finite).

    One reduction per tensor and one host read for them all (on a GPU every read of a
    device value waits for the stream); the tensor-by-tensor check runs only when that sum
    is not finite, to name the tensor or to clear a finite overflow. Inside
    :func:`.deferred_checks.deferred_finite_checks` the sums go to the flag unread."""
    if not check_finite_enabled() or _INTERNAL.get():
        return
    tensors = {name: _distinct(t) for name, t in named.items()
               if t is not None and t.is_floating_point() and t.numel()}
    if not tensors:
        return
    deferred = current_flag()
    if deferred is not None:  # the trainer's step: a device flag, read a step later
        deferred.record(tuple(tensors), _finite_extremes(tensors.values(),
                                                         deferred.reads_free))
        return
    sums = torch.stack([t.sum().to(torch.float64) for t in tensors.values()])
    if bool(torch.isfinite(sums).all()):
        return
    for name, t in tensors.items():
        if not _all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(
                f"{name} contains {bad} NaN or Inf value(s); "
                "tilesplat.set_check_finite(False) skips this check"
            )


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) <= 0:
        raise ValueError(f"expected {name} to be a positive integer, got {value!r}")
    return int(value)


def check_int_at_least(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < low:
        raise ValueError(f"expected {name} to be an integer >= {low}, got {value!r}")
    return int(value)


def check_real(name: str, value: object, low: float | None = None,
               low_inclusive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(float(value)):
        raise ValueError(f"expected {name} to be a real number, got {value!r}")
    v = float(value)
    if low is not None and (v < low or (v == low and not low_inclusive)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"expected {name} {op} {low}, got {value!r}")
    return v



def check_projection_options(width: object, height: object, eps2d: object, near_plane: object,
                             far_plane: object, radius_clip: object
                             ) -> tuple[int, int, float, float, float, float]:
    """The image size and the projection's numbers checked, as every projection takes them:
    (width, height, eps2d, near_plane, far_plane, radius_clip).

    Raises:
        ValueError: naming the argument (``far_plane`` must exceed ``near_plane``).
    """
    width = check_positive_int("width", width)
    height = check_positive_int("height", height)
    eps2d = check_real("eps2d", eps2d, 0.0)
    near_plane = check_real("near_plane", near_plane)
    far_plane = check_real("far_plane", far_plane)
    if not far_plane > near_plane:
        raise ValueError(f"expected far_plane > near_plane, got {far_plane} <= {near_plane}")
    return width, height, eps2d, near_plane, far_plane, check_real("radius_clip", radius_clip)


def check_backgrounds_masks(s: Shapes, backgrounds: Tensor | None, masks: Tensor | None,
                            lead: str = "...") -> None:
    """``backgrounds`` [lead, D] and ``masks`` [lead, TH, TW] bool, when given, against the
    shapes ``s`` has bound (``lead``: the images' leading dims, ``...`` or ``..., C``)."""
    if backgrounds is not None:
        check_tensor("backgrounds", backgrounds)
        s.check("backgrounds", backgrounds, f"{lead}, D")
    if masks is not None:
        check_tensor("masks", masks, "bool")
        s.check("masks", masks, f"{lead}, TH, TW")

def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"expected {name} to be one of {list(choices)}, got {value!r}")
    return value  # type: ignore[return-value]


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected {name} to be a bool, got {type(value).__name__}")
    return value


def check_deterministic(
    value: object, device: torch.device, backend_name: str, what: str = "deterministic"
) -> bool | None:
    """A call's ``deterministic=`` (``None``: the process-wide option decides): a bool, and
    not ``True`` where the torch reference runs on a GPU (PyTorch's atomic index ops)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{what} must be True, False or None, got {value!r}")
    if value and backend_name == "torch" and device.type == "cuda":
        raise ValueError(f"{what}=True with the torch backend on {device}: the reference adds "
                         "gradients with PyTorch's atomic index ops on a GPU; use "
                         "backend='cuda'")
    return value


def check_tile_lists(
    isect_offsets: Tensor,  # [..., TH, TW]
    flatten_ids: Tensor,  # [n]
    n_gaussians: int,
    gaussians: str,
    width: int,
    height: int,
    tile_size: int,
) -> None:
    """A rasterizer's tile lists: the grid covers the image, and (unless inside
    :func:`internal_call`, whose offsets and ids ``rasterization`` made itself) the offsets
    are non-decreasing within [0, n] and ``flatten_ids`` index the ``n_gaussians``
    Gaussians (named ``gaussians`` in the message)."""
    TH, TW = isect_offsets.shape[-2:]
    n = flatten_ids.shape[0]
    if TH * tile_size < height or TW * tile_size < width:
        raise ValueError(
            f"isect_offsets grid {TH}×{TW} tiles of {tile_size} px does not cover the "
            f"{height}×{width} image; expected at least "
            f"{math.ceil(height / tile_size)}×{math.ceil(width / tile_size)} tiles"
        )
    if values_trusted():
        return
    if isect_offsets.numel():
        flat = isect_offsets.reshape(-1)
        if int(flat.min()) < 0 or int(flat.max()) > n:
            raise ValueError(f"expected isect_offsets in [0, {n}] (n = len(flatten_ids))")
        if bool((flat[1:] < flat[:-1]).any()):
            raise ValueError("expected isect_offsets non-decreasing (isect_offset_encode output)")
    if n and (int(flatten_ids.min()) < 0 or int(flatten_ids.max()) >= n_gaussians):
        raise ValueError(
            f"expected flatten_ids in [0, {n_gaussians}) ({gaussians} Gaussians), "
            f"got values in [{int(flatten_ids.min())}, {int(flatten_ids.max())}]"
        )


def as_int32(t: Tensor) -> Tensor:
    return t if t.dtype == torch.int32 else t.to(torch.int32)
