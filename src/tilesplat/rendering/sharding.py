"""Model-parallel rendering (``rasterization(distributed=True)``), as gsplat 1.5.3 does it
after Grendel (arXiv 2406.18533): each rank holds a shard of the Gaussians and its own
cameras.

1. :func:`gather_cameras`: every rank gets every rank's cameras (rank 0's first);
2. each rank projects its shard into all cameras (``rendering.py``);
3. :func:`exchange_unpacked` / :func:`exchange_packed`: the projected Gaussians of each
   camera go to the rank that owns the camera (a differentiable all-to-all with split
   sizes, ``tilesplat.distributed``), so each rank rasterizes its own cameras with every
   rank's Gaussians; the backward routes the gradients back to the shard that owns them.

Unlike gsplat, ranks may hold different numbers of cameras (and of Gaussians, as in gsplat).
Before anything is exchanged, :func:`check_same_form` compares what every rank asked for
(3DGUT, its lens tensors, packed, the colours' width, the SH degree): a rank that differs
ends every rank's call with a ValueError instead of a hang.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..distributed import all_gather_int32, all_gather_tensor_list, all_to_all_tensor_list


def world() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "rasterization(distributed=True) needs an initialised torch.distributed process "
            "group (torch.distributed.init_process_group, or run under torchrun)"
        )
    return dist.get_rank(), dist.get_world_size()


_FORM_FLAGS = ("with_ut", "with_eval3d", "packed", "radial_coeffs", "tangential_coeffs",
               "thin_prism_coeffs", "viewmats_rs")
_COLOR_SHIFT, _SH_SHIFT = len(_FORM_FLAGS), len(_FORM_FLAGS) + 16


def render_form(ut: Any, packed: bool, colors: Tensor, sh_degree: int | None) -> int:
    """What must agree across ranks for their collectives to match, as one 32-bit integer:
    the 3DGUT flags and which lens tensors ``ut`` (a ``ut.UTRender`` or None) holds,
    ``packed``, the colours' last dimension and the SH degree."""
    on = [ut is not None and ut.with_ut, ut is not None and ut.with_eval3d, packed]
    on += [ut is not None and ut.camera.get(k) is not None for k in _FORM_FLAGS[3:]]
    flags = sum(1 << i for i, f in enumerate(on) if f)
    channels = min(int(colors.shape[-1]), (1 << 16) - 1)
    sh = 0 if sh_degree is None else sh_degree + 1
    return flags | channels << _COLOR_SHIFT | sh << _SH_SHIFT


def _describe(form: int) -> str:
    flags = [n for i, n in enumerate(_FORM_FLAGS) if form >> i & 1]
    sh = (form >> _SH_SHIFT) - 1
    return (f"{', '.join(flags) or 'plain 3DGS'}; colours' last dim "
            f"{form >> _COLOR_SHIFT & 0xFFFF}; sh_degree {'None' if sh < 0 else sh}")


def check_same_form(world_size: int, rank: int, form: int, device: torch.device) -> None:
    """ValueError on every rank when the ranks' :func:`render_form` differ (their gathers
    would otherwise wait on each other or exchange rows of different widths)."""
    forms = all_gather_int32(world_size, form, device=device)
    if any(f != form for f in forms):
        other = next(r for r, f in enumerate(forms) if f != forms[rank])
        raise ValueError(
            f"rasterization(distributed=True): every rank must render the same way; rank "
            f"{rank} renders ({_describe(forms[rank])}) and rank {other} "
            f"({_describe(forms[other])})")


def gather_cameras(
    world_size: int,
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    n_gaussians: int,
) -> tuple[Tensor, Tensor, list[int], list[int]]:
    """Every rank's cameras: (viewmats [C_all, 4, 4], Ks [C_all, 3, 3], cameras per rank,
    Gaussians per rank)."""
    device = viewmats.device
    n_cams = all_gather_int32(world_size, int(viewmats.shape[0]), device=device)
    n_gauss = all_gather_int32(world_size, int(n_gaussians), device=device)
    viewmats_all, Ks_all = all_gather_tensor_list(world_size, [viewmats, Ks])
    return viewmats_all, Ks_all, n_cams, n_gauss


def exchange_unpacked(
    world_size: int,
    rank: int,
    n_cams: list[int],
    n_gauss: list[int],
    tensors: list[Tensor],  # each [C_all, N_rank, *]
) -> list[Tensor]:
    """Unpacked projections [C_all, N_rank, *] of this rank's Gaussians -> [C_own, N_all, *]:
    this rank's cameras with every rank's Gaussians (rank 0's first)."""
    n_local = n_gauss[rank]
    c_own = n_cams[rank]
    flat = [t.reshape(-1, *t.shape[2:]) for t in tensors]  # camera-major rows
    got = all_to_all_tensor_list(
        world_size, flat, splits=[c * n_local for c in n_cams],
        output_splits=[c_own * n for n in n_gauss],
    )
    out = []
    for t, g in zip(tensors, got, strict=True):
        blocks = torch.split(g, [c_own * n for n in n_gauss], dim=0)
        blocks = [b.reshape(c_own, n, *t.shape[2:]) for b, n in zip(blocks, n_gauss,
                                                                     strict=True)]
        out.append(torch.cat(blocks, dim=1))
    return out


def exchange_packed(
    world_size: int,
    rank: int,
    n_cams: list[int],
    n_gauss: list[int],
    camera_ids: Tensor,  # [nnz] into the C_all cameras
    gaussian_ids: Tensor,  # [nnz] into this rank's Gaussians
    tensors: list[Tensor],  # each [nnz, *]
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Packed projections (rows sorted by camera, as ``fully_fused_projection`` returns them)
    to the ranks owning their cameras: (camera_ids into this rank's cameras, gaussian_ids
    into every rank's Gaussians (rank 0's first), the tensors' received rows)."""
    device = camera_ids.device
    first_cam = torch.tensor([0, *n_cams[:-1]], device=device).cumsum(0)
    first_gauss = int(sum(n_gauss[:rank]))
    owner = torch.bucketize(camera_ids, first_cam, right=True) - 1  # [nnz] rank of camera
    splits = torch.bincount(owner, minlength=world_size).tolist()
    local_cam = camera_ids - first_cam[owner]
    global_gauss = gaussian_ids + first_gauss
    got = all_to_all_tensor_list(world_size, [local_cam, global_gauss, *tensors], splits)
    return got[0], got[1], got[2:]
