import os
import sys

# Kernel tests fill outputs with NaN first (native backends honour it), so a kernel that
# leaves memory unwritten fails loudly.
os.environ.setdefault("TILESPLAT_POISON", "1")
sys.path.insert(0, os.path.dirname(__file__))

# pytest runs on 2 workers (-n 2): one torch thread each, or the workers fight over the cores.
import torch  # noqa: E402

torch.set_num_threads(1)

# numba's CUDA simulator runs a block's threads as Python threads. Its barriers are counting
# barriers the threads release themselves (backends/cuda/simulator_blocks.py), so Python's
# default switch interval suits it: a shorter one (0.2 ms, needed while the launching thread
# polled the block) made the simulated op tests 1.4-1.6x slower (125-143 s against 173-224 s).


import pytest  # noqa: E402


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test, whatever a previous test set (trainer tests: workers
    share 2 cores and torch's intra-op threads spin-wait, ~50x slower); restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
