"""Constants of the rendering contract (DESIGN.md), defined once for every backend."""

ALPHA_CLAMP = 0.999  # alpha = min(ALPHA_CLAMP, opacity * exp(-sigma))
ALPHA_SKIP = 1.0 / 255.0  # a pair with alpha below this is skipped
TRANSMITTANCE_STOP = 1e-4  # a pixel stops when T would fall to this or below
PIXEL_CENTER = 0.5  # pixel (x, y) is sampled at (x + 0.5, y + 0.5)
RADIUS_SIGMAS = 3.33  # radii = ceil(RADIUS_SIGMAS * sqrt(diag(cov2d)))
DET_MIN = 1e-10  # lower clamp of det(cov2d) before inversion, as gsplat's reference
FISHEYE_EPS = 1e-7  # gsplat's epsilon in the fisheye projection
DEFAULT_TILE_SIZE = 16

# Camera models: the code each native kernel dispatches on (backends/shared/cameras.py) by
# name; a new model is one more entry (docs/README.md, "where things go").
CAMERA_CODES = {"pinhole": 0, "ortho": 1, "fisheye": 2}
CAMERA_MODELS = tuple(CAMERA_CODES)
RASTERIZE_MODES = ("classic", "antialiased")
RENDER_MODES = ("RGB", "D", "ED", "RGB+D", "RGB+ED")
BACKWARD_SCHEMES = ("per_pixel", "per_splat")

# 3DGUT (gsplat 1.5.3's Cameras.cuh): the camera models its unscented-transform projection and
# eval3d rasterizer take (no ortho), its shutters by RollingShutterType value, the codes of
# FThetaPolynomialType, and the numbers of its camera math.
UT_CAMERA_MODELS = ("pinhole", "fisheye", "ftheta")
SHUTTER_CODES = {
    "ROLLING_TOP_TO_BOTTOM": 0,
    "ROLLING_LEFT_TO_RIGHT": 1,
    "ROLLING_BOTTOM_TO_TOP": 2,
    "ROLLING_RIGHT_TO_LEFT": 3,
    "GLOBAL": 4,
}
SHUTTER_GLOBAL = SHUTTER_CODES["GLOBAL"]
FTHETA_PIXELDIST_TO_ANGLE = 0  # the backward polynomial (pixel distance -> angle) is the reference
FTHETA_ANGLE_TO_PIXELDIST = 1  # the forward polynomial (angle -> pixel distance) is the reference
ROLLING_SHUTTER_ITERATIONS = 10  # projections at the time of the last projected pixel
PINHOLE_NEWTON_STEPS = 5  # undistortion of the OpenCV pinhole (OpenCVPinholeCameraModel<5>)
FISHEYE_NEWTON_STEPS = 20  # inverse of the fisheye's angle polynomial, and its max angle
FTHETA_NEWTON_STEPS = 3  # inverse of the f-theta reference polynomial
NEWTON_TOLERANCE = 1e-6  # a Newton step this small has converged; |det J| below it stops one
FISHEYE_MAX_ANGLE_START = 1.57  # Newton's start for the fisheye's max angle when k4 != 0
# OpenCV pinhole: a point whose radial factor is <= this is invalid (close to flipping across
# the image centre: part of a Gaussian's sigma points could cross the fold)
PINHOLE_MIN_RADIAL_FACTOR = 0.8
MIN_2D_NORM = 1e-6  # a pixel this close to the principal point looks along the optical axis

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
