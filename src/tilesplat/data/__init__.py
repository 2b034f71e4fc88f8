"""Datasets and scenes: Blender/NeRF-synthetic, COLMAP, the built-in synthetic scene, garden."""
