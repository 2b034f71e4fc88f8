"""Edits of the Gaussian set that keep each Adam state aligned with its parameter.

``params`` maps a name to a [N, ...] ``torch.nn.Parameter``; ``optimizers`` maps the same
names to optimisers with one param group each. Every edit builds new Parameters, moves the
optimiser state of the old one to the new one (rows edited the same way, new rows zero, the
shared ``step`` counter kept), and edits the strategy's [N, ...] running-state tensors.
Random draws use the global torch RNG, which checkpoints save.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..ops import elementwise

Params = dict[str, torch.nn.Parameter] | torch.nn.ParameterDict
Optimizers = dict[str, torch.optim.Optimizer]


@torch.no_grad()
def update_params(
    params: Params,
    optimizers: Optimizers,
    param_fn: Callable[[str, Tensor], Tensor],
    optim_fn: Callable[[Tensor], Tensor],
    names: list[str] | None = None,
) -> None:
    """Replace ``params[name]`` by ``param_fn(name, old)`` and its Adam moments by ``optim_fn``."""
    for name in names if names is not None else list(params):
        old = params[name]
        new = torch.nn.Parameter(param_fn(name, old.detach()), requires_grad=old.requires_grad)
        params[name] = new
        opt = optimizers.get(name)
        if opt is None:
            continue
        group = opt.param_groups[0]
        group["params"] = [new]
        st = opt.state.pop(old, None)
        if st is not None:
            opt.state[new] = {
                k: v if k == "step" or not torch.is_tensor(v) or v.dim() == 0 else optim_fn(v)
                for k, v in st.items()
            }


def _edit_state(state: dict, fn: Callable[[Tensor], Tensor]) -> None:
    for key, value in state.items():
        if torch.is_tensor(value) and value.dim() >= 1:
            state[key] = fn(value)


def _zeros_like_rows(v: Tensor, n: int) -> Tensor:
    return torch.zeros((n, *v.shape[1:]), dtype=v.dtype, device=v.device)


@torch.no_grad()
def duplicate(params: Params, optimizers: Optimizers, state: dict, mask: Tensor) -> None:
    """Append a copy of every Gaussian where ``mask`` [N] is true (fresh Adam moments)."""
    sel = torch.where(mask)[0]
    update_params(
        params,
        optimizers,
        lambda _, p: torch.cat([p, p[sel]]),
        lambda v: torch.cat([v, _zeros_like_rows(v, len(sel))]),
    )
    _edit_state(state, lambda v: torch.cat([v, v[sel]]))


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """[N, 4] quaternions (w, x, y, z), any norm -> [N, 3, 3] rotation matrices."""
    w, x, y, z = F.normalize(quats, dim=-1).unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(-1, 3, 3)  # fmt: skip


@torch.no_grad()
def split(
    params: Params,
    optimizers: Optimizers,
    state: dict,
    mask: Tensor,
    revised_opacity: bool = False,
) -> None:
    """Replace every Gaussian where ``mask`` [N] is true by two, drawn from it (3DGS).

    The children sit at the parent's mean plus a sample of its Gaussian, with scales / 1.6;
    they move to the end of the arrays with fresh Adam moments. With ``revised_opacity``
    each child gets opacity ``1 - sqrt(1 - o)`` (arXiv:2404.06109), so the pair composites
    like the parent.
    """
    sel = torch.where(mask)[0]
    rest = torch.where(~mask)[0]
    scales = elementwise.exp(params["scales"][sel])  # [S, 3]
    rot = quat_to_rotmat(params["quats"][sel])  # [S, 3, 3]
    noise = torch.randn(2, len(sel), 3, device=scales.device, dtype=scales.dtype)
    offsets = torch.einsum("sij,sj,bsj->bsi", rot, scales, noise)  # [2, S, 3]

    def param_fn(name: str, p: Tensor) -> Tensor:
        if name == "means":
            children = (p[sel][None] + offsets).reshape(-1, 3)
        elif name == "scales":
            children = elementwise.log(scales / 1.6).repeat(2, 1)
        elif name == "opacities" and revised_opacity:
            child_opacity = 1.0 - torch.sqrt(1.0 - elementwise.sigmoid(p[sel]))
            children = elementwise.logit(child_opacity).repeat(2, *([1] * (p.dim() - 1)))
        else:
            children = p[sel].repeat(2, *([1] * (p.dim() - 1)))
        return torch.cat([p[rest], children])

    update_params(
        params,
        optimizers,
        param_fn,
        lambda v: torch.cat([v[rest], _zeros_like_rows(v, 2 * len(sel))]),
    )
    _edit_state(state, lambda v: torch.cat([v[rest], v[sel].repeat(2, *([1] * (v.dim() - 1)))]))


@torch.no_grad()
def remove(params: Params, optimizers: Optimizers, state: dict, mask: Tensor) -> None:
    """Delete every Gaussian where ``mask`` [N] is true."""
    keep = torch.where(~mask)[0]
    update_params(params, optimizers, lambda _, p: p[keep], lambda v: v[keep])
    _edit_state(state, lambda v: v[keep])


@torch.no_grad()
def reorder(params: Params, optimizers: Optimizers, state: dict, order: Tensor,
            rows: list[str]) -> None:
    """Permute the Gaussians in place: row i becomes row ``order[i]`` [N] (a permutation of
    0..N-1), in the parameters (and any gradient), their Adam moments and the strategy's
    per-Gaussian ``state`` entries named in ``rows`` (``Strategy.row_state``). The
    parameters and moments stay the same tensors, so one temporary copy is alive at a time."""
    for name, p in params.items():
        p.copy_(p[order])
        if p.grad is not None:
            p.grad = p.grad[order]
        opt = optimizers.get(name)
        for v in (opt.state.get(p, {}) if opt is not None else {}).values():
            if torch.is_tensor(v) and v.dim() > 0:  # not the shared step counter
                v.copy_(v[order])
    for key in rows:
        state[key] = state[key][order]


@torch.no_grad()
def reset_opacity(params: Params, optimizers: Optimizers, value: float) -> None:
    """Clamp every opacity to at most ``value`` (post-sigmoid) and zero its Adam moments."""
    logit = math.log(value / (1.0 - value))
    update_params(
        params,
        optimizers,
        lambda _, p: p.clamp(max=logit),
        torch.zeros_like,
        names=["opacities"],
    )


def relocation_table(n_max: int) -> Tensor:
    """[n_max + 1, n_max] float64: row n holds the coefficients of opacity^(k+1), k < n.

    Equation 9 of 3DGS-MCMC (Kheradmand et al. 2024): a Gaussian cloned into n copies keeps
    its rendered footprint when each copy has opacity ``1 - (1 - o)^(1/n)`` and scale
    ``o / (sum_{i=1..n} sum_{k<i} C(i-1, k) (-1)^k o_new^(k+1) / sqrt(k+1)) * scale``.
    The double sum regroups as ``sum_k coef[n, k] o_new^(k+1)``.
    """
    coef = torch.zeros(n_max + 1, n_max, dtype=torch.float64)
    for n in range(1, n_max + 1):
        for i in range(1, n + 1):
            for k in range(i):
                coef[n, k] += math.comb(i - 1, k) * (-1.0) ** k / math.sqrt(k + 1)
    return coef


def compute_relocation(
    opacities: Tensor,  # [S]
    scales: Tensor,  # [S, 3]
    ratios: Tensor,  # [S] int, copies each Gaussian becomes
    table: Tensor,  # from relocation_table
) -> tuple[Tensor, Tensor]:
    """New (opacities [S], scales [S, 3]) of Gaussians split into ``ratios`` copies."""
    n_max = table.shape[1]
    n = ratios.clamp(1, n_max).long()
    o = opacities.double()
    new_o = 1.0 - (1.0 - o).pow(1.0 / n.double())
    exponents = torch.arange(1, n_max + 1, dtype=torch.float64, device=o.device)
    powers = new_o[:, None].pow(exponents[None])
    denom = (table.to(o.device)[n] * powers).sum(dim=1)
    new_scales = (o / denom)[:, None] * scales.double()
    return new_o.to(opacities.dtype), new_scales.to(scales.dtype)


def _sample(weights: Tensor, n: int) -> Tensor:
    return torch.multinomial(weights, n, replacement=True)


@torch.no_grad()
def relocate(
    params: Params,
    optimizers: Optimizers,
    dead: Tensor,  # [N] bool
    table: Tensor,
    min_opacity: float,
) -> None:
    """Move the ``dead`` Gaussians onto live ones sampled by opacity (3DGS-MCMC).

    A sampled Gaussian and the dead ones moved onto it share its footprint (equation 9);
    their Adam moments restart.
    """
    opac = elementwise.sigmoid(params["opacities"])
    dead_idx = dead.nonzero(as_tuple=True)[0]
    alive_idx = (~dead).nonzero(as_tuple=True)[0]
    if len(dead_idx) == 0 or len(alive_idx) == 0:
        return
    target = alive_idx[_sample(opac[alive_idx], len(dead_idx))]
    counts = torch.bincount(target, minlength=len(opac))[target] + 1
    scales = elementwise.exp(params["scales"][target])
    new_o, new_s = compute_relocation(opac[target], scales, counts, table)
    new_o = new_o.clamp(min=min_opacity, max=1.0 - torch.finfo(torch.float32).eps)

    def param_fn(name: str, p: Tensor) -> Tensor:
        p = p.clone()
        if name == "opacities":
            p[target] = elementwise.logit(new_o)
        elif name == "scales":
            p[target] = elementwise.log(new_s)
        p[dead_idx] = p[target]
        return p

    def optim_fn(v: Tensor) -> Tensor:
        v = v.clone()
        v[target] = 0
        v[dead_idx] = 0
        return v

    update_params(params, optimizers, param_fn, optim_fn)


@torch.no_grad()
def sample_add(
    params: Params, optimizers: Optimizers, n: int, table: Tensor, min_opacity: float
) -> None:
    """Append ``n`` Gaussians cloned from ones sampled by opacity (3DGS-MCMC)."""
    opac = elementwise.sigmoid(params["opacities"])
    target = _sample(opac, n)
    counts = torch.bincount(target, minlength=len(opac))[target] + 1
    scales = elementwise.exp(params["scales"][target])
    new_o, new_s = compute_relocation(opac[target], scales, counts, table)
    new_o = new_o.clamp(min=min_opacity, max=1.0 - torch.finfo(torch.float32).eps)

    def param_fn(name: str, p: Tensor) -> Tensor:
        p = p.clone()
        if name == "opacities":
            p[target] = elementwise.logit(new_o)
        elif name == "scales":
            p[target] = elementwise.log(new_s)
        return torch.cat([p, p[target]])

    update_params(params, optimizers, param_fn, lambda v: torch.cat([v, _zeros_like_rows(v, n)]))


@torch.no_grad()
def inject_noise(params: Params, scale: float) -> None:
    """Move the means by noise shaped by each covariance, mostly for transparent Gaussians.

    ``noise = scale * sigmoid(100 (1 - opacity - 0.995)) * Sigma @ randn`` (3DGS-MCMC).
    """
    opac = elementwise.sigmoid(params["opacities"])
    rot = quat_to_rotmat(params["quats"])
    s2 = elementwise.exp(params["scales"]).square()
    covars = rot @ (s2[:, :, None] * rot.transpose(1, 2))  # R diag(s^2) R^T, [N, 3, 3]
    gate = elementwise.sigmoid(100.0 * ((1.0 - opac) - 0.995))
    noise = torch.randn_like(params["means"]) * gate[:, None] * scale
    params["means"].add_(torch.einsum("nij,nj->ni", covars, noise))
