"""The CPU kernels leave torch's intra-op thread count as the caller set it.

Numba's OpenMP threading layer, started by the first kernel, sets the process's OpenMP thread
count, which torch's intra-op pool shares; on a shared machine torch ops with more threads
than free cores ran ~30x slower. Checked in a fresh process: the reset happens once.
"""

import os
import subprocess
import sys

CODE = """
import torch
torch.set_num_threads(1)
assert torch.get_num_threads() == 1  # read once before any kernel, as a training loop does
import tilesplat
from tilesplat.data.scenes import load_scene
from tilesplat.ops import fully_fused_projection
sc = load_scene("synthetic:200:32x32")
fully_fused_projection(sc.means, None, sc.quats, sc.scales, sc.viewmats, sc.Ks, 32, 32,
                       backend="cpu")
tilesplat.rasterization(sc.means, sc.quats, sc.scales, sc.opacities, sc.colors,
                        sc.viewmats, sc.Ks, 32, 32, backend="cpu")
print(torch.get_num_threads())
"""


def test_cpu_kernels_keep_torchs_thread_count():
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=600, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == "1", out.stdout + out.stderr
