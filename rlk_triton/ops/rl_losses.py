"""RL losses on per-token log-probabilities: kernels, launchers, custom ops.

Inputs are fp32 [B, T] (row = sequence); all arithmetic is fp32, nothing is downcast.

ratio_kl:    elementwise, one program per (row, tile of BLOCK_T tokens), forward and backward.
policy_loss: three kernels, no atomics:
  1. _policy_loss_rows_kernel: one program per row streams the row's tiles in increasing order
     (0, 1, ..., cdiv(T, BLOCK_T) - 1). It writes the per-token loss and folds each tile, reduced by
     tl.sum's fixed tree over BLOCK_T lanes, into the row's partial sums (ROW_STATS columns).
     With configs "rl_policy_loss_split" on, the same sums come from B x tiles programs instead:
     _policy_loss_tiles_kernel writes each (row, tile)'s tl.sum results and _policy_loss_fold_kernel
     adds a row's tiles in the same increasing order, so row_stats are bitwise the rows kernel's
     (tested); it only adds parallelism.
  2. _policy_loss_batch_kernel: one program folds the rows' partial sums in the same way: tiles of
     BLOCK_B rows in increasing order, each reduced by tl.sum's tree. It writes the scalar loss, the
     diagnostics, and each row's weight d loss / d l_t (the same for every token of a row).
  3. _policy_loss_bwd_kernel: elementwise per (row, tile): d logp = (g_loss * row_weight + g_token) * dl/dlogp.
The per-token math is one @triton.jit function (_policy_token) that the forward and backward both call,
so they agree on every branch. Block sizes never depend on B or T (rlk_triton/configs.py), and B and T
are not specialized on, so one binary serves every shape: a row padded with masked tokens, or a batch
followed by empty rows, sums the same numbers in the same tree (the extra lanes and tiles add exact
zeros), so those give bitwise the same results too.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from ..configs import LaunchConfig
from .._runtime import arch_of
from .dispatch import autograd_op, direct
from .launch import SLOT, Template, cached, cdiv, planned

# low_var_kl: k3 with u = ref - logp clamped to [-20, 20] and the estimate to [-10, 10] (verl's and
# slime's "low_var_kl"), no gradient beyond either clamp.
KL_ESTIMATORS = {"k1": 1, "k2": 2, "k3": 3, "low_var_kl": 4}
LOW_VAR_KL_U_CLAMP, LOW_VAR_KL_CLAMP = 20.0, 10.0
AGGREGATIONS = {"token-mean": 0, "seq-mean-token-sum": 1, "seq-mean-token-mean": 2, "seq-mean-token-sum-norm": 3}
# "weights": per-token importance weights given by the caller (is_weights), read like rollout_logp.
TIS_MODES = {"none": 0, "truncate": 1, "mask": 2, "weights": 3}
TIS_SCOPES = {"loss": 0, "pg": 1}  # what a TIS weight multiplies: the whole token loss, or the policy term only
DIAGNOSTICS = ("clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "ppo_kl")
# Columns of the per-row partial sums written by the rows kernel (counts are exact in fp32: T < 2^24).
ROW_STATS = ("loss_sum", "n_active", "n_clipped", "approx_kl_sum", "ratio_sum", "ratio_min", "ratio_max",
             "token_mean", "ppo_kl_sum")
N_ROW_STATS = 9


def config(kernel: str, device: torch.device) -> LaunchConfig:
    """The locked config (rlk_triton/configs.py): never a function of B or T."""
    return configs.lookup_fixed(kernel, arch_of(device))


# ---- per-token math, shared by forward and backward ----

@triton.jit
def _kl_and_grad(logp, ref, KL_EST: tl.constexpr):
    """(kl of the current policy against ref, d kl / d logp), fp32."""
    if KL_EST == 1:
        kl = logp - ref
        dkl = tl.full(kl.shape, 1.0, tl.float32)
    elif KL_EST == 2:
        d = logp - ref
        kl = 0.5 * d * d
        dkl = d
    elif KL_EST == 3:
        u = ref - logp
        e = tl.exp(u)
        kl = (e - 1.0) - u  # e - 1 is exact for |u| < ln 2 (Sterbenz): no cancellation beyond it
        dkl = 1.0 - e
    else:  # low_var_kl: u clamped to [-20, 20], the estimate to [-10, 10]; torch.clamp's gradient convention
        u = ref - logp
        inside = (u >= -20.0) & (u <= 20.0)
        uc = _clip(u, -20.0, 20.0)
        e = tl.exp(uc)
        k3 = (e - 1.0) - uc
        dkl = tl.where(inside & (k3 >= -10.0) & (k3 <= 10.0), 1.0 - e, 0.0)
        kl = _clip(k3, -10.0, 10.0)
    return kl, dkl


@triton.jit
def _clip(x, lo, hi):
    """clip(x, lo, hi) that propagates NaN on every backend (tl.minimum on a GPU drops it)."""
    return tl.where(x < lo, lo, tl.where(x > hi, hi, x))


@triton.jit
def _ratio_kl_token(logp, old, ref, clamp, HAS_CLAMP: tl.constexpr, HAS_REF: tl.constexpr,
                    KL_EST: tl.constexpr):
    """(log_ratio, ratio, kl, d log_ratio / d logp, d kl / d logp) of one tile."""
    log_ratio = logp - old
    if HAS_CLAMP:
        # torch.clamp's convention: the gradient passes at the bounds, is 0 beyond them.
        dlr = ((log_ratio >= -clamp) & (log_ratio <= clamp)).to(tl.float32)
        log_ratio = _clip(log_ratio, -clamp, clamp)
    else:
        dlr = tl.full(log_ratio.shape, 1.0, tl.float32)
    ratio = tl.exp(log_ratio)
    if HAS_REF:
        kl, dkl = _kl_and_grad(logp, ref, KL_EST)
    else:
        kl = log_ratio
        dkl = dlr
    return log_ratio, ratio, kl, dlr, dkl


@triton.jit
def _policy_token(logp, old, adv, ref, ent, roll, active,
                  clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
                  CISPO: tl.constexpr, DUAL_CLIP: tl.constexpr, HAS_KL: tl.constexpr, KL_EST: tl.constexpr,
                  HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr, TIS_PG: tl.constexpr,
                  HAS_LR_CLAMP: tl.constexpr):
    """Per-token loss l and its derivatives of one tile; `active` comes back with TIS masking applied.

    Returns (l, dl/dlogp, dl/dentropy, active, clipped, ratio, log_ratio). Inactive lanes hold 0 in l
    and the derivatives (tl.where, so that NaN / inf in padding never leaks). With HAS_LR_CLAMP the
    log-ratio is clamped to [-lr_clamp, lr_clamp] before exp (no gradient through r beyond).
    """
    log_ratio = logp - old
    if HAS_LR_CLAMP:
        dlr = ((log_ratio >= -lr_clamp) & (log_ratio <= lr_clamp)).to(tl.float32)
        log_ratio = _clip(log_ratio, -lr_clamp, lr_clamp)
    ratio = tl.exp(log_ratio)
    clipped_ratio = _clip(ratio, clip_lo, clip_hi)
    if CISPO:
        # -sg(clip(r)) * A * logp: the clipped ratio is a constant weight on the log-likelihood.
        weight = -(clipped_ratio * adv)
        pg = weight * logp
        dpg = weight
        clipped = clipped_ratio != ratio
    else:
        unclipped = -adv * ratio  # d/dlogp of -A r is -A r itself
        clipped_term = -adv * clipped_ratio
        clipped = clipped_term > unclipped
        pg = tl.where(clipped, clipped_term, unclipped)
        if HAS_LR_CLAMP:
            unclipped = unclipped * dlr
        dpg = tl.where(clipped, 0.0, unclipped)
        if DUAL_CLIP:
            dual_term = -adv * dual_c
            dual = (adv < 0.0) & (dual_term < pg)
            pg = tl.where(dual, dual_term, pg)
            dpg = tl.where(dual, 0.0, dpg)
    tis = tl.full(pg.shape, 1.0, tl.float32)
    if TIS_MODE == 1:  # truncate: a constant weight min(w, cap)
        w = tl.exp(old - roll)
        tis = tl.where(w > tis_cap, tis_cap, w)
    elif TIS_MODE == 2:  # mask: tokens whose weight exceeds the cap are dropped, as if masked
        w = tl.exp(old - roll)
        active = active & (w <= tis_cap)
    elif TIS_MODE == 3:  # the caller's per-token weights (roll holds them)
        tis = roll
    if TIS_MODE == 1 or TIS_MODE == 3:
        if TIS_PG:  # the weight on the policy term only (the KL and entropy terms unweighted)
            pg = pg * tis
            dpg = dpg * tis
    loss = pg
    dloss = dpg
    if HAS_KL:
        kl, dkl = _kl_and_grad(logp, ref, KL_EST)
        loss = loss + kl_coef * kl
        dloss = dloss + kl_coef * dkl
    if HAS_ENTROPY:
        loss = loss - ent_coef * ent
    dent = tl.full(loss.shape, 0.0, tl.float32) - ent_coef
    if TIS_MODE == 1 or TIS_MODE == 3:
        if not TIS_PG:  # the weight on the whole token loss
            loss = loss * tis
            dloss = dloss * tis
            dent = dent * tis
    loss = tl.where(active, loss, 0.0)
    dloss = tl.where(active, dloss, 0.0)
    dent = tl.where(active, dent, 0.0)
    return loss, dloss, dent, active, clipped & active, ratio, log_ratio


# ---- ratio_kl kernels ----

@triton.jit
def _ratio_kl_tile(logp_ptr, old_ptr, ref_ptr, mask_ptr, T, HAS_MASK: tl.constexpr, HAS_REF: tl.constexpr,
                   BLOCK_T: tl.constexpr):
    """The (row, tile) of a program: offsets, bounds, active lanes and the three logp tiles."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    inb = offs < T
    p = row * T + offs
    active = inb
    if HAS_MASK:
        active = active & (tl.load(mask_ptr + p, mask=inb, other=0) != 0)
    logp = tl.load(logp_ptr + p, mask=inb, other=0.0)
    old = tl.load(old_ptr + p, mask=inb, other=0.0)
    ref = logp
    if HAS_REF:
        ref = tl.load(ref_ptr + p, mask=inb, other=0.0)
    return p, inb, active, logp, old, ref


