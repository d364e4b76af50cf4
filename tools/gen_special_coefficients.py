"""Generate torch_pjrt/lowering/families/_special_coefficients.py (needs mpmath).

Each special function in families/special.py that JAX lacks is evaluated as a
Chebyshev series on a few intervals (with the function's known singular or
oscillating factor taken out). This script computes those series from mpmath at
50 digits, truncates them where the terms drop below 1e-17, and writes them out:

    python tools/gen_special_coefficients.py > torch_pjrt/lowering/families/_special_coefficients.py
"""

from __future__ import annotations

import mpmath as mp

mp.mp.dps = 50
PI = mp.pi


def chebyshev(f, n=80, tol=1e-17):
    """Coefficients c_k of f(s) = sum_k c_k T_k(s) on [-1, 1] (c_0 not halved)."""
    nodes = [mp.cos(PI * (j + mp.mpf(1) / 2) / n) for j in range(n)]
    values = [f(s) for s in nodes]
    coeffs = []
    for k in range(n):
        c = 2 * mp.fsum(v * mp.cos(PI * k * (j + mp.mpf(1) / 2) / n)
                        for j, v in enumerate(values)) / n
        coeffs.append(c / 2 if k == 0 else c)
    scale = max(abs(c) for c in coeffs)
    while len(coeffs) > 1 and abs(coeffs[-1]) < tol * scale:
        coeffs.pop()
    return coeffs


# ----------------------------------------------------------- Bessel J and Y
# 0 <= x <= 8: s = 2 (x/8)^2 - 1.  x > 8: s = 2 (8/x)^2 - 1.
def x_small(s):
    return 8 * mp.sqrt((s + 1) / 2)


def x_large(s):
    return 8 / mp.sqrt((s + 1) / 2)


def hankel_pq(nu, x):
    """P and Q of J = A (P cos chi - Q sin chi), Y = A (P sin chi + Q cos chi)."""
    chi = x - (2 * nu + 1) * PI / 4
    a = mp.sqrt(2 / (PI * x))
    j, y = mp.besselj(nu, x), mp.bessely(nu, x)
    return (j * mp.cos(chi) + y * mp.sin(chi)) / a, (-j * mp.sin(chi) + y * mp.cos(chi)) / a


def j0_small(s):
    return mp.besselj(0, x_small(s))


def j1_small(s):  # J1(x) / x
    x = x_small(s)
    return mp.besselj(1, x) / x if x else mp.mpf(1) / 2


def y0_small(s):  # Y0(x) - (2/pi) ln(x) J0(x)
    x = x_small(s)
    return mp.bessely(0, x) - 2 / PI * mp.log(x) * mp.besselj(0, x)


def y1_small(s):  # (Y1(x) - (2/pi)(ln(x) J1(x) - 1/x)) / x
    x = x_small(s)
    return (mp.bessely(1, x) - 2 / PI * (mp.log(x) * mp.besselj(1, x) - 1 / x)) / x


def p0_large(s):
    return hankel_pq(0, x_large(s))[0]


def q0_large(s):  # x Q0(x)
    x = x_large(s)
    return x * hankel_pq(0, x)[1]


def p1_large(s):
    return hankel_pq(1, x_large(s))[0]


def q1_large(s):  # x Q1(x)
    x = x_large(s)
    return x * hankel_pq(1, x)[1]


# ------------------------------------------------------- modified Bessel K
# 0 <= x <= 2: s = x^2 / 2 - 1.  x > 2: s = 4 / x - 1.
def xk_small(s):
    return mp.sqrt(2 * (s + 1))


def xk_large(s):
    return 4 / (s + 1)


def k0_small(s):  # K0(x) + ln(x) I0(x)
    x = xk_small(s)
    return mp.besselk(0, x) + mp.log(x) * mp.besseli(0, x)


def k1_small(s):  # (K1(x) - ln(x) I1(x) - 1/x) / x
    x = xk_small(s)
    return (mp.besselk(1, x) - mp.log(x) * mp.besseli(1, x) - 1 / x) / x


def k0_large(s):  # e^x sqrt(x) K0(x)
    x = xk_large(s)
    return mp.exp(x) * mp.sqrt(x) * mp.besselk(0, x)


def k1_large(s):
    x = xk_large(s)
    return mp.exp(x) * mp.sqrt(x) * mp.besselk(1, x)


# ------------------------------------------------------------------ Airy Ai
# -4 <= x <= 2: s = (x + 1) / 3.  x > 2: zeta = 2/3 x^1.5, s = 2 zeta(2) / zeta - 1.
# x < -4: z = -x, zeta = 2/3 z^1.5, s = 2 zeta(4) / zeta - 1.
ZETA2 = mp.mpf(2) / 3 * mp.mpf(2) ** mp.mpf(1.5)
ZETA4 = mp.mpf(2) / 3 * mp.mpf(4) ** mp.mpf(1.5)


def ai_mid(s):
    return mp.airyai(3 * s - 1)


def ai_pos(s):  # 2 sqrt(pi) x^(1/4) e^zeta Ai(x)
    zeta = 2 * ZETA2 / (s + 1)
    x = (mp.mpf(3) / 2 * zeta) ** (mp.mpf(2) / 3)
    return 2 * mp.sqrt(PI) * x ** mp.mpf(0.25) * mp.exp(zeta) * mp.airyai(x)


def _ai_neg_pq(s):
    zeta = 2 * ZETA4 / (s + 1)
    z = (mp.mpf(3) / 2 * zeta) ** (mp.mpf(2) / 3)
    theta = zeta + PI / 4
    scale = mp.sqrt(PI) * z ** mp.mpf(0.25)
    ai, bi = mp.airyai(-z), mp.airybi(-z)
    return (scale * (ai * mp.sin(theta) + bi * mp.cos(theta)),
            scale * (-ai * mp.cos(theta) + bi * mp.sin(theta)))


def ai_neg_p(s):  # Ai(-z) = z^(-1/4)/sqrt(pi) (P sin(theta) - Q cos(theta))
    return _ai_neg_pq(s)[0]


def ai_neg_q(s):  # zeta Q
    zeta = 2 * ZETA4 / (s + 1)
    return zeta * _ai_neg_pq(s)[1]


TABLES = {
    "J0_SMALL": j0_small, "J1_SMALL": j1_small, "Y0_SMALL": y0_small, "Y1_SMALL": y1_small,
    "P0_LARGE": p0_large, "Q0_LARGE": q0_large, "P1_LARGE": p1_large, "Q1_LARGE": q1_large,
    "K0_SMALL": k0_small, "K1_SMALL": k1_small, "K0_LARGE": k0_large, "K1_LARGE": k1_large,
    "AI_MID": ai_mid, "AI_POS": ai_pos, "AI_NEG_P": ai_neg_p, "AI_NEG_Q": ai_neg_q,
}


def main() -> None:
    print('"""Chebyshev coefficients for families/special.py, from '
          'tools/gen_special_coefficients.py."""')
    print()
    for name, f in TABLES.items():
        coeffs = chebyshev(f, n=96)
        print(f"{name} = (")
        for c in coeffs:
            print(f"    {mp.nstr(c, 20, min_fixed=-1, max_fixed=1)},")
        print(")")
        print()


if __name__ == "__main__":
    main()
