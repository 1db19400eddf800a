"""Rollout correction: importance weights and rejection masks for the rollout / trainer mismatch.

Per sequence (row) i with active tokens T_i (n_i = |T_i|) and lr_t = old_logp_t - rollout_logp_t
(lrc_t = clip(lr_t, -c, c) with log_ratio_clamp = c, else lr_t):
  importance weights (is_level):
    token       w_t = exp(lrc_t)
    sequence    w_t = exp(L_i), L_i = sum_{T_i} lr_t         (the product of the token ratios; clamped to +-c)
    geometric   w_t = exp(L_i), L_i = mean_{T_i} lr_t        (their geometric mean; clamped to +-c)
    is_mode "truncate": min(max(w, is_low), is_high); "mask": w inside [is_low, is_high], else 0
  rejection (rs, verl's rollout_rs statistics, with k1 = -lrc, k2 = lrc^2 / 2, k3 = exp(lrc) - 1 - lrc):
    token_kX      per token;  seq_sum_kX / seq_mean_kX / seq_max_kX  the sum / mean / max over T_i
    k1 statistics are kept inside [lo, hi] (log-space bounds), k2 / k3 statistics at or below hi;
    a token is kept when it is active and every criterion (its own and its sequence's) passes.
Kernel: one program per row, two passes over the row's BLOCK_T-token tiles in increasing order
(tl.sum / tl.max trees per tile): the row's sums, then the weights and the keep mask. Nothing mixes
rows, so a sequence's weights and mask are bitwise its own (batch-invariant); no atomics. The order is
stated in rlk_triton/ops/reduction.py.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of
from .rl_losses import _clip
from .launch import cached

IS_LEVELS = {"token": 0, "sequence": 1, "geometric": 2}
IS_MODES = {"truncate": 0, "mask": 1}
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
N_ROW_OUT = 4  # per row: n, L (the sequence log-weight), sequence kept (0 / 1), kept tokens


@triton.jit
def _token_stats(old_ptr, roll_ptr, mask_ptr, p, inb, lr_clamp, HAS_CLAMP: tl.constexpr):
    """(active, lr, lrc, k1, k2, k3) of one tile; 0 on inactive lanes."""
    active = inb & (tl.load(mask_ptr + p, mask=inb, other=0) != 0)
    old = tl.load(old_ptr + p, mask=active, other=0.0)
    roll = tl.load(roll_ptr + p, mask=active, other=0.0)
    lr = tl.where(active, old - roll, 0.0)
    lrc = lr
    if HAS_CLAMP:
        lrc = _clip(lr, -lr_clamp, lr_clamp)
    k1 = -lrc
    k2 = 0.5 * lrc * lrc
    k3 = tl.where(active, (tl.exp(lrc) - 1.0) - lrc, 0.0)
    return active, lr, lrc, k1, k2, k3


@triton.jit
def _inside(x, lo, hi, LOWER: tl.constexpr):
    if LOWER:
        return (x >= lo) & (x <= hi)
    else:
        return x <= hi


@cached
@triton.jit(do_not_specialize=["T", "is_low", "is_high", "lr_clamp"])
def _rollout_correction_kernel(old_ptr, roll_ptr, mask_ptr, bounds_ptr, weight_ptr, keep_ptr, row_ptr,
                               T, is_low, is_high, lr_clamp,
                               IS_LEVEL: tl.constexpr, IS_MODE: tl.constexpr, HAS_LOW: tl.constexpr,
                               RS: tl.constexpr, HAS_CLAMP: tl.constexpr, BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_T)
    n = tl.zeros((), tl.float32)  # exact: T < 2^24
    s_lr = tl.zeros((), tl.float32)
    s1 = tl.zeros((), tl.float32)
    s2 = tl.zeros((), tl.float32)
    s3 = tl.zeros((), tl.float32)
    m2 = tl.zeros((), tl.float32)  # k2, k3 >= 0: a row without tokens keeps 0 (verl's seq_max)
    m3 = tl.zeros((), tl.float32)
    for start in range(0, T, BLOCK_T):  # pass 1: the row's sums, tiles in increasing order
        offs = start + lanes
        inb = offs < T
        active, lr, lrc, k1, k2, k3 = _token_stats(old_ptr, roll_ptr, mask_ptr, row * T + offs, inb, lr_clamp,
                                                   HAS_CLAMP)
        n += tl.sum(active.to(tl.float32), 0)
        s_lr += tl.sum(lr, 0)
        s1 += tl.sum(k1, 0)
        s2 += tl.sum(k2, 0)
        s3 += tl.sum(k3, 0)
        m2 = tl.maximum(m2, tl.max(tl.where(active, k2, 0.0), 0))
        m3 = tl.maximum(m3, tl.max(tl.where(active, k3, 0.0), 0))
    n1 = tl.maximum(n, 1.0)
    seq_keep = tl.full((), 1, tl.int32)  # 1; each sequence criterion below may clear it
    if (RS >> 3) & 1:
        seq_keep = seq_keep * _inside(s1, tl.load(bounds_ptr + 6), tl.load(bounds_ptr + 7), True).to(tl.int32)
    if (RS >> 4) & 1:
        seq_keep = seq_keep * _inside(s2, 0.0, tl.load(bounds_ptr + 9), False).to(tl.int32)
    if (RS >> 5) & 1:
        seq_keep = seq_keep * _inside(s3, 0.0, tl.load(bounds_ptr + 11), False).to(tl.int32)
    if (RS >> 6) & 1:
        seq_keep = seq_keep * _inside(s1 / n1, tl.load(bounds_ptr + 12), tl.load(bounds_ptr + 13), True).to(tl.int32)
    if (RS >> 7) & 1:
        seq_keep = seq_keep * _inside(s2 / n1, 0.0, tl.load(bounds_ptr + 15), False).to(tl.int32)
    if (RS >> 8) & 1:
        seq_keep = seq_keep * _inside(s3 / n1, 0.0, tl.load(bounds_ptr + 17), False).to(tl.int32)
    if (RS >> 9) & 1:
        seq_keep = seq_keep * _inside(m2, 0.0, tl.load(bounds_ptr + 19), False).to(tl.int32)
    if (RS >> 10) & 1:
        seq_keep = seq_keep * _inside(m3, 0.0, tl.load(bounds_ptr + 21), False).to(tl.int32)
    if IS_LEVEL == 1:
        big_l = s_lr
    else:
        big_l = s_lr / n1
    if HAS_CLAMP:
        big_l = _clip(big_l, -lr_clamp, lr_clamp)
    kept = tl.zeros((), tl.float32)
    for start in range(0, T, BLOCK_T):  # pass 2: weights and the keep mask
        offs = start + lanes
        inb = offs < T
        p = row * T + offs
        active, lr, lrc, k1, k2, k3 = _token_stats(old_ptr, roll_ptr, mask_ptr, p, inb, lr_clamp, HAS_CLAMP)
        keep = active & ((tl.zeros((BLOCK_T,), tl.int32) + seq_keep) != 0)
        if (RS >> 0) & 1:
            keep = keep & _inside(k1, tl.load(bounds_ptr + 0), tl.load(bounds_ptr + 1), True)
        if (RS >> 1) & 1:
            keep = keep & _inside(k2, 0.0, tl.load(bounds_ptr + 3), False)
        if (RS >> 2) & 1:
            keep = keep & _inside(k3, 0.0, tl.load(bounds_ptr + 5), False)
        tl.store(keep_ptr + p, keep.to(tl.uint8), mask=inb)
        kept += tl.sum(keep.to(tl.float32), 0)
        if IS_LEVEL >= 0:
            if IS_LEVEL == 0:
                w = tl.exp(lrc)
            else:
                w = tl.zeros((BLOCK_T,), tl.float32) + tl.exp(big_l)
            if IS_MODE == 0:  # truncate
                if HAS_LOW:
                    w = tl.where(w < is_low, is_low, w)
                w = tl.where(w > is_high, is_high, w)
            else:  # mask: weight 0 outside [is_low, is_high]
                ok = w <= is_high
                if HAS_LOW:
                    ok = ok & (w >= is_low)
                w = tl.where(ok, w, 0.0)
            tl.store(weight_ptr + p, tl.where(active, w, 0.0), mask=inb)
    out = row_ptr + row * 4
    tl.store(out + 0, n)
    tl.store(out + 1, tl.where(n > 0.0, big_l, 0.0))
    tl.store(out + 2, seq_keep.to(tl.float32))
    tl.store(out + 3, kept)


def rs_bounds(rs: dict, device) -> tuple[torch.Tensor, int]:
    """(fp32 [len(RS_OPTIONS), 2] bounds (lo, hi), the enabled options' bitmask). k1 bounds are
    given as ratio bounds (lo, hi) and stored as their logs, as verl's rollout_rs_threshold."""
    b = torch.zeros(len(RS_OPTIONS), 2, dtype=torch.float64)
    bits = 0
    for name, spec in rs.items():
        k = RS_OPTIONS.index(name)
        bits |= 1 << k
        if name.endswith("k1"):
            b[k, 0], b[k, 1] = math.log(spec[0]), math.log(spec[1])
        else:
            b[k, 1] = spec
    return b.to(torch.float32).to(device), bits


def launch_rollout_correction(old_logp, rollout_logp, mask_u8, is_level, is_mode, is_low, is_high, rs: dict,
                              log_ratio_clamp):
    """(weights [B, T] fp32 or None, keep [B, T] bool, rows [B, 4] fp32: n, L, sequence kept, kept tokens)."""
    B, T = old_logp.shape
    dev = old_logp.device
    weights = torch.zeros((B, T), dtype=torch.float32, device=dev) if is_level is not None else None
    keep = torch.zeros((B, T), dtype=torch.uint8, device=dev)
    rows = torch.zeros((B, N_ROW_OUT), dtype=torch.float32, device=dev)
    if B and T:
        bounds, bits = rs_bounds(rs, dev)
        cfg = configs.lookup_fixed("rl_policy_loss_rows", arch_of(dev))
        _rollout_correction_kernel[(B,)](
            old_logp, rollout_logp, mask_u8, bounds, weights if weights is not None else rows, keep, rows, T,
            float(is_low) if is_low is not None else 0.0, float(is_high) if is_high is not None else 0.0,
            float(log_ratio_clamp) if log_ratio_clamp is not None else 0.0,
            IS_LEVEL=IS_LEVELS[is_level] if is_level is not None else -1, IS_MODE=IS_MODES[is_mode],
            HAS_LOW=is_low is not None, RS=bits, HAS_CLAMP=log_ratio_clamp is not None,
            BLOCK_T=cfg.block_v, num_warps=cfg.num_warps)
    return weights, keep.view(torch.bool), rows
