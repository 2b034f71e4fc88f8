"""The trained model: its parameters, their optimisers, and what the rasterizer takes of them.

``params`` maps ``means`` [N, 3], ``scales`` [N, 3] (log), ``quats`` [N, 4],
``opacities`` [N] (logits), ``sh0`` [N, 1, 3] and ``shN`` [N, K - 1, 3] to
``torch.nn.Parameter``; each has its own Adam (one param group), as in gsplat's simple
trainer, so that densification can edit one array and its moments together. Every model
kind (``models/``) stores these parameters; how they render is the kind's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...keys import Key
from ...ops import elementwise
from ...optimizers.fused_adam import FusedAdam
from .. import seams

if TYPE_CHECKING:
    from ..config import TrainConfig

PARAM_NAMES = ("means", "scales", "quats", "opacities", "sh0", "shN")
Params = dict[str, torch.nn.Parameter]
Optimizers = dict[str, torch.optim.Optimizer]

KEYS = (
    Key("means_lr", 1.6e-4, "Adam learning rate of the means, times the scene scale", ge=0.0),
    Key("means_lr_final", 0.01, "factor the means' rate decays to by the last step "
        "(exponentially)", gt=0.0, le=1.0),
    Key("lr_anneal_from", 1.0, "fraction of the steps after which the rates of the scales, "
        "rotations, opacities and colours fall linearly to lr_anneal_to times their own by "
        "the last step (1: they stay constant, as in 3DGS)", ge=0.0, le=1.0),
    Key("lr_anneal_to", 0.1, "factor those rates reach at the last step (lr_anneal_from)",
        gt=0.0, le=1.0),
    Key("scales_lr", 5e-3, "Adam learning rate of the log-scales", ge=0.0),
    Key("quats_lr", 1e-3, "Adam learning rate of the quaternions", ge=0.0),
    Key("opacities_lr", 5e-2, "Adam learning rate of the opacity logits", ge=0.0),
    Key("sh0_lr", 2.5e-3, "Adam learning rate of the SH degree-0 coefficients", ge=0.0),
    Key("shN_lr", 2.5e-3 / 20, "Adam learning rate of the higher SH coefficients", ge=0.0),
    Key("adam_beta1", 0.9, "Adam's decay of the first moment of the Gaussians' parameters; a "
        "batch of B views uses 1 - B * (1 - value), as gsplat scales it", ge=0.0, lt=1.0),
    Key("adam_beta2", 0.999, "Adam's decay of the second moment (scaled for the batch like "
        "adam_beta1)", ge=0.0, lt=1.0),
)
seams.register_keys("the Gaussians' optimisers (train/models/splats.py)", KEYS)


def base_learning_rates(cfg: TrainConfig, scene_scale: float) -> dict[str, float]:
    """Per-parameter Adam rates at step 0 (the means' rate is relative to the scene size)."""
    return {
        "means": cfg.means_lr * scene_scale,
        "scales": cfg.scales_lr,
        "quats": cfg.quats_lr,
        "opacities": cfg.opacities_lr,
        "sh0": cfg.sh0_lr,
        "shN": cfg.shN_lr,
    }


def means_lr_factor(cfg: TrainConfig, step: int) -> float:
    """Exponential decay of the means' rate: 1 at step 0, ``means_lr_final`` at ``steps``."""
    return cfg.means_lr_final ** (step / cfg.steps)


def anneal_factor(cfg: TrainConfig, step: int) -> float:
    """The factor of every rate but the means' at ``step``: 1 until ``lr_anneal_from`` of
    the steps, then linear to ``lr_anneal_to`` at the last step."""
    start = cfg.lr_anneal_from * cfg.steps
    if step <= start or cfg.lr_anneal_from >= 1.0:
        return 1.0
    done = min(1.0, (step - start) / (cfg.steps - start))
    return 1.0 - (1.0 - cfg.lr_anneal_to) * done


def make_params(tensors: dict[str, Tensor], device: torch.device | str = "cpu") -> Params:
    """Trainable Parameters from plain tensors (copied, float32, on ``device``)."""
    missing = [k for k in PARAM_NAMES if k not in tensors]
    if missing:
        raise ValueError(f"model parameters missing: {missing}")
    bad = [k for k in PARAM_NAMES if not isinstance(tensors[k], Tensor)]
    if bad:
        raise ValueError(f"model parameters are not tensors: {bad}")
    return {
        k: torch.nn.Parameter(tensors[k].detach().to(device, torch.float32, copy=True))
        for k in PARAM_NAMES
    }


def check_params(tensors: dict[str, Any], sh_degree: int) -> int:
    """Checks the names, shapes, dtypes and finiteness of stored model parameters; returns N.

    Raises:
        ValueError: naming the first parameter that is missing or malformed.
    """
    if not isinstance(tensors, dict):
        raise ValueError("model parameters must be a dict of tensors")
    k = (sh_degree + 1) ** 2
    for name in PARAM_NAMES:
        t = tensors.get(name)
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise ValueError(f"model parameter {name!r} is missing or not a float tensor")
    n = int(tensors["means"].shape[0]) if tensors["means"].dim() == 2 else -1
    want = {
        "means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,),
        "sh0": (n, 1, 3), "shN": (n, k - 1, 3),
    }  # fmt: skip
    for name, shape in want.items():
        if n < 1 or tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"model parameter {name!r} has shape {list(tensors[name].shape)}, expected "
                f"{list(shape)} (N Gaussians, SH degree {sh_degree})"
            )
        if not bool(torch.isfinite(tensors[name]).all()):
            raise ValueError(f"model parameter {name!r} holds NaN or infinite values")
    return n


