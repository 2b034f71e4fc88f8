"""Finding a seam's module by name: the data layouts' readers and the splat formats' readers and
writers are named by their module (``data/<module>.py``: ``load_<module>``; ``io/<module>.py``:
``read_<module>``, ``save_<module>``), imported when first used. Standard library only."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def module_function(package: str, module: str, function: str, what: str) -> Callable[..., Any]:
    """``package.module.function``, imported now.

    Raises:
        AttributeError: the module has no such function (naming ``what``: the seam's entry).
    """
    found = importlib.import_module(f"{package}.{module}")
    fn = getattr(found, function, None)
    if fn is None:
        raise AttributeError(f"{what}: {found.__name__} has no {function}")
    return fn
