"""The header of a PLY file, parsed and checked before any data is read.

A PLY header is ASCII lines up to ``end_header``: the format (``ascii``,
``binary_little_endian`` or ``binary_big_endian``), ``comment`` / ``obj_info`` lines, and
``element NAME COUNT`` each followed by its ``property TYPE NAME`` lines (``property list
COUNT_TYPE ITEM_TYPE NAME`` for lists). The 3DGS layout (:mod:`.ply`) and SuperSplat's
compressed layout (:mod:`.compressed_ply`) share this parser; it only reads text and never
allocates by a count it found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}  # fmt: skip
FORMATS = {"ascii": "", "binary_little_endian": "<", "binary_big_endian": ">"}
MIP_COMMENT = "SplatRenderMode: mip"  # Brush's and splat-transform's mark of an antialiased model
MAX_HEADER = 1 << 16  # a Gaussian PLY header is a few KB; refuse to scan further
_MAX_COUNT = 1 << 40  # a count that does not fit any file is refused while parsing


@dataclass
class Element:
    """One ``element`` of the header: its name, count and properties (name, NumPy type code
    without byte order; ``None`` for a list property)."""

    name: str
    count: int
    props: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def has_lists(self) -> bool:
        return any(t is None for _, t in self.props)

    def dtype(self, order: str) -> np.dtype:
        """The record of one element in a binary file (no list properties)."""
        return np.dtype([(p, order + t) for p, t in self.props])


@dataclass
class Header:
    fmt: str  # a key of FORMATS
    elements: list[Element]
    comments: list[str]
    offset: int  # where the data starts

    @property
    def order(self) -> str:
        return FORMATS[self.fmt]

    def element(self, name: str) -> Element | None:
        return next((e for e in self.elements if e.name == name), None)

    def offset_of(self, path: Path, name: str) -> int:
        """Byte offset of element ``name``'s data in a binary file (the elements before it
        must have fixed-size records)."""
        at = self.offset
        for e in self.elements:
            if e.name == name:
                return at
            if e.has_lists:
                raise ValueError(
                    f"{path}: element {e.name!r} before {name!r} has list properties; "
                    "a Gaussian PLY cannot be read past it"
                )
            at += e.count * e.dtype(self.order).itemsize
        raise ValueError(f"{path}: no element {name!r}")

    def antialiased(self) -> bool:
        """Whether a comment marks the model as trained antialiased: Brush's and
        splat-transform's ``SplatRenderMode: mip`` or Postshot's ``antialiased 1`` (the last
        such comment wins)."""
        found = False
        for c in self.comments:
            low = c.strip().lower()
            if low.startswith("splatrendermode:"):
                found = low.split(":", 1)[1].strip() == "mip"
            elif low.startswith("antialiased "):
                found = low.split()[1:2] == ["1"]
        return found


def parse_header(path: Path, raw: bytes | memoryview) -> Header:
    """The header of the PLY bytes ``raw`` (``ValueError`` naming the file and the line)."""
    head = bytes(raw[:MAX_HEADER])
    if not head.startswith((b"ply\n", b"ply\r\n")):
        raise ValueError(f"{path}: not a PLY file (no 'ply' magic line)")
    end = head.find(b"end_header")
    if end < 0:
        raise ValueError(f"{path}: no 'end_header' in the first {MAX_HEADER} bytes")
    stop = head.find(b"\n", end)
    if stop < 0 or head[end + len(b"end_header") : stop].strip():
        raise ValueError(f"{path}: truncated PLY header (no newline after 'end_header')")
    try:
        lines = head[:end].decode("ascii").splitlines()[1:]
    except UnicodeDecodeError:
        raise ValueError(f"{path}: PLY header is not ASCII") from None
    fmt = None
    elements: list[Element] = []
    comments: list[str] = []
    for ln in lines:
        tok = ln.split()
        if not tok:
            continue
        if tok[0] == "comment":
            comments.append(ln.strip()[len("comment") :].strip())
        elif tok[0] == "obj_info":
            continue
        elif tok[0] == "format" and len(tok) == 3 and fmt is None:
            if tok[1] not in FORMATS or tok[2] != "1.0":
                raise ValueError(
                    f"{path}: unsupported PLY format {ln.strip()!r}; expected ascii, "
                    "binary_little_endian or binary_big_endian 1.0"
                )
            fmt = tok[1]
        elif tok[0] == "element" and len(tok) == 3 and tok[2].isdigit():
            count = int(tok[2])
            if count > _MAX_COUNT:
                raise ValueError(f"{path}: element {tok[1]!r} claims {count} entries")
            if any(e.name == tok[1] for e in elements):
                raise ValueError(f"{path}: element {tok[1]!r} appears twice")
            elements.append(Element(tok[1], count))
        elif tok[0] == "property" and elements and len(tok) == 3 and tok[1] in TYPES:
            elements[-1].props.append((tok[2], TYPES[tok[1]]))
        elif (tok[0] == "property" and elements and len(tok) == 5 and tok[1] == "list"
              and tok[2] in TYPES and tok[3] in TYPES):  # fmt: skip
            elements[-1].props.append((tok[4], None))
        else:
            raise ValueError(f"{path}: malformed PLY header line {ln.strip()!r}")
    if fmt is None:
        raise ValueError(f"{path}: the PLY header has no 'format' line")
    for e in elements:
        names = [p for p, _ in e.props]
        if len(set(names)) != len(names):
            raise ValueError(f"{path}: element {e.name!r} has duplicate properties")
    return Header(fmt, elements, comments, stop + 1)
