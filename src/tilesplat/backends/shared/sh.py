"""Real spherical harmonics of degree 0-4 (Sloan's form, as gsplat's kernels): the basis at a
unit direction, its VJP, and the VJP of the direction's normalisation.

``_SH`` holds the factors of the kernels' recurrences, gsplat's kernel order, each made from
the one table of the SH constants (``constants.SH_C0`` .. ``SH_C4``): some are products of
two of them. Every float32 value is the one gsplat's kernels write; in float64 a few differ
from gsplat's 13-16 digits in the last place, the table's values being correctly rounded.
"""

from __future__ import annotations

import math

from ...constants import SH_C0, SH_C1, SH_C2, SH_C3, SH_C4
from .typed import like

FUNCTIONS = ("sh_basis", "sh_basis_vjp", "normalize3_vjp")

_SH = (
    SH_C0,
    SH_C1,
    SH_C2[0],
    SH_C2[2],
    3.0 * SH_C2[1],  # 3z² - 1 as _SH[4] z² - _SH[5]
    SH_C2[1],
    5.0 * SH_C3[2],  # 5z² - 1 as _SH[6] z² - _SH[7]
    SH_C3[2],
    SH_C3[1],
    SH_C3[0],
    5.0 * SH_C3[3],  # z (5z² - 3) as z (_SH[10] z² - _SH[11])
    3.0 * SH_C3[3],
    7.0 * SH_C4[3],  # z (7z² - 3) as z (_SH[12] z² - _SH[13])
    3.0 * SH_C4[3],
    7.0 * SH_C4[2],  # 7z² - 1 as _SH[14] z² - _SH[15]
    SH_C4[2],
    SH_C4[1],
    SH_C4[0],
    7.0 * SH_C4[4] / SH_C3[3],  # 35z⁴ - 30z² + 3 from the degree-3 and degree-2 polynomials
    3.0 * SH_C4[4] / SH_C2[1],
)


def sh_basis(degree, x, y, z):
    """The 25 real SH basis values at the unit direction (x, y, z); entries beyond degree are
    0. Indices follow gsplat (k = l^2 + l + m)."""
    zero = like(x, 0.0)
    b1 = b2 = b3 = b4 = b5 = b6 = b7 = b8 = zero
    b9 = b10 = b11 = b12 = b13 = b14 = b15 = zero
    b16 = b17 = b18 = b19 = b20 = b21 = b22 = b23 = b24 = zero
    b0 = like(x, _SH[0])
    if degree >= 1:
        k = like(x, _SH[1])
        b1 = -k * y
        b2 = k * z
        b3 = -k * x
    if degree >= 2:
        z2 = z * z
        tb = -like(x, _SH[2]) * z
        ta = like(x, _SH[3])
        c1 = x * x - y * y
        s1 = like(x, 2.0) * x * y
        b6 = like(x, _SH[4]) * z2 - like(x, _SH[5])
        b7 = tb * x
        b5 = tb * y
        b8 = ta * c1
        b4 = ta * s1
        if degree >= 3:
            tc = -like(x, _SH[6]) * z2 + like(x, _SH[7])
            tb = like(x, _SH[8]) * z
            ta = -like(x, _SH[9])
            c2 = x * c1 - y * s1
            s2 = x * s1 + y * c1
            b12 = z * (like(x, _SH[10]) * z2 - like(x, _SH[11]))
            b13 = tc * x
            b11 = tc * y
            b14 = tb * c1
            b10 = tb * s1
            b15 = ta * c2
            b9 = ta * s2
            if degree >= 4:
                td = z * (-like(x, _SH[12]) * z2 + like(x, _SH[13]))
                tc = like(x, _SH[14]) * z2 - like(x, _SH[15])
                tb = -like(x, _SH[16]) * z
                ta = like(x, _SH[17])
                c3 = x * c2 - y * s2
                s3 = x * s2 + y * c2
                b20 = like(x, _SH[18]) * z2 * (like(x, _SH[10]) * z2 - like(x, _SH[11])) - like(
                    x, _SH[19]
                ) * (like(x, _SH[4]) * z2 - like(x, _SH[5]))
                b21 = td * x
                b19 = td * y
                b22 = tc * c1
                b18 = tc * s1
                b23 = tb * c2
                b17 = tb * s2
                b24 = ta * c3
                b16 = ta * s3
    return (
        b0,
        b1,
        b2,
        b3,
        b4,
        b5,
        b6,
        b7,
        b8,
        b9,
        b10,
        b11,
        b12,
        b13,
        b14,
        b15,
        b16,
        b17,
        b18,
        b19,
        b20,
        b21,
        b22,
        b23,
        b24,
    )


