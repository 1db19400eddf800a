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


def normalization_roundings_bound(n: int) -> float:
    """Distance of two float64 evaluations of a normalization over n values ((x - mean) / (std + eps),
    (x - mean) / sqrt(var + eps), x - the leave-one-out mean, mean / std in any summation order or
    single / two-pass form), relative to the reference's scale (group_advantages_reference /
    masked_whiten_reference: max |x| / den (1 + |out|), (|x| + mean|x| + |mean|) / den + |out|).
    One side, to first order in u = eps / 2, with B = max |x|, S the denominator, d = x - mean:
    the mean is off by <= n u B; each d by <= (n + 2) u B; sum d^2 / (n - 1) by
    <= 2 (n + 2) u B sqrt(2 V) + (n + 2) u V (sum |d| <= sqrt(n (n - 1) V), n / (n - 1) <= 2); so the
    std (<= 2 sqrt(2) B) by <= 4 (n + 2) u B; out = d / S then by <= (n + 2) u B / S
    + 4 (n + 2) u |out| B / S + 2 u |out| (|out| <= 2 B / S) <= 4 (n + 3) u scale. Both sides:
    8 (n + 3) u, doubled for a single-pass (Welford) variance on one side: 8 (n + 3) eps."""
    return 8 * (n + 3) * EPS


def denominator_eps_bound(eps: float, n: int) -> float:
    """The change a framework's eps in the denominators of its masked means (sum / (count + eps)) makes
    to a normalization over n >= 1 values, relative to the same scale: the mean moves by
    |mean| eps / n, the variance by V eps / n (its first-order change through the mean is 0:
    sum d = 0), so 1 / sqrt(var) by eps / 2n relatively: <= (eps / n) (|mean| / den + |out|). First
    order; the rest is (eps / n)^2 of the scale."""
    return eps / n


# Roundings of one token's (or one sequence's) loss term past its sums, on one side, counted over the
# longest formula of the policy / GSPO losses and their transcriptions: log ratio 1, exp of it 2 (a
# libm exp is within 1 ulp), the advantage products and the dual clip 3, the TIS weight 4, the KL
# estimator 6, the entropy and KL coefficients and their sum 4, the aggregation weight (a division)
# and its product 2: 22, rounded up to 24.
LOSS_TERM_ROUNDINGS = 24


def loss_identity_bound(n_terms: int, denominator_eps: float = 0.0) -> float:
    """Distance of two float64 evaluations of an RL loss (a weighted sum of n_terms token terms, or of
    per-sequence means of them) or of one element of its gradient, relative to the magnitudes it is
    computed from (rl_ops.policy_loss_scales / gspo_loss_scales): the sums in any order,
    summation_order_bound's n eps; each term's roundings, LOSS_TERM_ROUNDINGS per side (u each:
    eps for both); and a framework's eps in its mean denominators (1 / (count + eps) against
    1 / count: eps / count <= eps relatively, counts >= 1)."""
    return (n_terms + LOSS_TERM_ROUNDINGS) * EPS + denominator_eps


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
