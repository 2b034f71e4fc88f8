"""Training recipes: named presets of config keys (``recipe`` key).

A recipe is a variant of the ``recipe`` seam whose ``PRESET`` is a table of keys and values.
Setting ``recipe`` (in a TOML file or with ``--set``) sets the keys of its table first; every
other key given in the same place (the same file, the same ``--set`` list) is applied after
it, so a recipe's part can be switched off on its own (``--set recipe=fast --set
resolution_start=1``: the fast recipe without its resolution schedule). Choosing ``3dgs`` sets
the keys the other recipes change back to their defaults (:func:`.seams.preset`).

- ``3dgs``: the paper's recipe, as gsplat's simple trainer (the defaults).
- ``fast``: the same quality in less time (docs/training.md, "The fast recipe"): a run of its
  own length (1,100 steps, 0.37 of the 3DGS recipe's, ended sooner when the test PSNR of 5
  test views stops rising: ``early_stop_patience``, ``eval_max_views``) within a Gaussian
  budget (``strategy = "budget"``, ``cap_max``, more on large images: ``cap_per_pixel``),
  coarse images first (the resolution schedule, longer on larger images:
  ``resolution_ref_pixels``), densification early and often by the absolute screen-space
  gradient (AbsGS) from fewer random initial points, a split's children at the opacity that
  composites like their parent (``revised_opacity``), the SH degree raised every 250 steps,
  Adam with shorter memories (``adam_beta1``, ``adam_beta2``), three to four times the
  learning rates, the means' rate decaying tenfold instead of a hundredfold
  (``means_lr_final``), every other rate annealed to a tenth over the last fifth of the run
  (``lr_anneal_from``), and the moving average of the parameters as the model
  (``ema_decay``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from . import seams

FAST: dict[str, Any] = {
    # its own length: 1,100 steps, 0.37 of the 3DGS recipe's 3,000. It was 1,200 (0.4) until
    # the split's opacity and the means' rate below raised every scene's PSNR; garden-views,
    # whose steps cost the most (324x210 images, 54,000 Gaussians), then took 0.34 of the
    # 3DGS recipe's CPU time at 1,200 steps and 0.30-0.33 at 1,100, still above the 3DGS
    # recipe's PSNR or within 0.08 dB of it (docs/training.md, "The length"). Its schedules
    # follow: the resolution schedule and the means' rate decay are fractions of the steps,
    # the densification window and the SH schedule below are whole by step 750
    "steps": 1100,
    # ... and it ends sooner when the held-out (test) PSNR, measured every 220 steps (a fifth
    # of the run, so that the last evaluation is the last step's and the history's curve
    # reaches the end), has not risen by early_stop_min_db (0.02 dB) in 2 evaluations (440
    # steps); the evaluations change no trained bit
    "eval_every": 220,
    "early_stop_patience": 2,
    # ... over at most 5 of the test views (the same ones each time, evenly spaced; the run's
    # end still scores every view): the evaluations during training are this recipe's own
    # cost, which the 3DGS recipe (one evaluation, at the end) does not pay. Over all of
    # garden-views' 15 views the five took ~1.2 s of its ~37 s run; over 5, a third. On a
    # capture of 6 MP images and 30 test views, each view a second's render on the CPU, the
    # five evaluations would cost minutes
    "eval_max_views": 5,
    # a Gaussian budget: growth within a count that rises linearly from the count at
    # refine_start (100) to cap_max at refine_stop (700), the candidates with the largest
    # gradients first (strategy/budget.py): AbsGS's growth has no bound of its own, and a
    # textured capture's count, with every step's cost, grew past the 3DGS recipe's. The
    # built-in scene ends under it (10,300 Gaussians); the tests' room (70,000 with the 3DGS
    # recipe) ends at it, 0.14 dB below the 3DGS recipe in 0.32 of its wall time (20,000:
    # 0.54 dB below in 0.22). Measured again on four scenes by CPU time (docs/training.md,
    # "Four scenes, two of them unseen"): 0.22-0.32 of the 3DGS run's; an OPENCV capture
    # +0.09/+0.11 dB, the room +0.24/-0.26 (seeds 0/1), garden-views (budget-bound at
    # 37,500) -0.13 and +0.10 with cap_max 60,000 (0.26 of the time). Ranking the
    # candidates by the views that ask for them (budget_score = "views") cost 0.63 dB there
    "strategy": "budget",
    "cap_max": 40_000,
    # ... and at least 0.88 Gaussians per pixel of the largest training image (the budget
    # tied to the image size): garden-views' 324x210 gets 59,900 (there a cap of 60,000 ended
    # +0.10 dB at 0.26 of the time where 40,000 ended -0.13 dB at 0.22); images under
    # 45,500 pixels keep cap_max (the room, the capture tests, the built-in scene)
    "cap_per_pixel": 0.88,
    # coarse images first: over its 1,100 steps, 1/4 size until step 74, 1/2 until 147, then
    # full (DashGaussian): the coarse steps cost a fraction of a full one while the set of
    # Gaussians still grows
    "resolution_start": 4,
    "resolution_full_at": 0.2,
    # ... longer on larger images: a largest training image of P > 16,000 pixels stretches
    # that span to 0.2 x P / 16,000 = P / 80,000 of the steps (at most 0.9). A step's cost
    # there is mostly per pixel, and the coarse levels still hold many pixels: on garden-views
    # (68,040 pixels, span 0.85: a quarter size to step 311, a half to 623) the run took 10-20 %
    # less CPU than with the span 0.27 of P / 250,000 (the reference was 50,000 until then),
    # at +0.07 to +0.48 dB over the 3DGS recipe; the built-in scene (span 0.5), the room at
    # 256x192 (0.61) and the object at 288x288 (0.9) stayed 0.13-0.45 dB above it
    # (docs/training.md, "A longer coarse phase"). Images under 16,000 pixels keep the span
    # of 0.2 (the room and the OPENCV capture at 128x96, the fisheye capture at 141x105). The
    # earlier reference of 50,000: the room at 512x384 came to 0.29 of the 3DGS recipe's cost
    # instead of 0.375 ("The schedule on large images")
    "resolution_ref_pixels": 16_000,
    # densify from step 100 to 700, every 50 steps: the set of Gaussians is whole early
    "refine_start": 100,
    "refine_stop": 700,
    "refine_every": 50,
    # grow by the absolute screen-space gradient (AbsGS) at its threshold: fewer Gaussians
    # (10,000 instead of 19,000 on the built-in scene), each step cheaper, the same quality
    "absgrad": True,
    "grow_grad2d": 8e-4,
    # a split's two children each get opacity 1 - sqrt(1 - o), so that the pair composites
    # like its parent (Bulo et al., "Revising Densification in Gaussian Splatting"): a split
    # no longer brightens what the steps had fitted. Against the recipe without it, over
    # three seeds (docs/training.md, "The split's opacity"): +0.29 to +0.37 dB on the
    # built-in scene, -0.03 to -0.12 on garden-views, and on the two scenes not tuned on
    # +0.12 to +0.40 (the room) and +0.16 to +0.29 (the OPENCV capture), at the same cost
    "revised_opacity": True,
    # a random initialisation of 3,000 points instead of 10,000 (pruned to ~2,900 by step
    # 300 either way): the first steps cost less (a dataset's own points are unaffected)
    "init_points": 3000,
    # the SH degree raised every 250 steps (degree 3 by step 750)
    "sh_degree_interval": 250,
    # Adam with shorter memories (beta1 0.7, beta2 0.99 instead of 0.9, 0.999): its steps
    # follow the gradients of a short schedule, whose Gaussians are new and moving, sooner;
    # with them the rates rise to four times the 3DGS ones (three for the opacities and the
    # higher SH), and the model evaluated and exported is the moving average of the
    # parameters over ~50 steps (train/features/averaging.py), which takes out the jitter of the
    # higher rates: 35.2 dB on the built-in scene at 950-1,000 steps instead of 1,100-1,200
    # (the 3DGS betas, three times the rates) and ~1,400 (twice the rates, no average)
    "adam_beta1": 0.7,
    "adam_beta2": 0.99,
    "means_lr": 6.4e-4,
    # ... the means' rate decaying to 0.1 of it by the last step instead of the 3DGS recipe's
    # 0.01: over 1,200 steps the hundredfold decay left the means at 5 % of their rate from
    # step 800 on, while the test PSNR still rose. Against 0.01, with the split's opacity
    # above (docs/training.md, "The means' rate"): +0.2 to +0.3 dB on the built-in scene,
    # +0.04 to +0.13 on garden-views, and on the scenes not tuned on +0.46 to +0.54 (the room)
    # and +0.20 (the capture); 0.02 / 0.05 / 0.2 were tried on the tuning scenes
    "means_lr_final": 0.1,
    # ... and every other rate falling linearly to a tenth over the last fifth of the run (an
    # anneal, as the schedules of short runs in other fields end): the steps then settle
    # what the higher rates had left moving. Against the recipe without it, over three seeds
    # (docs/training.md, "The anneal"): +0.11 to +0.19 dB on the room, the room at 256x192
    # and the OPENCV capture, -0.02 to -0.01 on garden-views, -0.06 to -0.01 on the built-in
    # scene
    "lr_anneal_from": 0.8,
    "lr_anneal_to": 0.1,
    "scales_lr": 2e-2,
    "quats_lr": 4e-3,
    "opacities_lr": 0.15,
    "sh0_lr": 1e-2,
    "shN_lr": 3.75e-4,
    "ema_decay": 0.98,
}



@seams.register("recipe", "3dgs")
class ThreeDGS:
    """The paper's recipe, as gsplat's simple trainer: every key at its default."""

    PRESET: ClassVar[dict[str, Any]] = {}


@seams.register("recipe", "fast")
class Fast:
    """The same quality in less time (docs/training.md, "The fast recipe")."""

    PRESET: ClassVar[dict[str, Any]] = FAST
