"""``tilesplat view``: look at a run, a checkpoint (tilesplat's or gsplat's) or any splat file
of :mod:`tilesplat.io.gaussians` (.ply, .compressed.ply, .splat, .spz, .sog, meta.json, .glb)
in the browser."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..viewer.lens import ViewLens

COMMAND = "view"
HELP = ("view a run, checkpoint or splat file (.ply, .compressed.ply, .splat, .spz, .sog, "
        "meta.json, .glb) in the browser (pip install tilesplat[viewer])")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="RUN_OR_FILE",
        help="run folder, checkpoint (.pt, tilesplat's or gsplat's) or splat file",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (default 127.0.0.1; reach it from elsewhere with ssh -L)",
    )
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free)")
    parser.add_argument(
        "--mode",
        choices=("splats", "render"),
        default="splats",
        help="splats: the browser draws the splats (base colour); render: tilesplat renders "
        "each browser camera on this machine (exact, view-dependent colour)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "cpu", "cuda"),
        default="auto",
        help="render mode's rasterization backend (default auto)",
    )
    parser.add_argument(
        "--max-side",
        type=int,
        default=640,
        metavar="PX",
        help="render mode: longer side of a still frame in pixels (default 640)",
    )
    parser.add_argument(
        "--pinhole",
        action="store_true",
        help="render mode shows a run trained with camera_mode = native through its capture's "
        "lens (the first training camera's, scaled to the browser; the panel's camera choice "
        "switches); --pinhole starts with a pinhole of the browser's field of view instead",
    )


def capture_lens(source: str) -> ViewLens | None:
    """The lens of a tilesplat run trained with ``camera_mode = "native"`` (its first
    training camera with one; loading the run's dataset), None for any other source."""
    from ..train.loop.lens_view import capture_frame
    from ..viewer.lens import ViewLens

    frame = capture_frame(source)
    if frame is None or frame.lens is None:
        return None
    return ViewLens(frame.camera_model, frame.lens.coeffs(), frame.K.double().numpy(),
                    frame.width, frame.height)


def run(args: argparse.Namespace) -> int:
    from ..viewer.server import ViewServer, require_viser
    from ._model import open_model

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_side < 16:
        raise ValueError(f"--max-side must be at least 16, got {args.max_side}")
    require_viser()  # before loading a large model
    model = open_model(args.source)
    for note in model.notes:
        print(f"note: {note}")
    print(f"loaded {model.source}")
    lens = capture_lens(args.source) if args.mode == "render" else None
    if lens is not None:
        print(f"render mode: through the capture's {lens.camera_model} lens"
              + (" (--pinhole: the panel's camera starts on pinhole)" if args.pinhole else ""))
    server = ViewServer(
        model.gaussians,
        mode=args.mode,
        host=args.host,
        port=args.port,
        backend=args.backend,
        max_side=args.max_side,
        antialiased=model.antialiased,
        lens=lens,
        pinhole=args.pinhole,
    )
    print("Ctrl-C stops the viewer")
    server.serve_forever()
    return 0
