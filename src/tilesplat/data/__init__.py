"""Datasets and scenes: Blender/NeRF-synthetic, COLMAP, the built-in synthetic scene, garden,
the textured room of the SfM tests (room.py), and photos to a COLMAP dataset (sfm/, the
``[sfm]`` extra)."""
