"""File formats: splat files (PLY in the 3DGS layout, ``.splat``, ``.spz``) behind one suffix
table (:mod:`.gaussians`), images, and the atomic writes every file goes through."""