def make_optimizers(params: Params, cfg: TrainConfig, scene_scale: float) -> Optimizers:
    """One Adam per parameter; rates and betas scaled for the batch size as gsplat does."""
    bs = cfg.batch_size
    lrs = base_learning_rates(cfg, scene_scale)
    betas = adam_betas(cfg)
    return {
        # torch's fused kernel (one per step: ~6x faster than the per-tensor loop on a CPU)
        # on a short Python path (optimizers/fused_adam.py)
        name: FusedAdam(
            [{"params": [params[name]], "lr": lrs[name] * math.sqrt(bs), "name": name}],
            eps=1e-15 / math.sqrt(bs),
            betas=betas,
        )
        for name in PARAM_NAMES
    }


def adam_betas(cfg: TrainConfig) -> tuple[float, float]:
    """(beta1, beta2) of the Gaussians' Adams: ``adam_beta1`` and ``adam_beta2`` for a batch
    of one view, ``1 - B * (1 - beta)`` (at least 0) for a batch of B, as gsplat scales them.
    ``1 - beta`` is rounded to 12 digits, so that the defaults give gsplat's 0.9 and 0.999
    exactly, at every batch size."""
    bs = cfg.batch_size
    b1, b2 = (max(0.0, 1.0 - bs * round(1.0 - b, 12)) for b in (cfg.adam_beta1, cfg.adam_beta2))
    return b1, b2


def set_learning_rates(
    optimizers: Optimizers, cfg: TrainConfig, scene_scale: float, step: int
) -> float:
    """Set the rates for ``step``: the means' decays over the whole run (``means_lr_final``),
    the others only in the anneal at its end (``lr_anneal_from``; they stay constant by
    default); returns the means' rate. A rate held as a tensor (a CUDA graph's,
    ``train/step/cuda_graph.py``) is filled in place."""
    lr = means_rate(cfg, scene_scale, step)
    rates = {"means": lr}
    if cfg.lr_anneal_from < 1.0:
        factor = anneal_factor(cfg, step) * math.sqrt(cfg.batch_size)
        base = base_learning_rates(cfg, scene_scale)
        rates.update((name, base[name] * factor) for name in PARAM_NAMES if name != "means")
    for name, rate in rates.items():
        group = optimizers[name].param_groups[0]
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(rate)
        else:
            group["lr"] = rate
    return lr


