"""Checks of the float64 references' own math, with bounds that are the numerical error of the check
itself, derived here. They are not contracts (contracts/ judge the kernels against the references);
a test that holds one float64 computation against another takes its bound from this module.
"""
from __future__ import annotations

import math

import numpy as np

EPS = float(np.finfo(np.float64).eps)  # 2^-52


def central_difference_bound(h: float, f_scale: float, third_derivative: float = 0.0) -> float:
    """The error of (f(x + h) - f(x - h)) / 2h against f'(x): truncation h^2 |f'''| / 6 (0 for an f
    linear in x), plus rounding, 4 eps (1 + f_scale) / h, where f_scale bounds the terms one evaluation
    of f adds up (|f| itself for a single well-conditioned value, the sum of |terms| for a sum)."""
    return h * h * third_derivative / 6 + 4 * EPS * (1 + f_scale) / h


def central_difference_step(f_scale: float, third_derivative: float) -> float:
    """The h that minimizes central_difference_bound, h^2 T / 6 + r / h with r = 4 eps (1 + f_scale)
    and T = third_derivative: its derivative h T / 3 - r / h^2 vanishes at h = (3 r / T)^(1/3)."""
    return (12 * EPS * (1 + f_scale) / third_derivative) ** (1 / 3)


def assert_central_differences(f, x: np.ndarray, analytic: np.ndarray, h: float = 1e-6,
                               third_derivative: float = 0.0, f_scale: float | None = None) -> None:
    """Central differences of the scalar f at every element of x equal `analytic` within
    central_difference_bound (f_scale defaults to |f(x)|). The quotient divides by the step actually
    taken, x[i] + h and x[i] - h as rounded: dividing by 2h would add |f'| ulp(x[i]) / 2h, which the
    bound does not count (the two half steps then differ by an ulp of x[i] at most, which moves the
    quotient by |f''| ulp(x[i]) / 2, far below the rounding term)."""
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        num[i] = (f(xp) - f(xm)) / (xp[i] - xm[i])
    bound = central_difference_bound(h, abs(f(x)) if f_scale is None else f_scale, third_derivative)
    err = float(np.abs(num - analytic).max()) if num.size else 0.0
    assert err <= bound, (err, bound)


def summation_order_bound(n: int, abs_sum: float) -> float:
    """How far two float64 sums of the same n terms, added in different orders, can be apart: each
    is within (n - 1) u sum|terms| of the exact sum (u = eps / 2), so n eps sum|terms| covers both."""
    return n * EPS * abs_sum


def power_evaluations_bound(base: float, roundings: int) -> float:
    """Relative distance of two float64 evaluations of base ** e (e = +-2i / R, |e| <= 1) followed by
    the same formula written two ways: rounding e moves the power by ln(base) |e| u relatively, pow
    and every later operation add at most u each (u = eps / 2); with `roundings` operations counted
    over both evaluations, (ln(base) + roundings) eps covers both sides."""
    return (math.log(base) + roundings) * EPS


def product_roundings_bound(roundings: int) -> float:
    """Relative distance of two float64 evaluations of the same product / quotient of the same float64
    numbers (no underflow or overflow), `roundings` counting the multiplications and divisions over
    both: each is exact within a factor 1 + d, |d| <= u = eps / 2, so the ratio of the two is a
    product of `roundings` factors (1 + d)^(+-1), within gamma_k = k u / (1 - k u) of 1 (Higham,
    Accuracy and Stability of Numerical Algorithms, Lemma 3.1). A bound, not an estimate: no margin,
    and relative to either side."""
    ku = roundings * EPS / 2
    return ku / (1 - ku)


def softmax_third_derivative_bound(logit_range, value_range, lse_weight):
    """|d^3/dt^3| of lse_weight log sum_j exp(s_j + t a_j) + sum_j p_j(t) w_j, p = softmax(s + t a):
    one softmax row's share of a loss, along an input that moves its logits at rates a (attention's
    q moves a row's logits at rates scale k[j, d]; a key k[j] moves logit j of each row that sees it
    at rate scale q[i, d]). The t-derivatives of log sum exp are the cumulants of a under p, those of
    E_p[w] the joint cumulants of (w, a, a, ...), so the third is lse_weight k3(a) + k(w, a, a, a).
    With R = range of a, W = range of w over the row's keys (x' = x - E_p x, |x'| <= range, and
    Var <= range^2 / 4, Popoviciu): |k3(a)| = |E a'^3| <= R Var(a) <= R^3 / 4 and |k(w, a, a, a)| =
    |E[w' a'^3] - 3 E[w' a'] E[a'^2]| <= W R^3 / 4 + 3 (W R / 4)(R^2 / 4) = 7 W R^3 / 16. R and W do
    not depend on t or p, so the bound holds over the whole step. Elementwise on arrays."""
    return logit_range ** 3 * (np.abs(lse_weight) / 4 + 7 * value_range / 16)
