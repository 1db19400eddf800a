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


def assert_central_differences(f, x: np.ndarray, analytic: np.ndarray, h: float = 1e-6,
                               third_derivative: float = 0.0, f_scale: float | None = None) -> None:
    """Central differences of the scalar f at every element of x equal `analytic` within
    central_difference_bound (f_scale defaults to |f(x)|)."""
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        num[i] = (f(xp) - f(xm)) / (2 * h)
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