@cached
@triton.jit(do_not_specialize=["T", "clamp"])
def _ratio_kl_fwd_kernel(logp_ptr, old_ptr, ref_ptr, mask_ptr, log_ratio_ptr, ratio_ptr, kl_ptr, T, clamp,
                         HAS_MASK: tl.constexpr, HAS_CLAMP: tl.constexpr, HAS_REF: tl.constexpr,
                         KL_EST: tl.constexpr, BLOCK_T: tl.constexpr):
    p, inb, active, logp, old, ref = _ratio_kl_tile(logp_ptr, old_ptr, ref_ptr, mask_ptr, T, HAS_MASK, HAS_REF,
                                                    BLOCK_T)
    log_ratio, ratio, kl, _dlr, _dkl = _ratio_kl_token(logp, old, ref, clamp, HAS_CLAMP, HAS_REF, KL_EST)
    tl.store(log_ratio_ptr + p, tl.where(active, log_ratio, 0.0), mask=inb)
    tl.store(ratio_ptr + p, tl.where(active, ratio, 0.0), mask=inb)
    if HAS_REF:
        tl.store(kl_ptr + p, tl.where(active, kl, 0.0), mask=inb)


@triton.jit
def _grad_tile(g_ptr, p, inb, BLOCK_T: tl.constexpr):
    """An upstream gradient's tile, zeros where the output got none (g_ptr None)."""
    g = tl.zeros((BLOCK_T,), tl.float32)
    if g_ptr is not None:
        g = tl.load(g_ptr + p, mask=inb, other=0.0)
    return g


