"""Look at a model in the browser: ``tilesplat view`` and the live view of a training run.

The web side is viser (``pip install "tilesplat[viewer]"``), imported only inside the
functions that start a server, so that importing this package needs nothing beyond tilesplat.

- :mod:`.scene`: the Gaussians to show, their splat buffers and tilesplat's own render of a
  browser camera (no viser).
- :mod:`.server`: ``tilesplat view``: ``splats`` mode (the browser draws the splats with
  WebGL) and ``render`` mode (tilesplat renders each browser camera on the server).
- :mod:`.live`: the viewer a training run opens with ``--set viewer_port=PORT``.
"""
