"""Training features around the render (appearance, pose, depth, the averaged model) and the
schedules the step follows (resolution, early stop).

Importing this package registers every feature and the config checks of the schedules; the
seam itself is :mod:`.base`.
"""

from . import (  # noqa: F401  (each registers itself)
    appearance,
    averaging,
    camera_mode,
    depth_loss,
    early_stop,
    pose_align,
    pose_opt,
    resolution,
    spatial_order,
)