@cached
@triton.jit(do_not_specialize=["T", "clamp"])
def _ratio_kl_bwd_kernel(g_lr_ptr, g_ratio_ptr, g_kl_ptr, logp_ptr, old_ptr, ref_ptr, mask_ptr, grad_ptr,
                         T, clamp,
                         HAS_MASK: tl.constexpr, HAS_CLAMP: tl.constexpr, HAS_REF: tl.constexpr,
                         KL_EST: tl.constexpr, BLOCK_T: tl.constexpr):
    p, inb, active, logp, old, ref = _ratio_kl_tile(logp_ptr, old_ptr, ref_ptr, mask_ptr, T, HAS_MASK, HAS_REF,
                                                    BLOCK_T)
    _lr, ratio, _kl, dlr, dkl = _ratio_kl_token(logp, old, ref, clamp, HAS_CLAMP, HAS_REF, KL_EST)
    # an output without a gradient (None) is a zero tile: the same arithmetic as a zero tensor's
    g_lr = _grad_tile(g_lr_ptr, p, inb, BLOCK_T)
    g_ratio = _grad_tile(g_ratio_ptr, p, inb, BLOCK_T)
    d = (g_lr + g_ratio * ratio) * dlr
    if HAS_REF:
        d = d + _grad_tile(g_kl_ptr, p, inb, BLOCK_T) * dkl
    tl.store(grad_ptr + p, tl.where(active, d, 0.0), mask=inb)


# ---- policy_loss kernels ----

@triton.jit
def _policy_tile(logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, row, p, inb,
                 ADV_PER_ROW: tl.constexpr, HAS_KL: tl.constexpr, HAS_ENTROPY: tl.constexpr,
                 TIS_MODE: tl.constexpr, BLOCK_T: tl.constexpr):
    """A tile of every per-token input of the policy loss (absent ones stand in as unused copies)."""
    active = inb & (tl.load(mask_ptr + p, mask=inb, other=0) != 0)
    logp = tl.load(logp_ptr + p, mask=inb, other=0.0)
    old = tl.load(old_ptr + p, mask=inb, other=0.0)
    if ADV_PER_ROW:
        adv = tl.zeros((BLOCK_T,), tl.float32) + tl.load(adv_ptr + row)  # a tile, like the others
    else:
        adv = tl.load(adv_ptr + p, mask=inb, other=0.0)
    ref = logp
    if HAS_KL:
        ref = tl.load(ref_ptr + p, mask=inb, other=0.0)
    ent = logp
    if HAS_ENTROPY:
        ent = tl.load(ent_ptr + p, mask=inb, other=0.0)
    roll = old
    if TIS_MODE != 0:
        roll = tl.load(roll_ptr + p, mask=inb, other=0.0)
    return active, logp, old, adv, ref, ent, roll


@triton.jit
def _policy_tile_sums(logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, per_token_ptr, row, tile, T,
                      clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
                      ADV_PER_ROW: tl.constexpr, CISPO: tl.constexpr, DUAL_CLIP: tl.constexpr, HAS_KL: tl.constexpr,
                      KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr,
                      TIS_PG: tl.constexpr, HAS_LR_CLAMP: tl.constexpr, BLOCK_T: tl.constexpr):
    """One tile of a row: stores its per-token loss and returns the tile's reductions (each one
    tl.sum / min / max tree over BLOCK_T lanes): loss sum, active count, clipped count, approx_kl
    (k3 of old vs current) sum, ratio sum, ratio min, ratio max. Both row-sum paths call this."""
    offs = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    inb = offs < T
    p = row * T + offs
    active, logp, old, adv, ref, ent, roll = _policy_tile(
        logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, row, p, inb,
        ADV_PER_ROW, HAS_KL, HAS_ENTROPY, TIS_MODE, BLOCK_T)
    loss, _dl, _de, active, clipped, ratio, log_ratio = _policy_token(
        logp, old, adv, ref, ent, roll, active, clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
        CISPO, DUAL_CLIP, HAS_KL, KL_EST, HAS_ENTROPY, TIS_MODE, TIS_PG, HAS_LR_CLAMP)
    tl.store(per_token_ptr + p, loss, mask=inb)
    u = -log_ratio  # old - logp, bitwise (negation is exact), clamped when the log-ratio is
    k3 = (tl.exp(u) - 1.0) - u
    return (tl.sum(loss, 0), tl.sum(active.to(tl.int32), 0), tl.sum(clipped.to(tl.int32), 0),
            tl.sum(tl.where(active, k3, 0.0), 0), tl.sum(tl.where(active, ratio, 0.0), 0),
            tl.min(tl.where(active, ratio, float("inf")), 0), tl.max(tl.where(active, ratio, float("-inf")), 0),
            tl.sum(tl.where(active, u, 0.0), 0))


@triton.jit
def _store_row_stats(out, loss_sum, n_active, n_clipped, kl_sum, ratio_sum, ratio_min, ratio_max, k1_sum, mask):
    """A row's ROW_STATS columns (counts as exact fp32); mask None for one scalar row."""
    n = n_active.to(tl.float32)
    tl.store(out + 0, loss_sum, mask=mask)
    tl.store(out + 1, n, mask=mask)
    tl.store(out + 2, n_clipped.to(tl.float32), mask=mask)
    tl.store(out + 3, kl_sum, mask=mask)
    tl.store(out + 4, ratio_sum, mask=mask)
    tl.store(out + 5, ratio_min, mask=mask)
    tl.store(out + 6, ratio_max, mask=mask)
    tl.store(out + 7, tl.where(n_active > 0, loss_sum / tl.maximum(n, 1.0), 0.0), mask=mask)
    tl.store(out + 8, k1_sum, mask=mask)