def means_rate(cfg: TrainConfig, scene_scale: float, step: int) -> float:
    """The means' learning rate at ``step`` (decayed, scaled for the batch size)."""
    lr = base_learning_rates(cfg, scene_scale)["means"] * means_lr_factor(cfg, step)
    return lr * math.sqrt(cfg.batch_size)


def activated(params: Params | dict[str, Tensor], *, split_sh: bool = False) -> dict[str, Any]:
    """The rasterizer's inputs from the stored parameters: ``means``, ``quats``, ``scales``
    [N, 3] (exp of the logs), ``opacities`` [N] (sigmoid of the logits) and ``colors``
    [N, K, 3] (the SH coefficients, DC first), or with ``split_sh`` the pair (``sh0``,
    ``shN``) that ``rasterization`` evaluates without concatenating them (the same bits,
    without a copy of the coefficients and of their gradient each step)."""
    sh = params["sh0"], params["shN"]
    return {
        "means": params["means"],
        "quats": params["quats"],
        "scales": elementwise.exp(params["scales"]),
        "opacities": elementwise.sigmoid(params["opacities"]),
        "colors": sh if split_sh else torch.cat(sh, dim=1),
    }


def check_optimizer_states(states: object, shapes: dict[str, tuple[int, ...]]) -> None:
    """Checks a checkpoint's Adam states (one per parameter, as ``state_dict()`` gives them)
    against the parameters' ``shapes``: one param group, moments ``exp_avg`` and
    ``exp_avg_sq`` finite float tensors of the parameter's shape, ``step`` a number.

    Raises:
        ValueError: naming the first state that is missing or malformed.
    """
    if not isinstance(states, dict):
        raise ValueError("the checkpoint holds no optimizer states")
    for name, shape in shapes.items():
        st = states.get(name)
        if (not isinstance(st, dict) or not isinstance(st.get("state"), dict)
                or not isinstance(st.get("param_groups"), list) or len(st["param_groups"]) != 1
                or not isinstance(st["param_groups"][0], dict)):
            raise ValueError(f"the checkpoint has no optimizer state for {name!r} (a dict of "
                             "'state' and one of 'param_groups')")
        for moments in st["state"].values():
            if not isinstance(moments, dict):
                raise ValueError(f"optimizer state of {name!r}: expected a dict of moments, "
                                 f"got {type(moments).__name__}")
            for key in ("exp_avg", "exp_avg_sq"):
                m = moments.get(key)
                if m is None:
                    continue
                if (not isinstance(m, Tensor) or not m.is_floating_point()
                        or tuple(m.shape) != tuple(shape)):
                    got = list(m.shape) if isinstance(m, Tensor) else type(m).__name__
                    raise ValueError(f"optimizer state {name}.{key} is {got}, expected a float "
                                     f"tensor of shape {list(shape)}")
                if not bool(torch.isfinite(m).all()):
                    raise ValueError(f"optimizer state {name}.{key} holds NaN or infinite values")
            step = moments.get("step", 0)
            if isinstance(step, Tensor):
                step = step.item() if step.numel() == 1 else None
            if isinstance(step, bool) or not isinstance(step, (int, float)) or not step >= 0:
                raise ValueError(f"optimizer state {name}.step must be a number >= 0, got "
                                 f"{moments.get('step')!r}")


def restore_model(
    ckpt: dict[str, Any], cfg: TrainConfig, device: torch.device | str = "cpu"
) -> tuple[Params, Optimizers]:
    """Parameters and Adam states of a checkpoint, on ``device``.

    Raises:
        ValueError: the checkpoint lacks a parameter or an optimiser state.
    """
    params = make_params(ckpt["params"], device=device)
    optimizers = make_optimizers(params, cfg, float(ckpt["scene_scale"]))
    states = ckpt.get("optimizers")
    check_optimizer_states(states, {k: tuple(p.shape) for k, p in params.items()})
    for name, opt in optimizers.items():
        try:
            opt.load_state_dict(states[name])  # moves the moments to the parameter's device
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"optimizer state of {name!r} does not load: {exc}") from None
    return params, optimizers
