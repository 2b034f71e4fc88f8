"""Photos to a COLMAP dataset in-process with pycolmap: features, matching, mapping, undistortion.

Stages (each timed and reported):

1. **photos**: every image decoded and staged (:mod:`.photos`); bad input stops here.
2. **features**: SIFT on the CPU (or pycolmap's GPU build when one is installed). Photos of
   one size and one EXIF focal length share one camera (the usual capture, and the best
   constrained); otherwise COLMAP's ``AUTO`` mode groups them. The EXIF focal length, where a
   photo has one, seeds the intrinsics (else 1.2 x the long side).
3. **matching**: exhaustive (every pair; best up to a few hundred photos) or sequential
   (neighbours in name order: video frames, walks).
4. **mapping**: COLMAP's incremental mapper; the model with the most registered images is kept.
5. **undistortion**: the images and model are undistorted to PINHOLE cameras, which the
   trainer reads.

Everything is written into a staging folder next to ``out_dir`` and renamed into place at the
end, so ``out_dir`` either holds a whole dataset or does not exist. pycolmap is imported only
here, inside :func:`prepare`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...io.atomic import atomic_write_bytes
from .photos import Photo, one_camera, scan_photos, stage_photos

MATCHERS = ("exhaustive", "sequential")
# the COLMAP models `tilesplat prepare --camera-model` may ask pycolmap to estimate
SFM_CAMERA_MODELS = ("SIMPLE_RADIAL", "RADIAL", "OPENCV", "SIMPLE_PINHOLE", "PINHOLE")
INSTALL_HINT = 'structure-from-motion needs pycolmap: pip install "tilesplat[sfm]"'
REPORT_FILE = "prepare.json"
MIN_MODEL = 3  # registered images below which a model is refused whatever min_registered says
MIN_PAIR_INLIERS = 15  # the mapper's min_num_matches: pairs with fewer do not count
SEQUENTIAL_OVERLAP = 10  # neighbours matched on each side in sequential mode (COLMAP's default)
_TRY = (
    "try: photos with more overlap (each scene point in 3+ photos, 60-80% overlap between "
    "neighbours), more texture and less blur, --matcher exhaustive, a larger --max-size"
)

Log = Callable[[str], None]


@dataclass
class PrepareReport:
    """What :func:`prepare` did. Written as ``prepare.json`` into the output folder.

    Attributes:
        n_images: photos in the input folder.
        n_registered: photos with a recovered pose in the kept model.
        n_points: 3D points of the kept model.
        mean_reprojection_error: mean over all observations, in pixels.
        left_out: names of the photos that are not in the kept model.
        n_models: models the mapper made (more than one: the photos fell into groups).
        n_exif_focal: photos whose EXIF focal length seeded the intrinsics.
        cameras: output cameras as ``{"model", "width", "height", "params"}``.
        seconds: wall time per stage.
        cpu_seconds: CPU time per stage (all threads; what an idle machine's wall time
            approaches with one thread).
        options: the arguments of the run.
    """

    n_images: int = 0
    n_registered: int = 0
    n_points: int = 0
    mean_reprojection_error: float = 0.0
    left_out: list[str] = field(default_factory=list)
    n_models: int = 0
    n_exif_focal: int = 0
    cameras: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """Lines for the terminal."""
        lines = [
            f"registered {self.n_registered} of {self.n_images} images, {self.n_points} points, "
            f"mean reprojection error {self.mean_reprojection_error:.3f} px",
            "time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()),
        ]
        if self.left_out:
            shown = ", ".join(self.left_out[:10])
            more = f" and {len(self.left_out) - 10} more" if len(self.left_out) > 10 else ""
            lines.append(f"left out: {shown}{more}")
        return "\n".join(lines)


def import_pycolmap() -> Any:
    """The pycolmap module, or NotImplementedError with the install line."""
    try:
        import pycolmap
    except ImportError as e:
        raise NotImplementedError(INSTALL_HINT) from e
    return pycolmap


def check_options(matcher: str, camera_model: str, max_size: int, min_registered: float) -> None:
    """ValueError naming the first bad option."""
    if matcher not in MATCHERS:
        raise ValueError(f"matcher must be one of {list(MATCHERS)}, got {matcher!r}")
    if camera_model not in SFM_CAMERA_MODELS:
        raise ValueError(f"camera model must be one of {list(SFM_CAMERA_MODELS)}, "
                         f"got {camera_model!r}")
    if not isinstance(max_size, int) or (max_size != 0 and max_size < 64):
        raise ValueError(f"max size must be 0 (keep) or at least 64 px, got {max_size!r}")
    if not 0.0 < min_registered <= 1.0:
        raise ValueError(f"min registered must be in (0, 1], got {min_registered!r}")


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not empty; choose a new output folder")


class _Stages:
    """Times the stages and announces each one."""

    def __init__(self, log: Log):
        self.log = log
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}

    def run(self, name: str, what: str, fn: Callable[[], Any]) -> Any:
        self.log(f"[{len(self.seconds) + 1}/5] {name}: {what}")
        start, cpu = time.perf_counter(), time.process_time()
        result = fn()
        self.seconds[name] = round(time.perf_counter() - start, 3)
        self.cpu_seconds[name] = round(time.process_time() - cpu, 3)
        self.log(f"      {name} done in {self.seconds[name]:.1f} s")
        return result


def prepare(
    images_dir: str | Path,
    out_dir: str | Path,
    *,
    matcher: str = "exhaustive",
    camera_model: str = "SIMPLE_RADIAL",
    max_size: int = 1600,
    min_registered: float = 0.5,
    threads: int = -1,
    seed: int = 0,
    log: Log = print,
) -> PrepareReport:
    """Recover camera poses from a folder of photos and write a COLMAP dataset.

    ``out_dir`` gets ``images/`` (undistorted), ``sparse/0/{cameras,images,points3D}.bin``
    (PINHOLE cameras; COLMAP 4's ``rigs.bin`` and ``frames.bin`` beside them) and
    ``prepare.json`` (the report), the layout ``tilesplat train --data`` reads.

    Args:
        images_dir: the photos (top-level image files; see :mod:`.photos`).
        out_dir: a new or empty folder.
        matcher: ``exhaustive`` or ``sequential``.
        camera_model: the COLMAP model estimated per camera (undistorted at the end).
        max_size: long side in pixels of the staged photos (and of the output); 0 keeps all.
        min_registered: fail when the kept model holds fewer than this fraction of the photos.
        threads: CPU threads for pycolmap; -1 uses all.
        seed: pycolmap's random seed (RANSAC, the mapper).
        log: progress lines go here.

    Raises:
        FileNotFoundError / ValueError: bad input, or the reconstruction failed (the message
            says what to try). NotImplementedError: pycolmap is not installed.
    """
    check_options(matcher, camera_model, max_size, min_registered)
    out = Path(out_dir)
    _check_out_dir(out)
    photos = scan_photos(images_dir)
    pycolmap = import_pycolmap()
    made_parent = not out.parent.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    stage_root = Path(tempfile.mkdtemp(prefix=f".{out.name}.prepare-", dir=out.parent))
    log_level = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = 3  # fatal only: the stages and our errors speak
    try:
        report = _reconstruct(
            pycolmap, photos, stage_root, matcher, camera_model, max_size, threads, seed, log
        )
        report.options = {
            "images_dir": str(images_dir),
            "matcher": matcher,
            "camera_model": camera_model,
            "max_size": max_size,
            "seed": seed,
        }
        need = max(MIN_MODEL, math.ceil(min_registered * len(photos) - 1e-9))
        if report.n_registered < need:
            raise ValueError(
                f"structure-from-motion registered only {report.n_registered} of "
                f"{len(photos)} images (need {need}; {report.n_models} separate model(s)); " + _TRY
            )
        result = stage_root / "result"
        atomic_write_bytes(result / REPORT_FILE, json.dumps(asdict(report), indent=1).encode())
        if out.is_dir():
            out.rmdir()  # empty (checked above); os.replace needs the name free
        os.replace(result, out)
    except BaseException:
        shutil.rmtree(stage_root, ignore_errors=True)
        if made_parent and not any(out.parent.iterdir()):
            out.parent.rmdir()  # e.g. the run folder of train --images: leave no trace
        raise
    finally:
        pycolmap.logging.minloglevel = log_level
        shutil.rmtree(stage_root, ignore_errors=True)
    log(report.summary())
    return report


def _reconstruct(
    pycolmap: Any,
    photos: list[Photo],
    root: Path,
    matcher: str,
    camera_model: str,
    max_size: int,
    threads: int,
    seed: int,
    log: Log,
) -> PrepareReport:
    """Run stages 1-5 inside ``root``; the dataset ends up in ``root / "result"``."""
    stages = _Stages(log)
    staged = root / "photos"
    staged.mkdir()
    size_note = f"long side at most {max_size} px" if max_size else "full size"
    stages.run(
        "photos",
        f"{len(photos)} images, {size_note}",
        lambda: stage_photos(photos, staged, max_size),
    )
    pycolmap.set_random_seed(seed)
    database = root / "database.db"
    n_exif = _features(pycolmap, stages, photos, staged, database, camera_model, threads)
    n_pairs = _matching(pycolmap, stages, len(photos), database, matcher, threads)
    models = _mapping(pycolmap, stages, len(photos), database, staged, root / "models", threads,
                      seed, n_pairs)  # fmt: skip
    rec = max(models.values(), key=lambda r: r.num_reg_images())
    registered = {rec.image(i).name for i in rec.reg_image_ids()}
    report = PrepareReport(
        n_images=len(photos),
        n_registered=len(registered),
        n_points=rec.num_points3D(),
        mean_reprojection_error=float(rec.compute_mean_reprojection_error()),
        left_out=sorted(p.name for p in photos if p.staged not in registered),
        n_models=len(models),
        n_exif_focal=n_exif,
    )
    if report.n_registered < MIN_MODEL:
        return report
    _undistortion(pycolmap, stages, rec, root, staged, threads)
    cams = pycolmap.Reconstruction(root / "result" / "sparse" / "0").cameras
    report.cameras = [
        {
            "model": c.model.name,
            "width": c.width,
            "height": c.height,
            "params": [float(v) for v in c.params],
        }
        for c in cams.values()
    ]
    report.seconds, report.cpu_seconds = stages.seconds, stages.cpu_seconds
    return report


def _features(pycolmap: Any, stages: _Stages, photos: list[Photo], staged: Path, database: Path,
              camera_model: str, threads: int) -> int:
    """Stage 2: SIFT features of the staged photos into ``database``; returns how many
    cameras have a focal length from EXIF. Blank photos end here."""
    single = one_camera(photos)
    mode = pycolmap.CameraMode.SINGLE if single else pycolmap.CameraMode.AUTO

    def features() -> None:
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model = camera_model
        extraction = pycolmap.FeatureExtractionOptions()
        extraction.num_threads = threads
        pycolmap.extract_features(
            database,
            staged,
            image_names=[p.staged for p in photos],
            camera_mode=mode,
            reader_options=reader,
            extraction_options=extraction,
        )

    cameras = "one camera" if single else "cameras by size and EXIF focal length"
    stages.run("features", f"SIFT, {camera_model}, {cameras}", features)
    with pycolmap.Database.open(database) as db:
        n_exif = sum(c.has_prior_focal_length for c in db.read_all_cameras())
        keypoints = sorted(db.num_keypoints_for_image(i.image_id) for i in db.read_all_images())
    if keypoints and keypoints[len(keypoints) // 2] < 50:
        raise ValueError(
            f"the photos have almost no features (median {keypoints[len(keypoints) // 2]} "
            "SIFT keypoints per image): they look blank, blurred or too small; " + _TRY
        )
    return n_exif


def _matching(pycolmap: Any, stages: _Stages, n_photos: int, database: Path, matcher: str,
              threads: int) -> int:
    """Stage 3: match the features; returns the image pairs with at least
    :data:`MIN_PAIR_INLIERS` verified matches (none ends here)."""

    def matching() -> int:
        options = pycolmap.FeatureMatchingOptions()
        options.num_threads = threads
        if matcher == "exhaustive":
            pycolmap.match_exhaustive(database, matching_options=options)
        else:
            pairing = pycolmap.SequentialPairingOptions()
            pairing.overlap = SEQUENTIAL_OVERLAP
            pycolmap.match_sequential(database, matching_options=options, pairing_options=pairing)
        with pycolmap.Database.open(database) as db:
            _, inliers = db.read_two_view_geometry_num_inliers()
        return sum(n >= MIN_PAIR_INLIERS for n in inliers)

    n_pairs = stages.run("matching", matcher, matching)
    stages.log(f"      {n_pairs} image pairs share at least {MIN_PAIR_INLIERS} verified matches")
    if n_pairs == 0:
        raise ValueError(
            f"structure-from-motion failed: no two of the {n_photos} images share enough "
            "matching features; " + _TRY
        )
    return n_pairs


def _mapping(pycolmap: Any, stages: _Stages, n_photos: int, database: Path, staged: Path,
             models_dir: Path, threads: int, seed: int, n_pairs: int) -> dict[int, Any]:
    """Stage 4: incremental mapping into ``models_dir``; returns its models by index (none
    ends here), logging every tenth image tried."""
    counter = {"n": 0}

    def next_image() -> None:
        counter["n"] += 1
        if counter["n"] % 10 == 0:
            stages.log(f"      {counter['n'] + 2} images tried")

    def mapping() -> dict[int, Any]:
        options = pycolmap.IncrementalPipelineOptions()
        options.num_threads = threads
        options.random_seed = seed
        return pycolmap.incremental_mapping(
            database, staged, models_dir, options=options, next_image_callback=next_image
        )

    models = stages.run("mapping", "incremental", mapping)
    if not models:
        raise ValueError(
            f"structure-from-motion failed: no pair of the {n_photos} images could start a "
            f"model ({n_pairs} matching pairs, none with enough matches and parallax); " + _TRY
        )
    return models


def _undistortion(pycolmap: Any, stages: _Stages, rec: Any, root: Path, staged: Path,
                  threads: int) -> None:
    """Stage 5: the reconstruction ``rec`` written to ``root / "model"`` and undistorted to
    PINHOLE into ``root / "result"`` (images/, sparse/0/), COLMAP's other outputs removed."""
    model_dir = root / "model"
    model_dir.mkdir()
    rec.write(model_dir)

    def undistortion() -> None:
        result = root / "result"
        pycolmap.undistort_images(
            result, model_dir, staged, output_type="COLMAP", num_threads=threads
        )
        sparse0 = result / "sparse" / "0"
        sparse0.mkdir()
        for f in list((result / "sparse").iterdir()):
            if f.is_file():
                os.replace(f, sparse0 / f.name)
        for extra in result.iterdir():  # the MVS scripts and stereo/ of COLMAP's undistorter
            if extra.name not in ("images", "sparse"):
                shutil.rmtree(extra) if extra.is_dir() else extra.unlink()

    stages.run("undistortion", "to PINHOLE", undistortion)
