"""numba-cuda's kernel parameter ABI, as the thin launch path packs it, and its check
against the ``.entry`` parameters of the PTX.

numba flattens every kernel argument into plain PTX parameters (``_Kernel._prepare_args``
in numba-cuda 0.30, and the data model of ``numba.core.datamodel``):

- an array of ``ndim`` dimensions is ``5 + 2 * ndim`` 8-byte parameters: the meminfo pointer
  and the parent pointer (both 0 for a kernel argument), the element count, the item size in
  bytes, the data pointer, then ``shape[ndim]`` and ``strides[ndim]`` (strides in bytes);
- an integer is its own width (``int64`` 8 bytes, ``int32`` 4), ``float32`` 4 bytes,
  ``float64`` 8 bytes, ``boolean`` 1 byte.

Every parameter sits at its natural alignment in the device-side parameter buffer. The PTX
says all of this too (``.param .u64``, ``.param .f32``, ``.param .u8``, ...), so the layout
here is never trusted: ``tests/test_cuda_launch_abi.py`` compares it with the PTX of every
kernel of the catalogue (``kernels.KERNELS``), and the thin path compares it again with the
PTX of each kernel it compiles on the device before its first launch
(:mod:`.thin_launch`). Runs anywhere: no GPU, no driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from numba.core import types as nt

ARRAY_FIELDS = ("meminfo", "parent", "nitems", "itemsize", "data")
_INT_CODES = {8: "b", 16: "h", 32: "i", 64: "q"}  # struct codes, signed
_UINT_CODES = {8: "B", 16: "H", 32: "I", 64: "Q"}


@dataclass(frozen=True)
class Param:
    """One flattened kernel parameter: where it comes from and how it is stored."""

    arg: int  # index of the kernel argument it belongs to
    field: str  # "meminfo" ... "data", "shape0", "strides1", or "value" for a scalar
    size: int  # bytes
    code: str  # struct code of its value ("q", "Q", "f", "d", "?", "i", ...)
    offset: int  # byte offset in the parameter buffer (natural alignment)


def scalar_code(ty: Any) -> tuple[str, int]:
    """(struct code, size in bytes) of a scalar numba type; TypeError for the others."""
    if ty == nt.boolean:
        return "?", 1
    if ty == nt.float32:
        return "f", 4
    if ty == nt.float64:
        return "d", 8
    if isinstance(ty, nt.Integer) and ty.bitwidth in _INT_CODES:
        codes = _INT_CODES if ty.signed else _UINT_CODES
        return codes[ty.bitwidth], ty.bitwidth // 8
    raise TypeError(f"the thin launch path packs arrays, integers, floats and booleans, "
                    f"not {ty}")


def layout(argtypes: tuple) -> tuple[Param, ...]:
    """The flattened parameters of a kernel of argument types ``argtypes`` (numba types),
    with their offsets; TypeError for a type the packer does not handle (records, tuples,
    complex numbers, ...)."""
    params: list[Param] = []
    offset = 0

    def add(arg: int, field: str, code: str, size: int) -> None:
        nonlocal offset
        offset = (offset + size - 1) // size * size
        params.append(Param(arg, field, size, code, offset))
        offset += size

    for i, ty in enumerate(argtypes):
        if isinstance(ty, nt.Array):
            for field in ARRAY_FIELDS:
                add(i, field, "Q" if field in ("meminfo", "parent", "data") else "q", 8)
            for d in range(ty.ndim):
                add(i, f"shape{d}", "q", 8)
            for d in range(ty.ndim):
                add(i, f"strides{d}", "q", 8)
        else:
            code, size = scalar_code(ty)
            add(i, "value", code, size)
    return tuple(params)


def buffer_size(params: tuple[Param, ...]) -> int:
    """Bytes of the parameter buffer (the end of the last parameter, at least 8)."""
    end = max((p.offset + p.size for p in params), default=0)
    return max(8, (end + 7) // 8 * 8)


def struct_format(params: tuple[Param, ...]) -> str:
    """A ``struct`` format (little endian, explicit padding) writing every parameter at its
    offset, in order."""
    out, at = ["<"], 0
    for p in params:
        if p.offset > at:
            out.append(f"{p.offset - at}x")
        out.append(p.code)
        at = p.offset + p.size
    return "".join(out)


# ---- the PTX side -----------------------------------------------------------------------

_PTX_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.([a-z]+)(\d+)\s+[\w$]+(?:\[(\d+)\])?")


@dataclass(frozen=True)
class PtxParam:
    """One ``.param`` of a PTX ``.entry``: its type class (``u``, ``s``, ``b``, ``f``), its
    size and alignment in bytes."""

    kind: str
    size: int
    align: int


def entry_params(ptx: str, name: str | None = None) -> tuple[PtxParam, ...]:
    """The parameters of the ``.entry`` named ``name`` (or of the only one) of ``ptx``;
    ValueError when there is none, or several and no name."""
    entries = _ENTRY.findall(ptx)
    if name is not None:
        entries = [e for e in entries if e[0] == name]
    if len(entries) != 1:
        raise ValueError(f"expected one .entry in the PTX{f' named {name}' if name else ''}, "
                         f"found {len(entries)}")
    out = []
    for decl in entries[0][1].split(","):
        decl = decl.strip()
        if not decl:
            continue
        m = _PARAM.fullmatch(decl)
        if m is None:
            raise ValueError(f"cannot read the PTX parameter {decl!r}")
        align, kind, bits, count = m.groups()
        width = _PTX_SIZES.get(bits)
        if width is None:
            raise ValueError(f"unknown PTX parameter width in {decl!r}")
        size = width * (int(count) if count else 1)
        out.append(PtxParam(kind, size, int(align) if align else width))
    return tuple(out)


def ptx_offsets(params: tuple[PtxParam, ...]) -> tuple[int, ...]:
    """Byte offsets of the PTX parameters in the device-side parameter buffer."""
    out, at = [], 0
    for p in params:
        at = (at + p.align - 1) // p.align * p.align
        out.append(at)
        at += p.size
    return tuple(out)


_KIND_OF_CODE = {"f": "f", "d": "f", "?": "u"}  # floats are .f32/.f64, booleans .u8/.b8


def mismatch(params: tuple[Param, ...], ptx: tuple[PtxParam, ...]) -> str | None:
    """None when the packer's ``params`` are the PTX's parameters (count, size, offset and
    float-or-integer class of each), else what differs first, in words."""
    if len(params) != len(ptx):
        return f"the packer lays out {len(params)} parameters, the PTX has {len(ptx)}"
    for i, (p, q, off) in enumerate(zip(params, ptx, ptx_offsets(ptx), strict=True)):
        want = _KIND_OF_CODE.get(p.code, "u")
        kind = "f" if q.kind == "f" else "u"  # .u/.s/.b are all integer storage
        if p.size != q.size or p.offset != off or want != kind:
            return (f"parameter {i} (argument {p.arg} {p.field}): the packer writes "
                    f"{p.size} bytes ({p.code!r}) at offset {p.offset}, the PTX declares "
                    f".{q.kind}{q.size * 8} at offset {off}")
    return None
