"""Runs the op tests' ``cuda-sim`` parameters in numba's CUDA simulator, in a subprocess.

numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported and other tests
import numba in this process, so the simulator gets its own (``helpers.run_in_cuda_simulator``:
no xdist, a timeout, nothing may skip). Every cuda-sim test this run deselected must pass there.
"""

import importlib.util

import pytest

from helpers import run_in_cuda_simulator

from .parity import DESELECTED_FOR_SIMULATOR


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                    reason="numba-cuda is not installed (pip install 'tilesplat[cuda]')")
def test_cuda_sim_parameters_pass_in_the_simulator(request: pytest.FixtureRequest) -> None:
    passed = run_in_cuda_simulator([str(request.path.parent)], str(request.config.rootpath))
    expected = request.config.stash.get(DESELECTED_FOR_SIMULATOR, [])
    missing = sorted(set(expected) - set(passed))
    assert not missing, f"{len(missing)} cuda-sim tests did not pass in the simulator: {missing}"
    assert passed and all("cuda-sim" in nodeid for nodeid in passed), passed[:5]
