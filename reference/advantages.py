"""float64 advantage estimators: GAE (sequential, numba) and group-normalized advantages (NumPy).

Semantics shared with rlk_triton.advantages:
- GAE runs backwards over the ACTIVE tokens of each row; masked tokens are transparent (they neither
  contribute nor break the recurrence) and get 0. Past the last active token stands the bootstrap
  value (0 for a finished sequence).
      delta_t = r_t + gamma * V_next(t) - V_t,  A_t = delta_t + gamma * lam * A_next(t),  R_t = A_t + V_t
- Groups: over the valid members of each group, mean; mean / (std + eps) with the unbiased std (as
  torch.std); leave-one-out s - mean(others). A group with one valid member gets 0; invalid rows 0.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=False)
def _gae(r, v, mask, boot, gamma, lam):
    B, T = r.shape
    adv = np.zeros((B, T))
    ret = np.zeros((B, T))
    scale = np.zeros((B, T))
    for b in range(B):
        a_next = 0.0
        s_next = 0.0
        v_next = boot[b]
        for t in range(T - 1, -1, -1):
            if mask[b, t]:
                delta = r[b, t] + gamma * v_next - v[b, t]
                a = delta + gamma * lam * a_next
                # the size of what the sum of A_t is made of: the error scale of fp32 arithmetic
                s = abs(r[b, t]) + gamma * abs(v_next) + abs(v[b, t]) + gamma * lam * s_next
                adv[b, t] = a
                ret[b, t] = a + v[b, t]
                scale[b, t] = s + abs(v[b, t])
                a_next, s_next, v_next = a, s, v[b, t]
    return adv, ret, scale


def gae_reference(rewards, values, mask, bootstrap=None, gamma=1.0, lam=1.0):
    """(advantages, returns, scale) float64 [B, T]; scale bounds the magnitudes each output is made of."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    m = np.asarray(mask).astype(np.bool_)
    boot = np.zeros(r.shape[0]) if bootstrap is None else np.asarray(bootstrap, np.float64)
    return _gae(r, v, m, boot, float(gamma), float(lam))


def group_advantages_reference(scores, group_ids, valid=None, mode="mean_std", eps=1e-6, singleton="zero"):
    """(advantages, scale) float64 [B]; scale bounds the magnitudes the output is computed from.
    singleton "raw": a group of one has baseline 0 and std 1 (s, or s / (1 + eps) for mean_std)."""
    s = np.asarray(scores, np.float64)
    g = np.asarray(group_ids, np.int64)
    ok = np.ones(s.shape, bool) if valid is None else np.asarray(valid).astype(bool)
    adv = np.zeros_like(s)
    scale = np.zeros_like(s)
    for grp in np.unique(g[ok]):
        idx = np.nonzero(ok & (g == grp))[0]
        n = idx.size
        x = s[idx]
        mean = x.mean()
        big = np.abs(x).max()
        if n == 1:
            if singleton == "raw":
                adv[idx] = x / (1.0 + eps) if mode == "mean_std" else x
                scale[idx] = np.abs(x)
            continue
        if mode == "mean":
            adv[idx] = x - mean
            scale[idx] = big
        elif mode == "mean_std":
            std = x.std(ddof=1)
            adv[idx] = (x - mean) / (std + eps)
            scale[idx] = big / (std + eps) * (1.0 + np.abs(adv[idx]))
        elif mode == "rloo":
            adv[idx] = x - (x.sum() - x) / (n - 1)
            scale[idx] = big * n / (n - 1)
        else:
            raise ValueError(mode)
    return adv, scale


def reinforce_pp_baseline_reference(scores, group_ids, mask, valid=None, eps=1e-6, singleton="zero",
                                    eps_placement="std"):
    """(token advantages, scale) float64 [B, T]: group-mean baseline (singleton "raw": baseline 0 for
    a group of one), whitened over active tokens: / (std + eps), or * rsqrt(var + eps) ("var")."""
    a, _ = group_advantages_reference(scores, group_ids, valid, "mean", singleton=singleton)
    s = np.asarray(scores, np.float64)
    g = np.asarray(group_ids, np.int64)
    ok = np.ones(s.shape, bool) if valid is None else np.asarray(valid).astype(bool)
    if singleton == "zero":
        for grp in np.unique(g[ok]):  # a single-member group: its baseline is itself
            idx = np.nonzero(ok & (g == grp))[0]
            if idx.size == 1:
                a[idx] = 0.0
    tokens = np.asarray(mask).astype(bool) & ok[:, None]
    vals = np.broadcast_to(a[:, None], tokens.shape)[tokens]
    mean = vals.mean() if vals.size else 0.0
    std = vals.std(ddof=1) if vals.size > 1 else 0.0
    den = std + eps if eps_placement == "std" else np.sqrt(std * std + eps)
    out = np.where(tokens, (a[:, None] - mean) / den, 0.0)
    big = np.abs(s[ok]).max() if ok.any() else 0.0
    scale = np.where(tokens, big / den * (1.0 + np.abs(out)), 0.0)
    return out, scale


def masked_whiten_reference(values, mask, shift_mean=True, unbiased=True, eps=1e-8, eps_placement="var",
                            mean=None, var=None):
    """(whitened, scale) float64 [B, T]: (v - mean) / den over the active tokens (0 elsewhere),
    den = sqrt(var + eps) ("var") or sqrt(var) + eps ("std"); var unbiased unless told; the caller's
    mean / var when given. scale: (|v| + mean |v| + |mean|) / den + |out|, what the output's fp32
    rounding grows with (the mean's and variance's sums, the subtraction, the division)."""
    v = np.asarray(values, np.float64)
    m = np.asarray(mask).astype(bool)
    x = v[m]
    n = x.size
    if mean is None:
        mean = x.mean() if n else 0.0
        dof = n - 1 if unbiased else n
        var = ((x - mean) ** 2).sum() / dof if dof > 0 else 0.0
    den = np.sqrt(var + eps) if eps_placement == "var" else np.sqrt(var) + eps
    out = np.where(m, (v - mean) / den if den else 0.0, 0.0)
    if not shift_mean:
        out = np.where(m, out + mean, 0.0)
    big = np.abs(x).mean() if n else 0.0
    scale = np.where(m, (np.abs(v) + big + abs(mean)) / den if den else 0.0, 0.0) + np.abs(out)
    return out, scale
