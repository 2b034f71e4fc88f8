"""Constants of the rendering contract (DESIGN.md), defined once for every backend."""

ALPHA_CLAMP = 0.999  # alpha = min(ALPHA_CLAMP, opacity * exp(-sigma))
ALPHA_SKIP = 1.0 / 255.0  # a pair with alpha below this is skipped
TRANSMITTANCE_STOP = 1e-4  # a pixel stops when T would fall to this or below
PIXEL_CENTER = 0.5  # pixel (x, y) is sampled at (x + 0.5, y + 0.5)
RADIUS_SIGMAS = 3.33  # radii = ceil(RADIUS_SIGMAS * sqrt(diag(cov2d)))
DET_MIN = 1e-10  # lower clamp of det(cov2d) before inversion, as gsplat's reference
TILE_SIZE = 16  # pixels on a side of a rasterizer tile: gsplat's default `tile_size`
# The tile lists of rasterization() (issue 37): a Gaussian enters a tile only if its
# alpha-threshold ellipse, sigma <= ln(opacity / ALPHA_SKIP), reaches one of the tile's pixel
# centres, judged with margins that cover how the rasterizers round (backends/shared/tiles.py):
TILE_CONIC_SLACK = 1e-5  # conic diagonal shrunk by this of (a + |b|), (c + |b|): float32 sigma
# errs by <= ~8 ulp (5e-7) of those terms, so the bound stays below every rasterizer's sigma
TILE_SIGMA_SLACK = 1e-4  # level += this * (1 + level): exp's and alpha's rounding (~3e-7)

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
# The real SH basis of degrees 1-4 (Sloan's polynomials in the unit direction x, y, z, with
# gsplat's signs): the factor of each basis function, band by band, as the reference multiplies
# them (backends/torch/sh.py, where c_m + i s_m = (x + i y)^m). The native kernels' recurrences
# multiply some of them out (backends/shared/sh.py); each product has the float32 value of the
# digits gsplat's kernels write.
SH_C1 = 0.4886025119029199  # y, z, x
SH_C2 = (
    1.0925484305920792,  # xy, yz, xz
    0.31539156525252005,  # 3z² - 1
    0.5462742152960396,  # c_2
)
SH_C3 = (
    0.5900435899266435,  # s_3, c_3
    1.445305721320277,  # z s_2, z c_2
    0.4570457994644658,  # (5z² - 1) y, (5z² - 1) x
    0.3731763325901154,  # z (5z² - 3)
)
SH_C4 = (
    0.6258357354491763,  # s_4, c_4
    1.7701307697799304,  # z s_3, z c_3
    0.47308734787878004,  # (7z² - 1) s_2, (7z² - 1) c_2
    0.6690465435572892,  # z (7z² - 3) y, z (7z² - 3) x
    0.10578554691520431,  # 35z⁴ - 30z² + 3
)

# Backend names (DESIGN.md): "auto" picks the native backend of the tensors' device.
BACKENDS = ("auto", "torch", "cpu", "cuda")

# SSIM of the photometric loss (Wang et al. 2004): an 11x11 Gaussian window of sigma 1.5,
# C1 = (0.01 * L)^2 and C2 = (0.03 * L)^2 for the data range L = 1
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01**2
SSIM_C2 = 0.03**2
