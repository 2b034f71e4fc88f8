"""File formats: PLY in the original 3DGS layout."""
