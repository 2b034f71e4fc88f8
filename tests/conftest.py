import os
import sys

# Kernel tests fill outputs with NaN first (native backends honour it), so a kernel that
# leaves memory unwritten fails loudly.
os.environ.setdefault("TILESPLAT_POISON", "1")
sys.path.insert(0, os.path.dirname(__file__))

# pytest runs on 2 workers (-n 2): one torch thread each, or the workers fight over the cores.
import torch  # noqa: E402

torch.set_num_threads(1)
