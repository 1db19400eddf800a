"""Advantage estimators: GAE as a parallel scan, group-normalized advantages. Kernels + launchers.

GAE, one program per sequence (row of [B, T]), reverse in time. Tiles of BLOCK_T tokens are taken
from the row's last active token (so right padding changes nothing) back to its start, each loaded in reversed order so that a forward
tl.associative_scan runs backwards in time; a carry links the tiles. Two scans per tile:
  1. the value of the nearest ACTIVE token to the right of t (masked tokens are transparent; the
     bootstrap value stands past the last active token);
  2. the affine recurrence A_t = delta_t + gamma*lam*A_{t+1} on active tokens, identity on masked
     ones, as the composition of the maps x -> a_t x + b_t (associative).
Reduction order: tiles from the row's end to its start; inside a tile the compiler's scan tree for
(BLOCK_T, num_warps); fixed for a config, independent of the batch.

Masked whitening (masked_whiten): (v - mean) / den over the active tokens of the whole batch, with
mean and the (unbiased) variance from fixed-order sums: one program per row folds BLOCK_T-token tiles
in increasing order (tl.sum's tree per tile), one program folds the rows' sums in BLOCK_B-row tiles
in increasing order (the mean; then, second pass, the squared deviations from it: no cancellation),
and an elementwise kernel writes the outputs. The order is stated in rlk_triton/ops/reduction.py.

Group statistics, one program per group: the members are stable-sorted by group id so that each
group is one contiguous segment; two passes over the segment in tiles of BLOCK_B (the sum, with
the min and max, then the squared deviations from the mean), in member order. No atomics. A group
whose scores are all equal takes that score as its mean exactly (min == max), so all its
advantages are exact zeros in every mode; mean_std gives 0 where std + eps == 0 (eps = 0).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of
from .launch import cached, cdiv

def _locked(kernel: str, device: torch.device):
    """(block, num_warps) from the locked table (rlk_triton/configs.py); never depends on B or T."""
    cfg = configs.lookup_fixed(kernel, arch_of(device))
    return cfg.block_v, cfg.num_warps


@triton.jit
def _nearest_active(v_acc, f_acc, v_new, f_new):
    # scan state: the value of the nearest active token seen so far (scanning backwards in time)
    return tl.where(f_new != 0, v_new, v_acc), f_acc | f_new


@triton.jit
def _affine_then(a_acc, b_acc, a_new, b_new):
    # A_new = b_new + a_new * A_acc: compose the map of the token to the left after the accumulated one
    return a_new * a_acc, b_new + a_new * b_acc


@cached
@triton.jit(do_not_specialize=["T", "gamma", "lam"])
def _gae_kernel(rew_ptr, val_ptr, mask_ptr, boot_ptr, adv_ptr, ret_ptr, T, stride_row,
                gamma, lam, BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * stride_row
    gamma = tl.cast(gamma, tl.float32)
    glam = gamma * tl.cast(lam, tl.float32)
    lanes = tl.arange(0, BLOCK_T)
    # Anchor the tiles at the row's last active token, not at T - 1, so that right padding (a
    # batch property) never moves a token to another lane of the scan tree.
    last_active = tl.full((), -1, tl.int32)
    for start in range(0, T, BLOCK_T):
        offs = start + lanes
        act = (offs < T) & (tl.load(mask_ptr + base + offs, mask=offs < T, other=0) != 0)
        last_active = tl.maximum(last_active, tl.max(tl.where(act, offs, -1), 0))
    end = last_active + 1  # tokens at or past `end` are inactive: 0, written here (no zero fill)
    for start in range(end - end % BLOCK_T, T, BLOCK_T):
        offs = start + lanes
        tail = (offs >= end) & (offs < T)
        tl.store(adv_ptr + base + offs, tl.zeros((BLOCK_T,), tl.float32), mask=tail)
        tl.store(ret_ptr + base + offs, tl.zeros((BLOCK_T,), tl.float32), mask=tail)
    # the value past the last active token: the bootstrap value, or 0 (a finished sequence) without one
    if boot_ptr is None:
        carry_v = tl.zeros((), tl.float32)
    else:
        carry_v = tl.load(boot_ptr + row)
    carry_a = tl.zeros((), tl.float32)  # A past the last active token
    n_tiles = tl.cdiv(end, BLOCK_T)
    for k in range(0, n_tiles):
        # reversed positions: lane 0 is the latest token of this tile
        t = end - 1 - (k * BLOCK_T + lanes)
        inside = t >= 0
        active = (tl.load(mask_ptr + base + t, mask=inside, other=0) != 0) & inside
        r = tl.load(rew_ptr + base + t, mask=active, other=0.0)
        v = tl.load(val_ptr + base + t, mask=active, other=0.0)
        # nearest active value strictly to the right of t: scan the (t+1) column
        t1 = t + 1
        act1 = (tl.load(mask_ptr + base + t1, mask=inside & (t1 < end), other=0) != 0) & inside & (t1 < end)
        v1 = tl.load(val_ptr + base + t1, mask=act1, other=0.0)
        sv, sf = tl.associative_scan((v1, act1.to(tl.int32)), 0, _nearest_active)
        v_next = tl.where(sf != 0, sv, carry_v)
        delta = r + gamma * v_next - v
        a = tl.where(active, glam, 1.0)
        b = tl.where(active, delta, 0.0)
        sa, sb = tl.associative_scan((a, b), 0, _affine_then)
        adv = sa * carry_a + sb
        tl.store(adv_ptr + base + t, tl.where(active, adv, 0.0), mask=inside)
        tl.store(ret_ptr + base + t, tl.where(active, adv + v, 0.0), mask=inside)
        # carries for the tile to the left: the state at this tile's earliest token (lane `last`);
        # masked tokens are identity maps, so the A state there is adv itself
        last = lanes == tl.minimum(BLOCK_T - 1, end - 1 - k * BLOCK_T)
        seen = active | (sf != 0)
        v_here = tl.where(active, v, sv)
        carry_has = tl.max(tl.where(last & seen, 1, 0), 0) > 0
        carry_v = tl.where(carry_has, tl.sum(tl.where(last & seen, v_here, 0.0), 0), carry_v)
        carry_a = tl.sum(tl.where(last, adv, 0.0), 0)


@cached
@triton.jit
def _group_stats_kernel(sorted_score_ptr, start_ptr, count_ptr, mean_ptr, m2_ptr, BLOCK_B: tl.constexpr):
    # One group's members lie contiguously (stable-sorted by group id), so the summation tree
    # depends only on the members and their order, never on where the group sits in the batch.
    g = tl.program_id(0)
    start = tl.load(start_ptr + g)
    n = tl.load(count_ptr + g)
    lanes = tl.arange(0, BLOCK_B)
    total = tl.zeros((), tl.float32)
    lo = tl.full((), float("inf"), tl.float32)
    hi = tl.full((), float("-inf"), tl.float32)
    for k in range(0, n, BLOCK_B):
        i = k + lanes
        x = tl.load(sorted_score_ptr + start + i, mask=i < n, other=0.0)
        total += tl.sum(x, 0)
        lo = tl.minimum(lo, tl.min(tl.where(i < n, x, float("inf")), 0))
        hi = tl.maximum(hi, tl.max(tl.where(i < n, x, float("-inf")), 0))
    mean = total / tl.maximum(n, 1).to(tl.float32)
    # The fp32 mean of equal scores can miss them by an ulp (x + x + x rounds): a group whose scores
    # are all equal gets that score as its mean, exactly, so every deviation and m2 are exact zeros.
    # (mean == mean: a NaN member keeps the whole group NaN on every backend.)
    mean = tl.where((lo == hi) & (mean == mean), lo, mean)
    m2 = tl.zeros((), tl.float32)
    for k in range(0, n, BLOCK_B):  # second pass: squared deviations from the mean (no cancellation)
        i = k + lanes
        dev = tl.load(sorted_score_ptr + start + i, mask=i < n, other=0.0) - mean
        m2 += tl.sum(tl.where(i < n, dev * dev, 0.0), 0)
    tl.store(mean_ptr + g, mean)
    tl.store(m2_ptr + g, m2)


@cached
@triton.jit(do_not_specialize=["eps"])
def _group_advantage_kernel(score_ptr, gid_ptr, valid_ptr, mean_ptr, m2_ptr, count_ptr, out_ptr, B, eps,
                            MODE: tl.constexpr, SINGLETON_RAW: tl.constexpr, BLOCK_B: tl.constexpr):
    i = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    inside = i < B
    valid = inside & (tl.load(valid_ptr + i, mask=inside, other=0) != 0)
    g = tl.load(gid_ptr + i, mask=valid, other=0)
    s = tl.load(score_ptr + i, mask=valid, other=0.0)
    mean = tl.load(mean_ptr + g, mask=valid, other=0.0)
    n = tl.load(count_ptr + g, mask=valid, other=1).to(tl.float32)
    if MODE == 0:  # mean
        adv = s - mean
    elif MODE == 1:  # mean / std (unbiased, as torch.std); a group of one has no spread: 0
        std = tl.sqrt(tl.load(m2_ptr + g, mask=valid, other=0.0) / tl.maximum(n - 1.0, 1.0))
        den = std + tl.cast(eps, tl.float32)
        # std + eps == 0 (eps = 0 and no spread): 0, not 0 / 0; a NaN den still propagates
        adv = tl.where((n > 1.0) & (den != 0.0), (s - mean) / tl.where(den != 0.0, den, 1.0), 0.0)
    else:  # leave-one-out: s minus the mean of the others; a group of one has no others: 0
        adv = tl.where(n > 1.0, (s - mean) * (n / tl.maximum(n - 1.0, 1.0)), 0.0)
    if SINGLETON_RAW:  # a group of one: baseline 0 and std 1 (verl's loop estimators): the raw score
        if MODE == 1:
            raw = s / (1.0 + tl.cast(eps, tl.float32))
        else:
            raw = s
        adv = tl.where(n == 1.0, raw, adv)
    tl.store(out_ptr + i, tl.where(valid, adv, 0.0), mask=inside)


# ---- masked whitening ----

@cached
@triton.jit(do_not_specialize=["T"])
def _whiten_rows_kernel(val_ptr, mask_ptr, stats_ptr, sum_ptr, count_ptr, T, CENTERED: tl.constexpr,
                        BLOCK_T: tl.constexpr):
    # a row's sum of values (pass 1) or of squared deviations from the batch mean (pass 2), tiles in order
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_T)
    acc = tl.zeros((), tl.float32)
    n = tl.zeros((), tl.int32)
    mean = tl.zeros((), tl.float32)
    if CENTERED:
        mean = tl.load(stats_ptr)
    for start in range(0, T, BLOCK_T):
        offs = start + lanes
        inb = offs < T
        act = inb & (tl.load(mask_ptr + row * T + offs, mask=inb, other=0) != 0)
        v = tl.load(val_ptr + row * T + offs, mask=act, other=0.0)
        if CENTERED:
            d = tl.where(act, v - mean, 0.0)
            acc += tl.sum(d * d, 0)
        else:
            acc += tl.sum(v, 0)
            n += tl.sum(act.to(tl.int32), 0)
    tl.store(sum_ptr + row, acc)
    if not CENTERED:
        tl.store(count_ptr + row, n)


@cached
@triton.jit(do_not_specialize=["B", "eps"])
def _whiten_fold_kernel(sum_ptr, count_ptr, stats_ptr, B, eps, CENTERED: tl.constexpr, UNBIASED: tl.constexpr,
                        EPS_ON_VAR: tl.constexpr, BLOCK_B: tl.constexpr):
    # stats: [mean, var, den]; pass 1 writes the mean, pass 2 the variance and the divisor
    lanes = tl.arange(0, BLOCK_B)
    total = tl.zeros((), tl.float32)
    n = tl.zeros((), tl.int32)  # B * T < 2^31
    for start in range(0, B, BLOCK_B):  # rows in tiles of BLOCK_B, in increasing order
        i = start + lanes
        total += tl.sum(tl.load(sum_ptr + i, mask=i < B, other=0.0), 0)
        n += tl.sum(tl.load(count_ptr + i, mask=i < B, other=0), 0)
    nf = n.to(tl.float32)
    if CENTERED:
        if UNBIASED:
            dof = nf - 1.0
        else:
            dof = nf
        var = tl.where(dof > 0.0, total / tl.maximum(dof, 1.0), 0.0)
        e = tl.cast(eps, tl.float32)
        if EPS_ON_VAR:
            den = tl.sqrt_rn(var + e)
        else:
            den = tl.sqrt_rn(var) + e
        tl.store(stats_ptr + 1, var)
        tl.store(stats_ptr + 2, den)
    else:
        tl.store(stats_ptr, tl.where(n > 0, total / tl.maximum(nf, 1.0), 0.0))


@cached
@triton.jit(do_not_specialize=["T"])
def _whiten_apply_kernel(val_ptr, mask_ptr, stats_ptr, out_ptr, T, SHIFT_MEAN: tl.constexpr, BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    inb = offs < T
    p = row * T + offs
    act = inb & (tl.load(mask_ptr + p, mask=inb, other=0) != 0)
    v = tl.load(val_ptr + p, mask=act, other=0.0)
    mean = tl.load(stats_ptr)
    den = tl.load(stats_ptr + 2)
    out = tl.where(den != 0.0, (v - mean) / tl.where(den != 0.0, den, 1.0), 0.0)  # no spread, eps 0: 0
    if not SHIFT_MEAN:
        out = out + mean
    tl.store(out_ptr + p, tl.where(act, out, 0.0), mask=inb)


def launch_masked_whiten(values, mask, stats, shift_mean: bool, unbiased: bool, eps: float, eps_on_var: bool):
    """(whitened [B, T], stats [3] = mean, var, den) fp32. mask: [B, T], nonzero = active, any dtype the
    kernels load (advantages.KERNEL_MASK_DTYPES). stats: None (computed from the batch) or a
    [3] fp32 tensor (mean, var, den) given by the caller."""
    B, T = values.shape
    dev = values.device
    out = torch.zeros_like(values)
    if stats is None:
        stats = torch.zeros(3, dtype=torch.float32, device=dev)
        if B and T:
            block, warps = _locked("rl_policy_loss_rows", dev)
            fold, fold_warps = _locked("rl_policy_loss_batch", dev)
            sums = torch.empty(B, dtype=torch.float32, device=dev)
            counts = torch.empty(B, dtype=torch.int32, device=dev)
            for centered in (False, True):
                _whiten_rows_kernel[(B,)](values, mask, stats, sums, counts, T, CENTERED=centered,
                                          BLOCK_T=block, num_warps=warps)
                _whiten_fold_kernel[(1,)](sums, counts, stats, B, float(eps), CENTERED=centered, UNBIASED=unbiased,
                                          EPS_ON_VAR=eps_on_var, BLOCK_B=fold, num_warps=fold_warps)
    if B and T:
        block, warps = _locked("rl_policy_loss_bwd", dev)
        _whiten_apply_kernel[(B, cdiv(T, block))](values, mask, stats, out, T, SHIFT_MEAN=shift_mean,
                                                           BLOCK_T=block, num_warps=warps)
    return out, stats

def launch_gae(rewards, values, mask, bootstrap, gamma: float, lam: float):
    """mask: [B, T], nonzero = active, any dtype the kernel loads (advantages.KERNEL_MASK_DTYPES);
    bootstrap: [B] fp32, or None for 0 (finished sequences). The kernel writes every element."""
    B, T = rewards.shape
    # the kernel indexes [B, T] rows with stride T: views are read as their contiguous copies
    rewards, values, mask = (x.contiguous() for x in (rewards, values, mask))
    bootstrap = bootstrap.contiguous() if bootstrap is not None else None
    adv = torch.empty_like(rewards)
    ret = torch.empty_like(rewards)
    if B == 0 or T == 0:
        return adv, ret
    block, warps = _locked("gae", rewards.device)
    _gae_kernel[(B,)](rewards, values, mask, bootstrap, adv, ret, T, T, float(gamma), float(lam),
                      BLOCK_T=block, num_warps=warps)
    return adv, ret


MODES = {"mean": 0, "mean_std": 1, "rloo": 2}


def launch_group_stats(scores, group_ids, valid, num_groups):
    """(mean, sum of squared deviations, count) per group over its valid members: fp32, fp32, int32.
    group_ids: int32 / int64 [B]; valid: [B], nonzero = valid (bool, uint8, ...: read as it is)."""
    dev = scores.device
    B = scores.numel()
    key = torch.where(valid if valid.dtype == torch.bool else valid != 0, group_ids, num_groups)  # invalid rows last
    sorted_key, order = torch.sort(key, stable=True)
    # Group g's members are sorted_key's run of g: [bounds[g], bounds[g + 1]). A search of the sorted
    # keys instead of a histogram (bincount syncs on CUDA to size its output), in two launches.
    bounds = torch.searchsorted(sorted_key, torch.arange(num_groups + 1, dtype=key.dtype, device=dev), out_int32=True)
    start, count = bounds[:num_groups], bounds[1:] - bounds[:num_groups]
    mean = torch.empty(num_groups, dtype=torch.float32, device=dev)
    m2 = torch.empty(num_groups, dtype=torch.float32, device=dev)
    if num_groups and B:
        block, warps = _locked("group_stats", dev)
        _group_stats_kernel[(num_groups,)](scores[order].contiguous(), start, count, mean, m2,
                                           BLOCK_B=block, num_warps=warps)
    elif num_groups:
        mean.zero_()
        m2.zero_()
    return mean, m2, count


def launch_group_advantages(scores, group_ids, valid, num_groups, mode: str, eps: float, singleton: str = "zero"):
    """group_ids: int32 / int64 [B]; valid: [B], nonzero = valid, any dtype the kernels load
    (advantages.KERNEL_MASK_DTYPES). Returns (advantages, mean, m2, count)."""
    # the kernels index these flat: any view (a strided group_ids) is read as its contiguous copy
    scores, group_ids, valid = scores.contiguous(), group_ids.contiguous(), valid.contiguous()
    mean, m2, count = launch_group_stats(scores, group_ids, valid, num_groups)
    out = torch.empty_like(scores)
    B = scores.numel()
    if B:
        block, warps = _locked("group_stats", scores.device)
        _group_advantage_kernel[(cdiv(B, block),)](
            scores, group_ids, valid, mean, m2, count, out, B, float(eps),
            MODE=MODES[mode], SINGLETON_RAW=singleton == "raw", BLOCK_B=block, num_warps=warps)
    return out, mean, m2, count
