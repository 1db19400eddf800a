"""float64 references of RMSNorm and SwiGLU (rlk_triton.ops.rmsnorm / swiglu) and their gradients.

RMSNorm over the last dim of h [N, H], with w' = weight + weight_offset:
  rstd = 1 / sqrt(mean_j h_j^2 + eps),  xhat = h * rstd,  y = xhat * w'
  d h_j  = rstd * (g_j w'_j - xhat_j * c),  c = (1/H) sum_k g_k w'_k xhat_k
  d w_j  = sum_rows g_j xhat_j
With a fused residual, h = x + residual (rounded to the dtype by the op) and both x and residual
receive d h + the upstream gradient of the returned residual stream.

SwiGLU, elementwise: s = sigmoid(g), y = g s u,  d u = dy g s,  d g = dy u s (1 + g (1 - s)).
Everything float64 and written the obvious way; tests check the gradients by finite differences.
"""
from __future__ import annotations

import numpy as np


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def rms_norm_reference(h, weight, eps=1e-6, weight_offset=0.0):
    """(y, rstd) float64 for the rows of h [..., H] (h is what the op normalizes: x, or x + residual)."""
    h = _f64(h)
    rstd = 1.0 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    return h * rstd * (_f64(weight) + weight_offset), rstd[..., 0]


def rms_norm_grad_reference(h, weight, grad_y, eps=1e-6, weight_offset=0.0, grad_residual=None):
    """(d h, d weight) float64 for loss = sum grad_y * y (+ sum grad_residual * h)."""
    h, g = _f64(h), _f64(grad_y)
    H = h.shape[-1]
    rstd = 1.0 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    xhat = h * rstd
    gw = g * (_f64(weight) + weight_offset)
    c = np.sum(gw * xhat, axis=-1, keepdims=True) / H
    dh = rstd * (gw - xhat * c)
    if grad_residual is not None:
        dh = dh + _f64(grad_residual)
    dw = np.sum((g * xhat).reshape(-1, H), axis=0)
    return dh, dw


def _sigmoid(g):
    # exp of -|g| only: no overflow for large |g|
    e = np.exp(-np.abs(g))
    return np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def swiglu_reference(gate, up):
    g = _f64(gate)
    return g * _sigmoid(g) * _f64(up)


def swiglu_grad_reference(gate, up, grad_y):
    """(d gate, d up) float64 for loss = sum grad_y * swiglu(gate, up)."""
    g, u, dy = _f64(gate), _f64(up), _f64(grad_y)
    s = _sigmoid(g)
    return dy * u * s * (1.0 + g * (1.0 - s)), dy * g * s
