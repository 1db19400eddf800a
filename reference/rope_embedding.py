"""float64 RoPE and embedding, with their gradients.

RoPE, for a pair (x1, x2) of a token at position p, with c = cos[p, i], s = sin[p, i]:
  y1 = x1 c - x2 s,   y2 = x2 c + x1 s            (a rotation by the angle a_pi)
  d x1 = g1 c + g2 s, d x2 = g2 c - g1 s           (the transpose: the rotation by -a_pi)
Half rotation pairs dim i with i + R/2, interleaved pairs 2i with 2i + 1; dims >= R pass through.
The references take the tables as given (the kernel's fp32 tables, upcast exactly), so a judgment
measures the kernel's arithmetic; rope_tables_reference gives the exact float64 tables that the
fp32 ones are held to.

Embedding: out[t] = W[id_t];  dW[v] = sum over tokens t with id_t = v (not padding) of g[t].
"""
from __future__ import annotations

import math

import numpy as np


def rope_inv_freq_reference(rotary_dim, base=10000.0, scaling=None):
    """theta_i in float64, written out per frequency (independent of rlk_triton.ops.rope)."""
    kind = None if scaling is None else scaling.get("type", scaling.get("rope_type"))
    if kind == "ntk" and rotary_dim > 2:  # with one frequency, theta_0 = 1 whatever the base
        base = base * scaling["factor"] ** (rotary_dim / (rotary_dim - 2))
    out = []
    for i in range(rotary_dim // 2):
        theta = base ** (-(2.0 * i) / rotary_dim)
        if kind == "linear":
            theta = theta / scaling["factor"]
        elif kind == "llama3":  # transformers' _compute_llama3_parameters, one frequency at a time
            f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
            old = scaling["original_max_position_embeddings"]
            wavelen = 2 * math.pi / theta
            if wavelen > old / lo:
                theta = theta / f
            elif wavelen >= old / hi:
                smooth = (old / wavelen - lo) / (hi - lo)
                theta = (1 - smooth) * theta / f + smooth * theta
        out.append(theta)
    return np.array(out, dtype=np.float64)


def rope_tables_reference(max_positions, rotary_dim, base=10000.0, scaling=None):
    """(cos, sin) float64 [max_positions, rotary_dim // 2], unrounded."""
    theta = rope_inv_freq_reference(rotary_dim, base, scaling)
    angle = np.arange(max_positions, dtype=np.float64)[:, None] * theta[None, :]
    return np.cos(angle), np.sin(angle)


def _pairs(D, half, interleaved):
    i = np.arange(half)
    return (2 * i, 2 * i + 1) if interleaved else (i, i + half)


def _rotate(x, cos, sin, positions, interleaved, sign):
    x = np.asarray(x, np.float64)  # [T, H, D]
    cos, sin = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    pos = np.asarray(positions, np.int64).reshape(-1)
    half = cos.shape[1]
    a, b = _pairs(x.shape[-1], half, interleaved)
    c = cos[pos][:, None, :]
    s = sign * sin[pos][:, None, :]
    out = x.copy()
    x1, x2 = x[..., a], x[..., b]
    out[..., a] = x1 * c - x2 * s
    out[..., b] = x2 * c + x1 * s
    return out


def rope_reference(x, cos, sin, positions, interleaved=False):
    """x [T, H, D] rotated by the angles of positions [T]; float64."""
    return _rotate(x, cos, sin, positions, interleaved, 1.0)


def rope_grad_reference(grad_out, cos, sin, positions, interleaved=False):
    """d loss / d x for loss = sum grad_out * rope(x): the inverse rotation of grad_out; float64."""
    return _rotate(grad_out, cos, sin, positions, interleaved, -1.0)


def rope_scale(x, cos, sin, positions, interleaved=False):
    """Per element |x1 c| + |x2 s| (|x| on pass-through dims): the size of the numbers the fp32
    arithmetic of that output handles, which its rounding error grows with."""
    x = np.abs(np.asarray(x, np.float64))
    cos, sin = np.abs(np.asarray(cos, np.float64)), np.abs(np.asarray(sin, np.float64))
    pos = np.asarray(positions, np.int64).reshape(-1)
    a, b = _pairs(x.shape[-1], cos.shape[1], interleaved)
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    out = x.copy()
    out[..., a] = x[..., a] * c + x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def embedding_reference(token_ids, weight):
    return np.asarray(weight, np.float64)[np.asarray(token_ids, np.int64)]


def embedding_grad_reference(grad_out, token_ids, num_embeddings, padding_idx=None):
    """(dW, sensitivity), float64 [V, H]. sensitivity[v] = sum_{k >= 2} |S_k|, the partial sums of
    v's gradient rows in ascending token order: a sequential fp32 sum is within u * that of the
    exact sum (first order), whatever the values."""
    g = np.asarray(grad_out, np.float64).reshape(-1, np.shape(grad_out)[-1])
    ids = np.asarray(token_ids, np.int64).reshape(-1)
    dw = np.zeros((num_embeddings, g.shape[1]))
    sens = np.zeros_like(dw)
    seen = np.zeros(num_embeddings, bool)
    for t, v in enumerate(ids):  # ascending token order
        if v < 0 or v >= num_embeddings or (padding_idx is not None and v == padding_idx % num_embeddings):
            continue
        dw[v] += g[t]
        if seen[v]:
            sens[v] += np.abs(dw[v])
        seen[v] = True
    return dw, sens
