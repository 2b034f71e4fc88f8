import os
import sys

# Kernel tests fill outputs with NaN first (native backends honour it), so a kernel that
# leaves memory unwritten fails loudly.
os.environ.setdefault("TILESPLAT_POISON", "1")
sys.path.insert(0, os.path.dirname(__file__))
