"""Test-time pose alignment (``test_pose_align_steps`` > 0): score each test view at the pose
that best explains its image, with the model held fixed.

With ``pose_opt`` the training cameras move to where the model explains them best, and the
model's frame moves with them; a test view at its given pose then sees the model slightly
off, and its PSNR measures that offset as much as the model. Asked for, the evaluation first
fits a correction of each test camera, the same SE(3) correction ``pose_opt`` learns
(:func:`.pose_opt.correction_matrices`, in the camera's own frame, starting at zero), by
``test_pose_align_steps`` Adam steps on the L1 photometric loss of that one view at rate
``test_pose_align_lr``, the Gaussians frozen; then it scores the view at the corrected pose.
The default (0) scores at the given poses, as gsplat's evaluation does. Nothing of the model
changes and nothing is written but the scores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...data.frames import Frame
from ...keys import Key
from .. import seams
from .pose_opt import correction_matrices

if TYPE_CHECKING:
    from ..models.base import Render


KEYS = (
    Key("test_pose_align_steps", 0, "test-time pose alignment: Adam steps that fit each evaluated "
        "view's pose to its image with the model fixed before it is scored "
        "(train/features/pose_align.py); 0: the given poses", ge=0),
    Key("test_pose_align_lr", 1e-3, "test-time pose alignment: Adam learning rate of each view's "
        "correction", gt=0.0),
)
seams.register_keys("test-time pose alignment (train/features/pose_align.py)", KEYS)


def aligned_frame(
    frame: Frame, render: Callable[[Frame], Render], steps: int, lr: float
) -> Frame:
    """``frame`` at the pose that ``steps`` Adam steps on its L1 loss find (the model held
    fixed; ``render(frame)`` renders the view with gradients to its viewmat); ``frame``
    itself when ``steps`` is 0.

    The viewmat is [4, 4] world-to-camera; the correction multiplies it from the left.
    """
    if steps <= 0:
        return frame
    given = frame.viewmat.detach()
    target = frame.image.float()
    delta = torch.zeros((1, 6), dtype=given.dtype, device=given.device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    for _ in range(steps):
        view = dataclasses.replace(frame, viewmat=correction_matrices(delta)[0] @ given)
        colors = render(view).colors[0]
        loss = (colors - target.to(colors.device)).abs().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        viewmat: Tensor = correction_matrices(delta)[0] @ given
    return dataclasses.replace(frame, viewmat=viewmat.detach())