@cached
@triton.jit(do_not_specialize=["T", "clip_lo", "clip_hi", "dual_c", "kl_coef", "ent_coef", "tis_cap", "lr_clamp"])
def _policy_loss_rows_kernel(
    logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, per_token_ptr, row_stats_ptr,
    T, clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
    ADV_PER_ROW: tl.constexpr, CISPO: tl.constexpr, DUAL_CLIP: tl.constexpr, HAS_KL: tl.constexpr,
    KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr, TIS_PG: tl.constexpr,
    HAS_LR_CLAMP: tl.constexpr, BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    loss_sum = tl.zeros((), tl.float32)
    kl_sum = tl.zeros((), tl.float32)
    ratio_sum = tl.zeros((), tl.float32)
    ratio_min = tl.full((), float("inf"), tl.float32)
    ratio_max = tl.full((), float("-inf"), tl.float32)
    k1_sum = tl.zeros((), tl.float32)
    n_active = tl.zeros((), tl.int32)
    n_clipped = tl.zeros((), tl.int32)
    for tile in range(0, tl.cdiv(T, BLOCK_T)):  # the fixed tile order of the row sums
        t_loss, t_act, t_clip, t_kl, t_ratio, t_min, t_max, t_k1 = _policy_tile_sums(
            logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, per_token_ptr, row, tile, T,
            clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
            ADV_PER_ROW, CISPO, DUAL_CLIP, HAS_KL, KL_EST, HAS_ENTROPY, TIS_MODE, TIS_PG, HAS_LR_CLAMP, BLOCK_T)
        loss_sum += t_loss
        k1_sum += t_k1
        n_active += t_act
        n_clipped += t_clip
        kl_sum += t_kl
        ratio_sum += t_ratio
        ratio_min = tl.minimum(ratio_min, t_min)
        ratio_max = tl.maximum(ratio_max, t_max)
    _store_row_stats(row_stats_ptr + row * 9, loss_sum, n_active, n_clipped, kl_sum, ratio_sum, ratio_min,
                     ratio_max, k1_sum, None)


@cached
@triton.jit(do_not_specialize=["T", "clip_lo", "clip_hi", "dual_c", "kl_coef", "ent_coef", "tis_cap", "lr_clamp"])
def _policy_loss_tiles_kernel(
    logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, per_token_ptr, tile_stats_ptr,
    T, clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
    ADV_PER_ROW: tl.constexpr, CISPO: tl.constexpr, DUAL_CLIP: tl.constexpr, HAS_KL: tl.constexpr,
    KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr, TIS_PG: tl.constexpr,
    HAS_LR_CLAMP: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # The rows kernel's loop body as one program per (row, tile), its reductions written per tile
    # for _policy_loss_fold_kernel (counts < 2^24: exact in fp32).
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    t_loss, t_act, t_clip, t_kl, t_ratio, t_min, t_max, t_k1 = _policy_tile_sums(
        logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, per_token_ptr, row, tile, T,
        clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
        ADV_PER_ROW, CISPO, DUAL_CLIP, HAS_KL, KL_EST, HAS_ENTROPY, TIS_MODE, TIS_PG, HAS_LR_CLAMP, BLOCK_T)
    out = tile_stats_ptr + (row * tl.num_programs(1) + tile) * 9
    tl.store(out + 0, t_loss)
    tl.store(out + 1, t_act.to(tl.float32))
    tl.store(out + 2, t_clip.to(tl.float32))
    tl.store(out + 3, t_kl)
    tl.store(out + 4, t_ratio)
    tl.store(out + 5, t_min)
    tl.store(out + 6, t_max)
    tl.store(out + 8, t_k1)


@cached
@triton.jit(do_not_specialize=["B", "n_tiles"])
def _policy_loss_fold_kernel(tile_stats_ptr, row_stats_ptr, B, n_tiles, BLOCK_B: tl.constexpr):
    # Each row's tile sums folded in tile order 0, 1, ...: the rows kernel's additions, in its order,
    # so row_stats are its bits.
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = rows < B
    loss_sum = tl.zeros((BLOCK_B,), tl.float32)
    kl_sum = tl.zeros((BLOCK_B,), tl.float32)
    ratio_sum = tl.zeros((BLOCK_B,), tl.float32)
    ratio_min = tl.full((BLOCK_B,), float("inf"), tl.float32)
    ratio_max = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    n_active = tl.zeros((BLOCK_B,), tl.int32)
    n_clipped = tl.zeros((BLOCK_B,), tl.int32)
    k1_sum = tl.zeros((BLOCK_B,), tl.float32)
    base = tile_stats_ptr + rows.to(tl.int64) * n_tiles * 9
    for tile in range(0, n_tiles):
        st = base + tile * 9
        loss_sum += tl.load(st + 0, mask=ok, other=0.0)
        n_active += tl.load(st + 1, mask=ok, other=0.0).to(tl.int32)
        n_clipped += tl.load(st + 2, mask=ok, other=0.0).to(tl.int32)
        kl_sum += tl.load(st + 3, mask=ok, other=0.0)
        ratio_sum += tl.load(st + 4, mask=ok, other=0.0)
        ratio_min = tl.minimum(ratio_min, tl.load(st + 5, mask=ok, other=float("inf")))
        ratio_max = tl.maximum(ratio_max, tl.load(st + 6, mask=ok, other=float("-inf")))
        k1_sum += tl.load(st + 8, mask=ok, other=0.0)
    _store_row_stats(row_stats_ptr + rows.to(tl.int64) * 9, loss_sum, n_active, n_clipped, kl_sum, ratio_sum,
                     ratio_min, ratio_max, k1_sum, ok)


@cached
@triton.jit(do_not_specialize=["B", "normalizer"])
def _policy_loss_batch_kernel(
    row_stats_ptr, B, normalizer_ptr, normalizer, loss_ptr, diag_ptr, row_weight_ptr,
    AGG: tl.constexpr, HAS_NORMALIZER: tl.constexpr, NORMALIZER_FROM_PTR: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    lanes = tl.arange(0, BLOCK_B)
    loss_sum = tl.zeros((), tl.float32)
    token_mean_sum = tl.zeros((), tl.float32)
    kl_sum = tl.zeros((), tl.float32)
    ratio_sum = tl.zeros((), tl.float32)
    k1_sum = tl.zeros((), tl.float32)
    ratio_min = tl.full((), float("inf"), tl.float32)
    ratio_max = tl.full((), float("-inf"), tl.float32)
    n_tokens = tl.zeros((), tl.int32)
    n_seqs = tl.zeros((), tl.int32)
    n_clipped = tl.zeros((), tl.int32)
    for tile in range(0, tl.cdiv(B, BLOCK_B)):  # the fixed tile order of the batch sums
        rows = tile * BLOCK_B + lanes
        inb = rows < B
        st = row_stats_ptr + rows.to(tl.int64) * 9
        n = tl.load(st + 1, mask=inb, other=0.0)
        has = n > 0.0
        loss_sum += tl.sum(tl.load(st + 0, mask=inb, other=0.0), 0)
        n_tokens += tl.sum(n.to(tl.int32), 0)
        n_seqs += tl.sum(has.to(tl.int32), 0)
        n_clipped += tl.sum(tl.load(st + 2, mask=inb, other=0.0).to(tl.int32), 0)
        kl_sum += tl.sum(tl.load(st + 3, mask=inb, other=0.0), 0)
        ratio_sum += tl.sum(tl.load(st + 4, mask=inb, other=0.0), 0)
        ratio_min = tl.minimum(ratio_min, tl.min(tl.load(st + 5, mask=inb & has, other=float("inf")), 0))
        ratio_max = tl.maximum(ratio_max, tl.max(tl.load(st + 6, mask=inb & has, other=float("-inf")), 0))
        token_mean_sum += tl.sum(tl.load(st + 7, mask=inb, other=0.0), 0)
        k1_sum += tl.sum(tl.load(st + 8, mask=inb, other=0.0), 0)

    if HAS_NORMALIZER:
        if NORMALIZER_FROM_PTR:
            den = tl.load(normalizer_ptr).to(tl.float32)
            # read on the device, unchecked with validate=False: a negative or non-finite value makes the
            # loss and the gradients NaN (visible), never a finite loss of the wrong sign or size
            den = tl.where((den >= 0.0) & (den < float("inf")), den, float("nan"))
        else:
            den = tl.cast(normalizer, tl.float32)
    elif AGG == 0:
        den = n_tokens.to(tl.float32)
    else:
        den = n_seqs.to(tl.float32)
    if AGG == 2:
        num = token_mean_sum
    else:
        num = loss_sum
    has_den = den != 0.0  # a zero denominator (nothing active, or normalizer 0) gives loss 0
    safe_den = tl.where(has_den, den, 1.0)
    tl.store(loss_ptr, tl.where(has_den, num / safe_den, 0.0))
    inv_den = tl.where(has_den, 1.0 / safe_den, 0.0)

    has_tok = n_tokens > 0  # no active token: every diagnostic is 0
    n_tok = tl.where(has_tok, n_tokens.to(tl.float32), 1.0)
    tl.store(diag_ptr + 0, tl.where(has_tok, n_clipped.to(tl.float32) / n_tok, 0.0))
    tl.store(diag_ptr + 1, tl.where(has_tok, kl_sum / n_tok, 0.0))
    tl.store(diag_ptr + 2, tl.where(has_tok, ratio_sum / n_tok, 0.0))
    tl.store(diag_ptr + 3, tl.where(has_tok, ratio_min, 0.0))
    tl.store(diag_ptr + 4, tl.where(has_tok, ratio_max, 0.0))
    tl.store(diag_ptr + 5, tl.where(has_tok, k1_sum / n_tok, 0.0))

    for tile in range(0, tl.cdiv(B, BLOCK_B)):  # d loss / d l_t of each row's active tokens
        rows = tile * BLOCK_B + lanes
        inb = rows < B
        n = tl.load(row_stats_ptr + rows.to(tl.int64) * 9 + 1, mask=inb, other=0.0)
        if AGG == 2:
            w = inv_den / tl.maximum(n, 1.0)
        else:
            w = tl.zeros((BLOCK_B,), tl.float32) + inv_den
        tl.store(row_weight_ptr + rows, tl.where(n > 0.0, w, 0.0), mask=inb)


@cached
@triton.jit(do_not_specialize=["T", "clip_lo", "clip_hi", "dual_c", "kl_coef", "ent_coef", "tis_cap", "lr_clamp"])
def _policy_loss_bwd_kernel(
    grad_loss_ptr, grad_token_ptr, row_weight_ptr,
    logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, grad_logp_ptr, grad_ent_ptr,
    T, clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
    HAS_TOKEN_GRAD: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr,
    ADV_PER_ROW: tl.constexpr, CISPO: tl.constexpr, DUAL_CLIP: tl.constexpr, HAS_KL: tl.constexpr,
    KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr, TIS_PG: tl.constexpr,
    HAS_LR_CLAMP: tl.constexpr, BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    inb = offs < T
    p = row * T + offs
    active, logp, old, adv, ref, ent, roll = _policy_tile(
        logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, row, p, inb,
        ADV_PER_ROW, HAS_KL, HAS_ENTROPY, TIS_MODE, BLOCK_T)
    _l, dloss, dent, active, _c, _r, _lr = _policy_token(
        logp, old, adv, ref, ent, roll, active, clip_lo, clip_hi, dual_c, kl_coef, ent_coef, tis_cap, lr_clamp,
        CISPO, DUAL_CLIP, HAS_KL, KL_EST, HAS_ENTROPY, TIS_MODE, TIS_PG, HAS_LR_CLAMP)
    up = tl.load(grad_loss_ptr) * tl.load(row_weight_ptr + row)
    if HAS_TOKEN_GRAD:
        up = up + tl.load(grad_token_ptr + p, mask=inb, other=0.0)
    tl.store(grad_logp_ptr + p, tl.where(active, up * dloss, 0.0), mask=inb)
    if WITH_ENTROPY_GRAD:
        tl.store(grad_ent_ptr + p, tl.where(active, up * dent, 0.0), mask=inb)


# ---- launchers ----

def launch_ratio_kl_forward(logp, old_logp, ref_logp, mask, kl_estimator, log_ratio_clamp):
    B, T = logp.shape
    log_ratio = torch.empty_like(logp)
    ratio = torch.empty_like(logp)
    kl = torch.empty_like(logp) if ref_logp is not None else logp.new_empty(0)
    if B * T == 0:
        return log_ratio, ratio, kl
    cfg = config("rl_ratio_kl_fwd", logp.device)
    _ratio_kl_fwd_kernel[(B, cdiv(T, cfg.block_v))](
        logp, old_logp, ref_logp if ref_logp is not None else logp, mask if mask is not None else logp,
        log_ratio, ratio, kl if ref_logp is not None else logp, T,
        float(log_ratio_clamp) if log_ratio_clamp is not None else 0.0,
        HAS_MASK=mask is not None, HAS_CLAMP=log_ratio_clamp is not None, HAS_REF=ref_logp is not None,
        KL_EST=KL_ESTIMATORS[kl_estimator], BLOCK_T=cfg.block_v, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return log_ratio, ratio, kl


def launch_ratio_kl_backward(g_lr, g_ratio, g_kl, logp, old_logp, ref_logp, mask, kl_estimator, log_ratio_clamp):
    B, T = logp.shape
    grad = torch.empty_like(logp)
    if B * T == 0:
        return grad
    cfg = config("rl_ratio_kl_bwd", logp.device)
    has_ref = ref_logp is not None
    _ratio_kl_bwd_kernel[(B, cdiv(T, cfg.block_v))](
        g_lr, g_ratio, g_kl if has_ref else None, logp, old_logp, ref_logp if has_ref else logp,
        mask if mask is not None else logp, grad, T,
        float(log_ratio_clamp) if log_ratio_clamp is not None else 0.0,
        HAS_MASK=mask is not None, HAS_CLAMP=log_ratio_clamp is not None, HAS_REF=has_ref,
        KL_EST=KL_ESTIMATORS[kl_estimator], BLOCK_T=cfg.block_v, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return grad


def _token_args(clip_low, clip_high, dual_clip_c, kl_coef, entropy_coef, tis_cap, log_ratio_clamp):
    return (float(clip_low), float(clip_high), float(dual_clip_c) if dual_clip_c is not None else 0.0,
            float(kl_coef), float(entropy_coef), float(tis_cap) if tis_cap is not None else 0.0,
            float(log_ratio_clamp) if log_ratio_clamp is not None else 0.0)


def _token_terms(advantages, ref_logp, entropy, loss_type, dual_clip_c, kl_estimator, tis_mode, tis_scope,
                 log_ratio_clamp) -> tuple:
    """The facts of a call that decide the per-token kernels' constexprs: part of a plan's key."""
    return (advantages.dim() == 1, ref_logp is not None, entropy is not None, loss_type, dual_clip_c is not None,
            kl_estimator, tis_mode, tis_scope, log_ratio_clamp is not None)


def _token_flags(adv_per_row, has_ref, has_entropy, loss_type, dual_clip, kl_estimator, tis_mode, tis_scope,
                 has_lr_clamp):
    """The per-token kernels' constexprs from _token_terms."""
    return dict(ADV_PER_ROW=adv_per_row, CISPO=loss_type == "cispo", DUAL_CLIP=dual_clip, HAS_KL=has_ref,
                KL_EST=KL_ESTIMATORS[kl_estimator], HAS_ENTROPY=has_entropy, TIS_MODE=TIS_MODES[tis_mode],
                TIS_PG=TIS_SCOPES[tis_scope] == 1, HAS_LR_CLAMP=has_lr_clamp)


def launch_policy_loss_forward(logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp,
                               normalizer_tensor, normalizer, loss_type, aggregation, clip_low, clip_high,
                               dual_clip_c, kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap,
                               tis_scope="loss", log_ratio_clamp=None):
    """Returns (loss [], per_token_loss [B, T], diagnostics [6], row_weight [B]), all fp32.

    ref_logp / entropy / rollout_logp are None when their term is off (the wrapper decides); with
    tis_mode "weights", rollout_logp holds the caller's per-token importance weights.
    """
    B, T = logp.shape
    dev = logp.device
    per_token = torch.empty_like(logp)
    row_stats = torch.empty((B, N_ROW_STATS), dtype=torch.float32, device=dev)
    loss = torch.empty((), dtype=torch.float32, device=dev)
    diag = torch.empty(len(DIAGNOSTICS), dtype=torch.float32, device=dev)
    row_weight = torch.empty(B, dtype=torch.float32, device=dev)
    if B == 0:  # nothing to launch over: the documented empty result
        return loss.zero_(), per_token, diag.zero_(), row_weight
    terms = _token_terms(advantages, ref_logp, entropy, loss_type, dual_clip_c, kl_estimator, tis_mode, tis_scope,
                         log_ratio_clamp)
    key = (T > 0, terms, aggregation, normalizer_tensor is not None, normalizer is not None, dev)
    block, tokens, fold, batch = planned(_FORWARD_PLANS, key, _forward_plan, T > 0, terms, aggregation,
                                         normalizer_tensor is not None, normalizer is not None, dev)
    inputs = (logp, old_logp, advantages, mask, ref_logp if ref_logp is not None else logp,
              entropy if entropy is not None else logp, rollout_logp if rollout_logp is not None else logp)
    token = _token_args(clip_low, clip_high, dual_clip_c, kl_coef, entropy_coef, tis_cap, log_ratio_clamp)
    if fold is not None:
        # (row, tile) programs, then an in-order fold per row: the rows kernel's bits, B x tiles
        # programs instead of B
        n_tiles = cdiv(T, block)
        tile_stats = torch.empty((B, n_tiles, N_ROW_STATS), dtype=torch.float32, device=dev)
        tokens((B, n_tiles), *inputs, per_token, tile_stats, T, *token)
        fold_rows, fold_rows_template = fold
        fold_rows_template((cdiv(B, fold_rows),), tile_stats, row_stats, B, n_tiles)
    else:
        tokens((B,), *inputs, per_token, row_stats, T, *token)
    batch((1,), row_stats, B, normalizer_tensor if normalizer_tensor is not None else loss,
          float(normalizer) if normalizer is not None else 0.0, loss, diag, row_weight)
    return loss, per_token, diag, row_weight


_FORWARD_PLANS = configs.plan_store()  # launch_policy_loss_forward's plans per key (launch.planned)


def _forward_plan(has_tokens, terms, aggregation, normalizer_from_ptr, normalizer_number, device):
    """(tokens per tile, the per-token Template, (rows per fold program, the fold's Template) or None,
    the batch Template) for the token terms and the aggregation. The per-token kernel is the
    (row, tile) one when the split row of the table is on and rows have tokens (then the fold
    follows), else the rows kernel. SLOTs: every argument but the constexprs (B and T vary per call)."""
    cfg = config("rl_policy_loss_rows", device)
    flags = _token_flags(*terms)
    meta = dict(flags, BLOCK_T=cfg.block_v, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    token_args = (SLOT,) * 17
    fold_cfg = config("rl_policy_loss_batch", device)
    if config("rl_policy_loss_split", device).block_v and has_tokens:
        tokens = Template(_policy_loss_tiles_kernel, token_args, meta)
        fold = (fold_cfg.block_v, Template(_policy_loss_fold_kernel, (SLOT,) * 4,
                                           dict(BLOCK_B=fold_cfg.block_v, num_warps=fold_cfg.num_warps)))
    else:
        tokens, fold = Template(_policy_loss_rows_kernel, token_args, meta), None
    batch = Template(_policy_loss_batch_kernel, (SLOT,) * 7,
                     dict(AGG=AGGREGATIONS[aggregation], HAS_NORMALIZER=normalizer_from_ptr or normalizer_number,
                          NORMALIZER_FROM_PTR=normalizer_from_ptr, BLOCK_B=fold_cfg.block_v,
                          num_warps=fold_cfg.num_warps, num_stages=fold_cfg.num_stages))
    return cfg.block_v, tokens, fold, batch


def launch_policy_loss_backward(grad_loss, grad_per_token, row_weight, logp, old_logp, advantages, mask,
                                ref_logp, entropy, rollout_logp, loss_type, clip_low, clip_high, dual_clip_c,
                                kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap, with_entropy_grad,
                                tis_scope="loss", log_ratio_clamp=None):
    """Returns (d logp [B, T], d entropy [B, T] or [0]); grad_per_token may be None (no upstream)."""
    B, T = logp.shape
    grad_logp = torch.empty_like(logp)
    grad_ent = torch.empty_like(logp) if with_entropy_grad else logp.new_empty(0)
    if B * T == 0:
        return grad_logp, grad_ent
    terms = _token_terms(advantages, ref_logp, entropy, loss_type, dual_clip_c, kl_estimator, tis_mode, tis_scope,
                         log_ratio_clamp)
    key = (terms, grad_per_token is not None, with_entropy_grad, logp.device)
    block, template = planned(_BACKWARD_PLANS, key, _backward_plan, terms, grad_per_token is not None,
                              with_entropy_grad, logp.device)
    template((B, cdiv(T, block)),
             grad_loss, grad_per_token if grad_per_token is not None else logp, row_weight,
             logp, old_logp, advantages, mask, ref_logp if ref_logp is not None else logp,
             entropy if entropy is not None else logp, rollout_logp if rollout_logp is not None else logp,
             grad_logp, grad_ent if with_entropy_grad else grad_logp, T,
             *_token_args(clip_low, clip_high, dual_clip_c, kl_coef, entropy_coef, tis_cap, log_ratio_clamp))
    return grad_logp, grad_ent


_BACKWARD_PLANS = configs.plan_store()  # launch_policy_loss_backward's (BLOCK_T, Template) per key


def _backward_plan(terms, has_token_grad, with_entropy_grad, device):
    """(tokens per program, the backward's Template) for the token terms and which gradients flow.
    SLOTs: every argument but the constexprs."""
    cfg = config("rl_policy_loss_bwd", device)
    return cfg.block_v, Template(
        _policy_loss_bwd_kernel, (SLOT,) * 20,
        dict(HAS_TOKEN_GRAD=has_token_grad, WITH_ENTROPY_GRAD=with_entropy_grad, **_token_flags(*terms),
             BLOCK_T=cfg.block_v, num_warps=cfg.num_warps, num_stages=cfg.num_stages))


# ---- torch.library custom ops: usable under torch.compile, autograd through register_autograd ----
# Only logp (and entropy, when its term is on) get gradients; old / ref / rollout logp, advantages,
# the mask and the normalizer are constants of the loss.

@torch.library.custom_op("rlk_triton::rl_ratio_kl_fwd", mutates_args=())
def ratio_kl_fwd(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: Optional[torch.Tensor],
                 mask: Optional[torch.Tensor], kl_estimator: str, log_ratio_clamp: Optional[float],
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_ratio_kl_forward(logp, old_logp, ref_logp, mask, kl_estimator, log_ratio_clamp)


@ratio_kl_fwd.register_fake
def _(logp, old_logp, ref_logp, mask, kl_estimator, log_ratio_clamp):
    return torch.empty_like(logp), torch.empty_like(logp), \
        torch.empty_like(logp) if ref_logp is not None else logp.new_empty(0)


@torch.library.custom_op("rlk_triton::rl_ratio_kl_bwd", mutates_args=())
def ratio_kl_bwd(grad_log_ratio: Optional[torch.Tensor], grad_ratio: Optional[torch.Tensor],
                 grad_kl: Optional[torch.Tensor],
                 logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: Optional[torch.Tensor],
                 mask: Optional[torch.Tensor], kl_estimator: str, log_ratio_clamp: Optional[float],
                 ) -> torch.Tensor:
    return launch_ratio_kl_backward(grad_log_ratio, grad_ratio, grad_kl, logp, old_logp, ref_logp, mask,
                                    kl_estimator, log_ratio_clamp)


@ratio_kl_bwd.register_fake
def _(grad_log_ratio, grad_ratio, grad_kl, logp, *rest):
    return torch.empty_like(logp)


def _ratio_kl_setup_context(ctx, inputs, output):
    logp, old_logp, ref_logp, mask, kl_estimator, log_ratio_clamp = inputs
    ctx.save_for_backward(logp, old_logp, ref_logp, mask)
    ctx.kl_estimator = kl_estimator
    ctx.log_ratio_clamp = log_ratio_clamp
    ctx.set_materialize_grads(False)  # an unused output's gradient is None: the kernel takes it as zeros


def _ratio_kl_backward(ctx, g_lr, g_ratio, g_kl):
    logp, old_logp, ref_logp, mask = ctx.saved_tensors
    dense = lambda g: None if g is None else g.contiguous()  # noqa: E731
    grad = call_ratio_kl_bwd(dense(g_lr), dense(g_ratio), None if ref_logp is None else dense(g_kl), logp,
                             old_logp, ref_logp, mask, ctx.kl_estimator, ctx.log_ratio_clamp)
    return grad, None, None, None, None, None


call_ratio_kl_fwd = autograd_op(ratio_kl_fwd, _ratio_kl_backward, _ratio_kl_setup_context)


@torch.library.custom_op("rlk_triton::rl_policy_loss_fwd", mutates_args=())
def policy_loss_fwd(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    ref_logp: Optional[torch.Tensor], entropy: Optional[torch.Tensor], rollout_logp: Optional[torch.Tensor],
    normalizer_tensor: Optional[torch.Tensor], normalizer: Optional[float], loss_type: str, aggregation: str,
    clip_low: float, clip_high: float, dual_clip_c: Optional[float], kl_coef: float, kl_estimator: str,
    entropy_coef: float, tis_mode: str, tis_cap: Optional[float], tis_scope: str = "loss",
    log_ratio_clamp: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_policy_loss_forward(logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp,
                                      normalizer_tensor, normalizer, loss_type, aggregation, clip_low, clip_high,
                                      dual_clip_c, kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap,
                                      tis_scope, log_ratio_clamp)


@policy_loss_fwd.register_fake
def _(logp, *rest):
    f = lambda *shape: logp.new_empty(shape, dtype=torch.float32)  # noqa: E731
    return f(), f(*logp.shape), f(len(DIAGNOSTICS)), f(logp.shape[0])


@torch.library.custom_op("rlk_triton::rl_policy_loss_bwd", mutates_args=())
def policy_loss_bwd(
    grad_loss: torch.Tensor, grad_per_token: Optional[torch.Tensor], row_weight: torch.Tensor,
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    ref_logp: Optional[torch.Tensor], entropy: Optional[torch.Tensor], rollout_logp: Optional[torch.Tensor],
    loss_type: str, clip_low: float, clip_high: float, dual_clip_c: Optional[float], kl_coef: float,
    kl_estimator: str, entropy_coef: float, tis_mode: str, tis_cap: Optional[float], with_entropy_grad: bool,
    tis_scope: str = "loss", log_ratio_clamp: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_policy_loss_backward(grad_loss, grad_per_token, row_weight, logp, old_logp, advantages, mask,
                                       ref_logp, entropy, rollout_logp, loss_type, clip_low, clip_high,
                                       dual_clip_c, kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap,
                                       with_entropy_grad, tis_scope, log_ratio_clamp)


@policy_loss_bwd.register_fake
def _(grad_loss, grad_per_token, row_weight, logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp,
      loss_type, clip_low, clip_high, dual_clip_c, kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap,
      with_entropy_grad, tis_scope="loss", log_ratio_clamp=None):
    return torch.empty_like(logp), torch.empty_like(logp) if with_entropy_grad else logp.new_empty(0)


_POLICY_PARAMS = ("normalizer", "loss_type", "aggregation", "clip_low", "clip_high", "dual_clip_c", "kl_coef",
                  "kl_estimator", "entropy_coef", "tis_mode", "tis_cap", "tis_scope", "log_ratio_clamp")


def _policy_setup_context(ctx, inputs, output):
    (logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp, _norm_t, *params) = inputs
    _loss, _per_token, _diag, row_weight = output
    ctx.save_for_backward(logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp, row_weight)
    ctx.params = dict(zip(_POLICY_PARAMS, params))
    ctx.set_materialize_grads(False)  # unused outputs (per-token loss, diagnostics) arrive as None, not as zeros


def _policy_backward(ctx, grad_loss, grad_per_token, _grad_diag, _grad_row_weight):
    logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp, row_weight = ctx.saved_tensors
    p = ctx.params
    if grad_loss is None:
        grad_loss = torch.zeros((), dtype=torch.float32, device=logp.device)
    with_entropy_grad = entropy is not None and ctx.needs_input_grad[5]
    grad_logp, grad_ent = call_policy_loss_bwd(
        grad_loss.contiguous(), None if grad_per_token is None else grad_per_token.contiguous(), row_weight,
        logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp, p["loss_type"], p["clip_low"],
        p["clip_high"], p["dual_clip_c"], p["kl_coef"], p["kl_estimator"], p["entropy_coef"], p["tis_mode"],
        p["tis_cap"], with_entropy_grad, p["tis_scope"], p["log_ratio_clamp"],
    )
    n_inputs = 8 + len(_POLICY_PARAMS)
    grads = [None] * n_inputs
    grads[0] = grad_logp
    if with_entropy_grad:
        grads[5] = grad_ent
    return tuple(grads)


call_policy_loss_fwd = autograd_op(policy_loss_fwd, _policy_backward, _policy_setup_context)
call_ratio_kl_bwd = direct(ratio_kl_bwd)
call_policy_loss_bwd = direct(policy_loss_bwd)
