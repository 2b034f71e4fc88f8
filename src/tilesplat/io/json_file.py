"""JSON files: read a user's file as untrusted input, write strict JSON.

Reading (``transforms.json`` of nerfstudio and Blender datasets): the file's size is bounded
before it is read, and its nesting depth is measured on the bytes before it is parsed, so a
file of ``[[[[...`` fails with one line naming it instead of a ``RecursionError`` from the
parser (Python's parser recurses once per level) or from any code that walks the result later.
Parsing allocates some ten bytes of Python objects per byte of a hostile file, which the size
bound keeps to a few GB at most.

Writing (``metrics.json``, ``history.json``): ``NaN`` and ``Infinity`` are not JSON, and
Python writes them unless told not to; every non-finite float is written as ``null`` and named
to the caller, and the text is made with ``allow_nan=False``, so that nothing non-finite is
ever written silently.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

MAX_DEPTH = 32  # a transforms.json needs 4 levels (object, frames, frame, matrix rows)
MAX_BYTES = 128 * 2**20  # ~450,000 frames as ns-process-data writes them (~300 bytes each)

# a JSON string, escapes included (unrolled: runs of plain characters are matched in one go,
# and a match never backtracks); brackets inside one do not nest
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STEP = np.zeros(256, np.int8)  # byte -> change of depth
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_CHUNK = 1 << 24  # bytes measured at once (bounds the temporary arrays to ~6x this)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text ``raw`` (0 for a bare value),
    counted outside strings; linear time."""
    text = np.frombuffer(_STRING.sub(b'""', raw), np.uint8)
    deepest = depth = 0
    for start in range(0, len(text), _CHUNK):
        steps = _STEP[text[start:start + _CHUNK]]
        running = np.cumsum(steps[steps != 0], dtype=np.int32) + depth  # at each bracket
        if len(running):
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
    return deepest


def read_json(path: str | Path, what: str, max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """The parsed JSON file ``path``, a ``what`` (for the messages), read as untrusted input.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: larger than ``max_bytes``, nested deeper than
            ``max_depth``, not UTF-8, or not valid JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path}: {what} of {size} bytes; at most {max_bytes} are read")
    raw = path.read_bytes()[:max_bytes + 1]  # the file may have grown since the stat
    if len(raw) > max_bytes:
        raise ValueError(f"{path}: {what} of more than {max_bytes} bytes; at most "
                         f"{max_bytes} are read")
    depth = json_depth(raw)
    if depth > max_depth:
        raise ValueError(f"{path}: {what} nested {depth} levels deep; at most {max_depth} are "
                         "read")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a valid JSON file ({e})") from None


def finite_json(obj: Any, where: str = "") -> tuple[Any, list[str]]:
    """``obj`` (dicts, lists, tuples, numbers, strings, None) with every non-finite float
    replaced by None, and where each was (``key.key[index]``, from ``where``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None, [where]
    if isinstance(obj, dict):
        out, found = {}, []
        for k, v in obj.items():
            out[k], f = finite_json(v, f"{where}.{k}" if where else str(k))
            found += f
        return out, found
    if isinstance(obj, (list, tuple)):
        items = [finite_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return [v for v, _ in items], [p for _, f in items for p in f]
    return obj, []


def strict_json_bytes(obj: Any, indent: int | None = 1) -> tuple[bytes, list[str]]:
    """UTF-8 JSON of ``obj`` with every non-finite float written as ``null``
    (:func:`finite_json`), made with ``allow_nan=False``; and where the nulls went."""
    clean, nulled = finite_json(obj)
    return json.dumps(clean, indent=indent, allow_nan=False).encode("utf-8"), nulled
