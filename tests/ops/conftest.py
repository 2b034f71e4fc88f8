"""Parameters of the op tests, ``backend`` and ``batch``, and where the cuda-sim tests run.

``backend`` is parametrised over the native backends (``cpu``, ``cuda-sim``), or over the
names a ``@pytest.mark.backends(...)`` mark gives (on the test, its class or its module:
``pytestmark``), so a new backend joins every op test by being added to ``parity.NATIVE`` and
an op that only some backends implement lists them. ``batch`` is the leading batch dims,
``parity.BATCHES``.

The ``cuda-sim`` tests need their own process (``parity.SIMULATOR``): a normal run deselects
them and ``test_cuda_simulator.py`` runs them in a subprocess with the simulator on; that
process (``NUMBA_ENABLE_CUDASIM=1 pytest tests/ops``) deselects everything else here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .parity import (
    BATCHES,
    DESELECTED_FOR_SIMULATOR,
    NATIVE,
    SIMULATOR,
    backend_param,
    batch_id,
)

HERE = Path(__file__).parent
# every native launcher fills its outputs with NaN first: a kernel that leaves memory
# unwritten fails (tests/conftest.py sets a default; here it is not optional)
os.environ["TILESPLAT_POISON"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cuda_sim: the cuda backend in numba's CUDA simulator (its own process)")
    config.addinivalue_line(
        "markers", "backends(*names): the backends a test's `backend` runs (default: native)")


@pytest.hookimpl(tryfirst=True)  # first in every process, so the ids are the same
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        mark = metafunc.definition.get_closest_marker("backends")
        names = mark.args if mark is not None else NATIVE
        metafunc.parametrize("backend", [backend_param(n) for n in names])


@pytest.fixture(params=BATCHES, ids=batch_id)
def batch(request: pytest.FixtureRequest) -> tuple[int, ...]:
    """Leading batch dims of the op's inputs."""
    return request.param


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        ours = HERE in item.path.parents
        simulated = item.get_closest_marker("cuda_sim") is not None
        (drop if ours and simulated != SIMULATOR else keep).append(item)
    if not SIMULATOR:
        config.stash[DESELECTED_FOR_SIMULATOR] = [i.nodeid for i in drop]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
