import os
import sys

# Kernel tests fill outputs with NaN first (native backends honour it), so a kernel that
# leaves memory unwritten fails loudly.
os.environ.setdefault("TILESPLAT_POISON", "1")
sys.path.insert(0, os.path.dirname(__file__))

# pytest runs on 2 workers (-n 2): one torch thread each, or the workers fight over the cores.
import torch  # noqa: E402

torch.set_num_threads(1)

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # numba's CUDA simulator runs a block's threads as Python threads while the launching
    # thread polls them in a busy loop; at Python's default 5 ms switch interval that loop
    # holds the GIL while the threads a barrier (syncthreads, a warp exchange) released wait
    # for it. The simulated tests then took 1-10 min, varying run to run; at 0.2 ms, 40-90 s.
    # (The simulator has a process of its own: helpers.run_in_cuda_simulator.)
    sys.setswitchinterval(2e-4)


import pytest  # noqa: E402


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test, whatever a previous test set (trainer tests: workers
    share 2 cores and torch's intra-op threads spin-wait, ~50x slower); restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
