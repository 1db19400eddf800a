"""float64 varlen attention with LSE, and its gradients.

Per sequence [a, b) of the pack and q head h (kv head h // (Hq / Hkv)):
  s = scale * Q K^T (key j visible to query i iff j <= i when causal), lse = log sum_j exp(s_ij),
  p = exp(s - lse), out = p V.
For loss = sum dout * out + sum dlse * lse:
  dV = p^T dout, dp = dout V^T, ds = p * (dp - (rowsum(dout * out) - dlse)),
  dQ = scale ds K, dK = scale ds^T Q  (dK, dV summed over the q heads of the group).
"""
from __future__ import annotations

import numpy as np


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def sequence_scores(q, k, scale, causal):
    """(s [Hq, L, L] with invisible keys at -inf, visible mask [L, L]) of one sequence."""
    q, k = _f64(q), _f64(k)
    L, Hq, _ = q.shape
    G = Hq // k.shape[1]
    kk = np.repeat(k, G, axis=1)  # [L, Hq, D]
    s = scale * np.einsum("ihd,jhd->hij", q, kk)
    visible = np.tril(np.ones((L, L), bool)) if causal else np.ones((L, L), bool)
    return np.where(visible[None], s, -np.inf), visible


def _softmax(s):
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    tot = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.log(tot) + m)[..., 0]
    return e / np.where(tot == 0, 1.0, tot), lse


def attention_reference(q, k, v, cu_seqlens, scale, causal=True):
    """(out [N, Hq, D], lse [Hq, N]) float64."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    N, Hq, D = q.shape
    G = Hq // k.shape[1]
    out = np.zeros((N, Hq, D))
    lse = np.full((Hq, N), -np.inf)
    cu = np.asarray(cu_seqlens, np.int64)
    for a, b in zip(cu[:-1], cu[1:]):
        if b == a:
            continue
        s, _ = sequence_scores(q[a:b], k[a:b], scale, causal)
        p, lse[:, a:b] = _softmax(s)
        out[a:b] = np.einsum("hij,jhd->ihd", p, np.repeat(v[a:b], G, axis=1))
    return out, lse


def attention_grad_reference(q, k, v, cu_seqlens, scale, causal, dout, dlse=None):
    """(dq, dk, dv) float64 for loss = sum dout * out + sum dlse * lse."""
    q, k, v, dout = _f64(q), _f64(k), _f64(v), _f64(dout)
    N, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dlse = np.zeros((Hq, N)) if dlse is None else _f64(dlse)
    cu = np.asarray(cu_seqlens, np.int64)
    for a, b in zip(cu[:-1], cu[1:]):
        if b == a:
            continue
        s, _ = sequence_scores(q[a:b], k[a:b], scale, causal)
        p, _ = _softmax(s)  # [Hq, L, L]
        vv = np.repeat(v[a:b], G, axis=1)
        kk = np.repeat(k[a:b], G, axis=1)
        o = np.einsum("hij,jhd->ihd", p, vv)
        do = dout[a:b]
        dvv = np.einsum("hij,ihd->jhd", p, do)
        dp = np.einsum("ihd,jhd->hij", do, vv)
        delta = np.einsum("ihd,ihd->hi", do, o) - dlse[:, a:b]
        ds = p * (dp - delta[:, :, None])
        dq[a:b] = scale * np.einsum("hij,jhd->ihd", ds, kk)
        dkk = scale * np.einsum("hij,ihd->jhd", ds, q[a:b])
        L = b - a
        dk[a:b] = dkk.reshape(L, Hkv, G, D).sum(2)
        dv[a:b] = dvv.reshape(L, Hkv, G, D).sum(2)
    return dq, dk, dv
