"""Constants of the rendering contract (DESIGN.md), defined once for every backend."""

ALPHA_CLAMP = 0.999  # alpha = min(ALPHA_CLAMP, opacity * exp(-sigma))
ALPHA_SKIP = 1.0 / 255.0  # a pair with alpha below this is skipped
TRANSMITTANCE_STOP = 1e-4  # a pixel stops when T would fall to this or below
PIXEL_CENTER = 0.5  # pixel (x, y) is sampled at (x + 0.5, y + 0.5)
RADIUS_SIGMAS = 3.33  # radii = ceil(RADIUS_SIGMAS * sqrt(diag(cov2d)))
DET_MIN = 1e-10  # lower clamp of det(cov2d) before inversion, as gsplat's reference
FISHEYE_EPS = 1e-7  # gsplat's epsilon in the fisheye projection
TILE_SIZE = 16  # pixels on a side of a rasterizer tile: gsplat's default `tile_size`

# Camera models: the code each native kernel dispatches on (backends/shared/cameras.py) by
# name; a new model is one more entry (docs/README.md, "where things go").
CAMERA_CODES = {"pinhole": 0, "ortho": 1, "fisheye": 2}
CAMERA_MODELS = tuple(CAMERA_CODES)
RASTERIZE_MODES = ("classic", "antialiased")
RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
BACKWARD_SCHEMES = ("per_pixel", "per_splat")
SH_MAX_DEGREE = 4
SH_C0 = 0.28209479177387814  # Y_0^0 = 1 / (2 sqrt(pi)): colour = SH_C0 * dc (+ 0.5)

# Backend names (DESIGN.md): "auto" picks the native backend of the tensors' device.
BACKENDS = ("auto", "torch", "cpu", "cuda")

# SSIM of the photometric loss (Wang et al. 2004): an 11x11 Gaussian window of sigma 1.5,
# C1 = (0.01 * L)^2 and C2 = (0.03 * L)^2 for the data range L = 1
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01**2
SSIM_C2 = 0.03**2