def sh_basis_vjp(degree, x, y, z, g):
    """Gradient (v_x, v_y, v_z) of sum_k g[k] * sh_basis(degree, x, y, z)[k], treating x, y,
    z as independent (the normalisation is handled by normalize3_vjp). g: any indexable of 25
    (a tuple, or a local array on either target)."""
    zero = like(x, 0.0)
    two = like(x, 2.0)
    gx = zero
    gy = zero
    gz = zero
    if degree >= 1:
        k = like(x, _SH[1])
        gy -= k * g[1]
        gz += k * g[2]
        gx -= k * g[3]
    if degree >= 2:
        z2 = z * z
        kb = like(x, _SH[2])
        tb = -kb * z
        ta = like(x, _SH[3])
        c1 = x * x - y * y
        s1 = two * x * y
        gz += like(x, _SH[4]) * two * z * g[6]
        gx += tb * g[7]
        gz -= kb * x * g[7]
        gy += tb * g[5]
        gz -= kb * y * g[5]
        gx += ta * two * x * g[8]
        gy -= ta * two * y * g[8]
        gx += ta * two * y * g[4]
        gy += ta * two * x * g[4]
        if degree >= 3:
            three = like(x, 3.0)
            tc = -like(x, _SH[6]) * z2 + like(x, _SH[7])
            dtc = -like(x, _SH[6]) * two * z
            kb3 = like(x, _SH[8])
            tb = kb3 * z
            ta = -like(x, _SH[9])
            c2 = x * c1 - y * s1
            s2 = x * s1 + y * c1
            gz += (three * like(x, _SH[10]) * z2 - like(x, _SH[11])) * g[12]
            gx += tc * g[13]
            gz += dtc * x * g[13]
            gy += tc * g[11]
            gz += dtc * y * g[11]
            gx += tb * two * x * g[14]
            gy -= tb * two * y * g[14]
            gz += kb3 * c1 * g[14]
            gx += tb * two * y * g[10]
            gy += tb * two * x * g[10]
            gz += kb3 * s1 * g[10]
            # c2 = Re (x + iy)^3, s2 = Im (x + iy)^3
            gx += ta * three * c1 * g[15]
            gy -= ta * three * s1 * g[15]
            gx += ta * three * s1 * g[9]
            gy += ta * three * c1 * g[9]
            if degree >= 4:
                four = like(x, 4.0)
                td = z * (-like(x, _SH[12]) * z2 + like(x, _SH[13]))
                dtd = -three * like(x, _SH[12]) * z2 + like(x, _SH[13])
                tc = like(x, _SH[14]) * z2 - like(x, _SH[15])
                dtc = like(x, _SH[14]) * two * z
                kb4 = like(x, _SH[16])
                tb = -kb4 * z
                ta = like(x, _SH[17])
                p3 = like(x, _SH[10]) * z2 - like(x, _SH[11])
                gz += (
                    like(x, _SH[18]) * (two * z * p3 + z2 * like(x, _SH[10]) * two * z)
                    - like(x, _SH[19]) * like(x, _SH[4]) * two * z
                ) * g[20]
                gx += td * g[21]
                gz += dtd * x * g[21]
                gy += td * g[19]
                gz += dtd * y * g[19]
                gx += tc * two * x * g[22]
                gy -= tc * two * y * g[22]
                gz += dtc * c1 * g[22]
                gx += tc * two * y * g[18]
                gy += tc * two * x * g[18]
                gz += dtc * s1 * g[18]
                gx += tb * three * c1 * g[23]
                gy -= tb * three * s1 * g[23]
                gz -= kb4 * c2 * g[23]
                gx += tb * three * s1 * g[17]
                gy += tb * three * c1 * g[17]
                gz -= kb4 * s2 * g[17]
                gx += ta * four * c2 * g[24]
                gy -= ta * four * s2 * g[24]
                gx += ta * four * s2 * g[16]
                gy += ta * four * c2 * g[16]
    return gx, gy, gz


def normalize3_vjp(x, y, z, gx, gy, gz):
    """Gradient w.r.t. v of v / max(|v|, 1e-12), given the gradient g of the result."""
    norm = math.sqrt(x * x + y * y + z * z)
    if norm <= like(x, 1e-12):
        inv = like(x, 1e12)
        return gx * inv, gy * inv, gz * inv
    inv = like(x, 1.0) / norm
    nx = x * inv
    ny = y * inv
    nz = z * inv
    d = nx * gx + ny * gy + nz * gz
    return (gx - nx * d) * inv, (gy - ny * d) * inv, (gz - nz * d) * inv
