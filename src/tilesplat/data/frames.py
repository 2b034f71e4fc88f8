"""The types every loader returns and the trainer consumes, with the helpers loaders share.

Every loader returns a :class:`SceneDataset` of :class:`Frame` objects in one convention:
world-to-camera matrices in OpenCV axes (x right, y down, z forward), intrinsics already scaled
to the loaded image size (a pinhole's, or an equidistant fisheye's when ``camera_model`` is
``"fisheye"``), float32 images in [0, 1] (decoded on demand within a memory budget,
:mod:`.image_cache`), and an optional training mask (True: the pixel
counts; COLMAP's and nerfstudio's convention that a black mask pixel is ignored).

This module is the bottom of the data floor: the loaders (``blender``, ``colmap``) import it,
and ``dataset`` imports the loaders, so no data module imports one that imports it back.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from ..io.images import open_image
from .image_cache import image_to_tensors as image_to_tensors  # re-exported (dataset)
from .pixels import HeldPixels, MaskBits, Pixels

if TYPE_CHECKING:
    from .lens import Lens

MASK_SUFFIX = ".png"


_KEEP = object()  # Frame(): an alpha or mask not given (dataclasses.replace keeps the frame's)


@dataclass(init=False)
class Frame:
    """One posed image.

    Attributes:
        name: image file stem.
        viewmat: [4, 4] float32 world-to-camera, OpenCV axes (x right, y down, z forward).
        K: [3, 3] float32 pinhole intrinsics, scaled by the downscale factor.
        width, height: image size in pixels.
        pixels: where :attr:`image` and :attr:`alpha` come from: tensors the frame holds, or
            a loaded file decoded through the bounded image cache (:mod:`.pixels`).
        mask_bits: the training mask as bits (:attr:`mask`), or None.
        camera_model: the rasterizer's camera that renders the frame, ``pinhole`` or
            ``fisheye`` (equidistant; ``K`` then holds its focal lengths and centre).
        point_ids: [P_i] int64, the rows of :attr:`SceneDataset.points` this image sees
            (COLMAP: the points whose track holds the image), or None when the source says
            nothing of it (the depth prior, ``train/features/depth_loss.py``, then finds them).
        lens: the capture's own lens (``camera_mode = "native"``, :mod:`.lens`: gsplat's
            distortion coefficients of ``camera_model``, rendered through 3DGUT), or None for
            the plain pinhole or equidistant fisheye of ``K``.

    ``Frame(name, viewmat, K, width, height, image, alpha, mask, ...)`` makes a frame that
    holds its tensors; ``dataclasses.replace(frame, image=...)`` replaces them (the alpha
    and mask not given are kept), and a replace of anything else shares the pixels, decoding
    nothing.
    """

    name: str
    viewmat: torch.Tensor
    K: torch.Tensor
    width: int
    height: int
    pixels: Pixels
    mask_bits: MaskBits | None
    camera_model: str
    point_ids: torch.Tensor | None
    lens: Lens | None

    def __init__(
        self,
        name: str,
        viewmat: torch.Tensor,  # [4, 4]
        K: torch.Tensor,  # [3, 3]
        width: int,
        height: int,
        image: torch.Tensor | None = None,  # [H, W, 3]
        alpha: torch.Tensor | None | object = _KEEP,  # [H, W, 1]
        mask: torch.Tensor | None | object = _KEEP,  # [H, W] bool
        camera_model: str = "pinhole",
        point_ids: torch.Tensor | None = None,  # [P_i]
        *,
        pixels: Pixels | None = None,
        mask_bits: MaskBits | None = None,
        lens: Lens | None = None,
    ) -> None:
        self.name, self.viewmat, self.K, self.lens = name, viewmat, K, lens
        self.width, self.height = width, height
        self.camera_model, self.point_ids = camera_model, point_ids
        if image is not None:
            if alpha is _KEEP:
                alpha = None if pixels is None else pixels.tensors()[1]
            pixels = HeldPixels(image, alpha)  # type: ignore[arg-type]
        elif alpha is not _KEEP:
            raise ValueError(f"frame '{name}': an alpha needs its image")
        if pixels is None:
            raise ValueError(f"frame '{name}' has no image")
        self.pixels = pixels
        self.mask_bits = mask_bits if mask is _KEEP else MaskBits.of(mask)  # type: ignore[arg-type]

    @property
    def image(self) -> torch.Tensor:
        """[H, W, 3] float32 in [0, 1], already composited on the background for RGBA (a
        loaded frame's: decoded through the image cache, a new tensor each time)."""
        return self.pixels.tensors()[0]

    @property
    def alpha(self) -> torch.Tensor | None:
        """[H, W, 1] float32 when the source had alpha, else None."""
        return self.pixels.tensors()[1] if self.pixels.has_alpha else None

    def image_and_alpha(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(:attr:`image`, :attr:`alpha`) from one decode: each property decodes on its own
        (an RGBA image composited again, ~0.2 ms at 200x200)."""
        image, alpha = self.pixels.tensors()
        return image, alpha if self.pixels.has_alpha else None

    @property
    def mask(self) -> torch.Tensor | None:
        """[H, W] bool, the pixels the loss and the masked metrics count (a user's mask, and
        the pixels an undistortion could fill), or None when every pixel counts."""
        return None if self.mask_bits is None else self.mask_bits.tensor()

    @image.setter
    def image(self, image: torch.Tensor) -> None:
        self.pixels = HeldPixels(image, self.alpha)

    @alpha.setter
    def alpha(self, alpha: torch.Tensor | None) -> None:
        self.pixels = HeldPixels(self.image, alpha)

    @mask.setter
    def mask(self, mask: torch.Tensor | None) -> None:
        self.mask_bits = MaskBits.of(mask)

    @property
    def camera_center(self) -> torch.Tensor:
        """[3] camera position in world coordinates."""
        R = self.viewmat[:3, :3].double()
        t = self.viewmat[:3, 3].double()
        return (-R.T @ t).float()


@dataclass
class SceneDataset:
    """Train and test frames of one scene.

    Attributes:
        train, test: posed frames.
        points: [P, 3] float32 initial points (COLMAP), None for Blender or an empty model.
        points_rgb: [P, 3] float32 in [0, 1], None when ``points`` is.
        scene_center: [3] float32. Blender: the point nearest to all optical axes (the look-at
            point); COLMAP: the mean of the camera centres (3DGS's convention).
        scene_radius: 1.1 x the largest distance from ``scene_center`` to a train camera (3DGS's
            ``cameras_extent``, which scales the means' learning rate and densification).
        background: compositing colour of RGBA images (Blender), else (0, 0, 0).
        kind: "blender", "colmap" or "nerfstudio".
        path: the dataset folder.
        extras: what a source gives beyond the frames, kept for later features (nerfstudio:
            ``depth_files``, frame name -> depth image file).
    """

    train: list[Frame]
    test: list[Frame]
    points: torch.Tensor | None
    points_rgb: torch.Tensor | None
    scene_center: torch.Tensor
    scene_radius: float
    background: tuple[float, float, float]
    kind: str = ""
    path: Path | None = None
    extras: dict | None = None


def check_finite_scene(dataset: SceneDataset, source: str | Path) -> SceneDataset:
    """``dataset``, checked to hold only finite poses, intrinsics and points (the readers
    check their files' numbers; this catches what a computation of them made, such as the
    inverse of a nearly singular pose), so that a bad number stops the load, not the first
    step of a run.

    Raises:
        ValueError: naming ``source``, the first frame or point that is not finite, and what.
    """
    for split in ("train", "test"):
        for f in getattr(dataset, split):
            for what, t in (("world-to-camera matrix", f.viewmat), ("intrinsics K", f.K)):
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(f"{source}: {split} view '{f.name}' has a non-finite "
                                     f"{what}: {t.tolist()}")
    for what, pts in (("position", dataset.points), ("colour", dataset.points_rgb)):
        if pts is not None:
            bad = torch.nonzero(~torch.isfinite(pts).all(dim=1))
            if len(bad):
                i = int(bad[0])
                raise ValueError(f"{source}: initial point {i} has a non-finite {what} "
                                 f"{pts[i].tolist()}")
    return dataset


def split_every(names: list[str], test_every: int) -> tuple[list[int], list[int]]:
    """Indices (train, test) of ``names`` sorted by name; test = every ``test_every``-th."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    if test_every <= 0:
        return order, []
    train = [i for j, i in enumerate(order) if j % test_every != 0]
    test = [i for j, i in enumerate(order) if j % test_every == 0]
    return train, test


def cameras_extent(centers: np.ndarray, center: np.ndarray) -> float:
    """1.1 x the largest distance of ``centers`` [C, 3] from ``center`` [3] (3DGS)."""
    if len(centers) == 0:
        return 1.0
    radius = float(np.linalg.norm(centers - center[None], axis=1).max()) * 1.1
    return radius if radius > 0 else 1.0


def look_at_point(centers: np.ndarray, forwards: np.ndarray) -> np.ndarray:
    """Least-squares point nearest to the optical axes (rays ``centers`` [C,3] + t ``forwards``).

    Falls back to the mean of the centres when the axes are (nearly) parallel.
    """
    d = forwards / np.linalg.norm(forwards, axis=1, keepdims=True)
    proj = np.eye(3)[None] - d[:, :, None] * d[:, None, :]  # [C, 3, 3] onto the axis normal
    A = proj.sum(0)
    b = (proj @ centers[:, :, None]).sum(0)[:, 0]
    if len(centers) < 2 or np.linalg.cond(A) > 1e6:
        return centers.mean(0)
    return np.linalg.solve(A, b)


def mask_files(masks_dir: Path, names: list[str], images_dir: Path) -> dict[str, Path]:
    """Image name -> its mask in ``masks_dir``: ``<name>.png`` (COLMAP's convention, e.g.
    ``a.jpg.png``) or ``<name without suffix>.png``; images without one are not in the dict.

    Raises:
        FileNotFoundError: ``masks_dir`` is not a folder.
        ValueError: a mask file belongs to no image of ``images_dir`` (naming both).
    """
    if not masks_dir.is_dir():
        raise FileNotFoundError(f"masks folder not found: {masks_dir}")
    found: dict[str, Path] = {}
    for name in names:
        for cand in (masks_dir / (name + MASK_SUFFIX), (masks_dir / name).with_suffix(MASK_SUFFIX)):
            if cand.is_file():
                found[name] = cand
                break
    used = {p.resolve() for p in found.values()}
    stems: dict[Path, set[str]] = {}  # folder -> what its files' names start with before a dot
    for path in sorted(masks_dir.rglob("*")):
        if not path.is_file() or path.name.startswith(".") or path.resolve() in used:
            continue
        base = path.relative_to(masks_dir).as_posix().removesuffix(MASK_SUFFIX)
        image = images_dir / base
        if image.is_file() or image.name in _stems(image.parent, stems):
            continue  # the mask of an image the model did not register
        near = difflib.get_close_matches(base, names, n=1)
        hint = f" (image {images_dir / near[0]} would take mask " \
            f"{masks_dir / (near[0] + MASK_SUFFIX)})" if near else ""
        raise ValueError(
            f"mask {path} belongs to no image: no {image} or {image}.* in {images_dir}; the "
            f"mask of image <name> is <name>{MASK_SUFFIX} or <name without suffix>"
            f"{MASK_SUFFIX}{hint}"
        )
    return found


def _stems(folder: Path, cache: dict[Path, set[str]]) -> set[str]:
    """Every ``s`` for which ``folder`` holds a file ``s.*`` (``a`` and ``a.b`` for
    ``a.b.jpg``): the folder is listed once, not once per mask (quadratic in the masks)."""
    if folder not in cache:
        names = [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
        cache[folder] = {n[:i] for n in names for i, c in enumerate(n) if c == "."}
    return cache[folder]


def read_mask(path: Path, image_file: Path, image_size: tuple[int, int],
              out_size: tuple[int, int] | None = None) -> np.ndarray:
    """The mask file ``path`` of ``image_file`` as [h, w] bool (False where the mask is black).

    ``image_size`` is the (width, height) of the image file the mask must match; with
    ``out_size`` the mask is shrunk to it and a pixel is kept only where every mask pixel it
    covers is.

    Raises:
        ValueError: the file is not an image, or its size is not the image's (naming both).
    """
    with open_image(path, f"mask {path} of image {image_file}") as pil:
        pil.load()
        grey = np.asarray(pil.convert("L"))
    h, w = grey.shape
    if (w, h) != tuple(image_size):
        raise ValueError(
            f"mask {path} is {w}x{h} but its image {image_file} is "
            f"{image_size[0]}x{image_size[1]}"
        )
    keep = grey > 0
    if out_size is not None and tuple(out_size) != (w, h):
        frac = Image.fromarray(keep.astype(np.float32)).resize(
            tuple(out_size), resample=Image.Resampling.BOX)
        keep = np.asarray(frac) >= 1.0 - 1e-4
    return keep


def mask_tensor(keep: np.ndarray | None) -> torch.Tensor | None:
    """A Frame's mask from [H, W] bool: None when every pixel is kept."""
    if keep is None or keep.all():
        return None
    return torch.from_numpy(np.ascontiguousarray(keep, dtype=bool))
