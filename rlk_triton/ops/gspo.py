"""GSPO, the sequence-level clipped policy loss: kernels, launchers, custom ops.

Per sequence i with active tokens T_i (n_i = |T_i| > 0; with tis_mode "mask", tokens whose weight
w_t = exp(old_logp_t - rollout_logp_t) exceeds tis_cap are dropped first, as if masked):
  s_i   = exp(mean_{t in T_i} (logp_t - old_logp_t))          the sequence-level importance ratio
  pg_i  = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))
  e_t   = kl_coef kl_t(logp_t, ref_logp_t) - entropy_coef entropy_t      (the optional token terms)
  l_i   = mean_{t in T_i} tis_t (pg_i + e_t),  tis_t = min(w_t, tis_cap) ("truncate"), the caller's
          is_weights ("weights"), else 1; with tis_scope "pg": mean_{t in T_i} (tis_t pg_i + e_t)
  loss  = sum_{i: n_i > 0} f_i l_i / den, with (aggregation) f_i = 1 and den = normalizer or #{i: n_i > 0}
          ("seq-mean-token-mean", the GSPO paper's), or f_i = n_i and den = normalizer or #tokens
          ("token-mean": each sequence weighted by its length), normalizer or #{i: n_i > 0}
          ("seq-mean-token-sum"), normalizer ("seq-mean-token-sum-norm")
  d l_i / d logp_t = tis_t (c_i + kl_coef dkl_t / n_i),  c_i = (-A_i if the unclipped term is the max else 0) s_i / n_i
  d l_i / d entropy_t = -tis_t entropy_coef / n_i           (tis_scope "pg": tis_t on c_i only)
  d loss / d l_i = f_i / den
(the GSPO paper's token-level form: pg's gradient reaches token t through s_it = sg(s_i) exp(logp_t -
sg(logp_t)), weighted by that token's own tis_t; without truncation it is the plain GSPO gradient.)
Kernels: (1) one program per row folds BLOCK_T-token tiles in increasing order into the row's sums
(log-ratios, count, tis_t, tis_t e_t, k3 of old vs current) and writes l_i, s_i, c_i, n_i;
(2) one program folds the rows' terms (times f_i) in BLOCK_B-row tiles in increasing order into the
loss and the diagnostics, then writes each row's weight f_i / den; (3) the backward is elementwise, from the same per-token function as the forward
(_gspo_token). No atomics; configs in rlk_triton/configs.py (the rl_policy_loss_* rows).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of
from .rl_losses import AGGREGATIONS, KL_ESTIMATORS, TIS_MODES, TIS_SCOPES, _kl_and_grad
from .dispatch import autograd_op, direct
from .launch import SLOT, Template, cached, cdiv, planned

DIAGNOSTICS = ("clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "ppo_kl")  # policy_loss's, in its order
N_ROWS = 7  # per-row outputs of the rows kernel: loss, s, coef, n, clipped, k3 sum, log-ratio sum


def _cfg(kernel, device):
    return configs.lookup_fixed(kernel, arch_of(device))


@triton.jit
def _gspo_token(logp_ptr, old_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, p, inb, kl_coef, ent_coef, tis_cap,
                HAS_KL: tl.constexpr, KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr):
    """One tile's (active, logp, old, tis, e, kl_coef * dkl): active after TIS masking; inactive lanes of
    logp / old are 0 (padding never reaches the arithmetic); e and its derivative are 0 when off."""
    active = inb & (tl.load(mask_ptr + p, mask=inb, other=0) != 0)
    logp = tl.load(logp_ptr + p, mask=active, other=0.0)
    old = tl.load(old_ptr + p, mask=active, other=0.0)
    tis = tl.full(logp.shape, 1.0, tl.float32)
    if TIS_MODE == 3:  # the caller's per-token weights
        tis = tl.load(roll_ptr + p, mask=active, other=0.0)
    elif TIS_MODE != 0:
        w = tl.exp(old - tl.load(roll_ptr + p, mask=active, other=0.0))
        if TIS_MODE == 1:  # truncate: a constant weight min(w, cap) on the token's share
            tis = tl.where(w > tis_cap, tis_cap, w)
        elif TIS_MODE == 2:  # mask: dropped as if masked
            active = active & (w <= tis_cap)
    extra = tl.zeros(logp.shape, tl.float32)
    dextra = tl.zeros(logp.shape, tl.float32)
    if HAS_KL:
        kl, dkl = _kl_and_grad(logp, tl.load(ref_ptr + p, mask=active, other=0.0), KL_EST)
        extra = kl_coef * kl
        dextra = kl_coef * dkl
    if HAS_ENTROPY:
        extra = extra - ent_coef * tl.load(ent_ptr + p, mask=active, other=0.0)
    return active, logp, old, tis, extra, dextra


@cached
@triton.jit(do_not_specialize=["T", "clip_low", "clip_high", "kl_coef", "ent_coef", "tis_cap"])
def _gspo_rows_kernel(logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr,
                      loss_ptr, s_ptr, coef_ptr, n_ptr, clipped_ptr, k3_ptr, lr_ptr,
                      T, clip_low, clip_high, kl_coef, ent_coef, tis_cap,
                      HAS_KL: tl.constexpr, KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr,
                      TIS_MODE: tl.constexpr, TIS_PG: tl.constexpr, BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_T)
    total = tl.zeros((), tl.float32)
    count = tl.zeros((), tl.float32)  # exact: T < 2^24
    tis_sum = tl.zeros((), tl.float32)
    extra_sum = tl.zeros((), tl.float32)
    k3_sum = tl.zeros((), tl.float32)
    for start in range(0, T, BLOCK_T):
        offs = start + lanes
        inb = offs < T
        active, logp, old, tis, extra, _d = _gspo_token(
            logp_ptr, old_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, row * T + offs, inb, kl_coef, ent_coef,
            tis_cap, HAS_KL, KL_EST, HAS_ENTROPY, TIS_MODE)
        total += tl.sum(tl.where(active, logp - old, 0.0), 0)
        count += tl.sum(active.to(tl.float32), 0)
        if TIS_MODE == 1 or TIS_MODE == 3:
            tis_sum += tl.sum(tl.where(active, tis, 0.0), 0)
        if HAS_KL or HAS_ENTROPY:
            if TIS_PG:
                extra_sum += tl.sum(tl.where(active, extra, 0.0), 0)
            else:
                extra_sum += tl.sum(tl.where(active, tis * extra, 0.0), 0)
        u = old - logp  # approx_kl: k3 of old vs current, as policy_loss
        k3_sum += tl.sum(tl.where(active, (tl.exp(u) - 1.0) - u, 0.0), 0)
    has = count > 0.0
    n1 = tl.maximum(count, 1.0)
    s = tl.exp(total / n1)
    a = tl.load(adv_ptr + row)
    cs = tl.minimum(tl.maximum(s, clip_low), clip_high)
    unclipped = -a * s >= -a * cs
    loss = tl.where(unclipped, -a * s, -a * cs)
    coef = tl.where(unclipped, -a, 0.0) * s / n1
    if TIS_MODE == 1 or TIS_MODE == 3:
        loss = loss * (tis_sum / n1)
    if HAS_KL or HAS_ENTROPY:
        loss = loss + extra_sum / n1
    tl.store(loss_ptr + row, tl.where(has, loss, 0.0))
    tl.store(s_ptr + row, tl.where(has, s, 0.0))
    tl.store(coef_ptr + row, tl.where(has, coef, 0.0))
    tl.store(n_ptr + row, count)
    tl.store(clipped_ptr + row, tl.where(has & (s != cs), 1.0, 0.0))
    tl.store(k3_ptr + row, k3_sum)
    tl.store(lr_ptr + row, total)


@cached
@triton.jit(do_not_specialize=["B", "normalizer"])
def _gspo_batch_kernel(loss_rows_ptr, s_ptr, n_ptr, clipped_ptr, k3_ptr, lr_ptr, out_ptr, diag_ptr, weight_ptr, B,
                       normalizer, AGG: tl.constexpr, HAS_NORMALIZER: tl.constexpr, BLOCK_B: tl.constexpr):
    lanes = tl.arange(0, BLOCK_B)
    total = tl.zeros((), tl.float32)
    lr_total = tl.zeros((), tl.float32)
    seqs = tl.zeros((), tl.float32)
    tokens = tl.zeros((), tl.int32)  # int32: B * T < 2^31
    clipped = tl.zeros((), tl.float32)
    k3_total = tl.zeros((), tl.float32)
    s_sum = tl.zeros((), tl.float32)
    s_min = tl.full((), float("inf"), tl.float32)
    s_max = tl.full((), float("-inf"), tl.float32)
    for start in range(0, B, BLOCK_B):
        i = start + lanes
        n = tl.load(n_ptr + i, mask=i < B, other=0.0)
        has = (i < B) & (n > 0.0)
        s = tl.load(s_ptr + i, mask=has, other=0.0)
        if AGG == 2:  # f_i = 1
            total += tl.sum(tl.load(loss_rows_ptr + i, mask=has, other=0.0), 0)
        else:  # f_i = n_i: each sequence weighted by its token count
            total += tl.sum(n * tl.load(loss_rows_ptr + i, mask=has, other=0.0), 0)
        lr_total += tl.sum(tl.load(lr_ptr + i, mask=has, other=0.0), 0)
        seqs += tl.sum(has.to(tl.float32), 0)
        tokens += tl.sum(n.to(tl.int32), 0)
        clipped += tl.sum(tl.load(clipped_ptr + i, mask=has, other=0.0), 0)
        k3_total += tl.sum(tl.load(k3_ptr + i, mask=has, other=0.0), 0)
        s_sum += tl.sum(s, 0)
        s_min = tl.minimum(s_min, tl.min(tl.where(has, s, float("inf")), 0))
        s_max = tl.maximum(s_max, tl.max(tl.where(has, s, float("-inf")), 0))
    if HAS_NORMALIZER:
        denom = tl.cast(normalizer, tl.float32)
    elif AGG == 0:
        denom = tokens.to(tl.float32)
    else:
        denom = seqs
    weight = tl.where(denom > 0.0, 1.0 / tl.maximum(denom, 1e-30), 0.0)  # no sequence: loss 0
    any_seq = seqs > 0.0
    tl.store(out_ptr, total * weight)
    for start in range(0, B, BLOCK_B):  # d loss / d l_i = f_i / den
        i = start + lanes
        n = tl.load(n_ptr + i, mask=i < B, other=0.0)
        if AGG == 2:
            w = tl.zeros((BLOCK_B,), tl.float32) + weight
        else:
            w = n * weight
        tl.store(weight_ptr + i, tl.where(n > 0.0, w, 0.0), mask=i < B)
    tl.store(diag_ptr + 0, tl.where(any_seq, clipped / tl.maximum(seqs, 1.0), 0.0))
    tl.store(diag_ptr + 1, tl.where(any_seq, k3_total / tl.maximum(tokens, 1).to(tl.float32), 0.0))
    tl.store(diag_ptr + 2, tl.where(any_seq, s_sum / tl.maximum(seqs, 1.0), 0.0))
    tl.store(diag_ptr + 3, tl.where(any_seq, s_min, 0.0))
    tl.store(diag_ptr + 4, tl.where(any_seq, s_max, 0.0))
    tl.store(diag_ptr + 5, tl.where(any_seq, -lr_total / tl.maximum(tokens, 1).to(tl.float32), 0.0))


@cached
@triton.jit(do_not_specialize=["T", "kl_coef", "ent_coef", "tis_cap"])
def _gspo_bwd_kernel(grad_loss_ptr, grad_rows_ptr, weight_ptr, coef_ptr, n_ptr,
                     logp_ptr, old_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, grad_ptr, grad_ent_ptr,
                     T, kl_coef, ent_coef, tis_cap,
                     HAS_KL: tl.constexpr, KL_EST: tl.constexpr, HAS_ENTROPY: tl.constexpr, TIS_MODE: tl.constexpr,
                     TIS_PG: tl.constexpr, WITH_ENTROPY_GRAD: tl.constexpr, HAS_LOSS_GRAD: tl.constexpr,
                     HAS_ROW_GRAD: tl.constexpr, BLOCK_T: tl.constexpr):
    # An upstream gradient autograd did not give (the loss or the sequence terms left out) is a zero
    # that is not read: the sum of the other term alone.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    inb = offs < T
    p = row * T + offs
    active, _lp, _old, tis, _e, dextra = _gspo_token(
        logp_ptr, old_ptr, mask_ptr, ref_ptr, ent_ptr, roll_ptr, p, inb, kl_coef, ent_coef, tis_cap,
        HAS_KL, KL_EST, HAS_ENTROPY, TIS_MODE)
    if HAS_LOSS_GRAD:
        up = tl.load(grad_loss_ptr) * tl.load(weight_ptr + row)
        if HAS_ROW_GRAD:
            up = up + tl.load(grad_rows_ptr + row)
    else:
        up = tl.load(grad_rows_ptr + row)
    n1 = tl.maximum(tl.load(n_ptr + row), 1.0)
    d = tl.zeros((BLOCK_T,), tl.float32) + tl.load(coef_ptr + row)
    dent = tl.zeros((BLOCK_T,), tl.float32) + (-ent_coef / n1)
    if TIS_PG:
        if TIS_MODE == 1 or TIS_MODE == 3:
            d = d * tis
        if HAS_KL:
            d = d + dextra / n1
    else:
        if HAS_KL:
            d = d + dextra / n1
        if TIS_MODE == 1 or TIS_MODE == 3:
            d = d * tis
            dent = dent * tis
    tl.store(grad_ptr + p, tl.where(active, up * d, 0.0), mask=inb)
    if WITH_ENTROPY_GRAD:
        tl.store(grad_ent_ptr + p, tl.where(active, up * dent, 0.0), mask=inb)


def _token_terms(ref_logp, entropy, kl_estimator, tis_mode, tis_scope) -> tuple:
    """The facts of a call that decide the token kernels' constexprs: part of a plan's key."""
    return ref_logp is not None, entropy is not None, kl_estimator, tis_mode, tis_scope


def _token_flags(has_ref, has_entropy, kl_estimator, tis_mode, tis_scope):
    """The token kernels' constexprs from _token_terms."""
    return dict(HAS_KL=has_ref, KL_EST=KL_ESTIMATORS[kl_estimator], HAS_ENTROPY=has_entropy,
                TIS_MODE=TIS_MODES[tis_mode], TIS_PG=TIS_SCOPES[tis_scope] == 1)


def _token_args(kl_coef, entropy_coef, tis_cap):
    return float(kl_coef), float(entropy_coef), float(tis_cap) if tis_cap is not None else 0.0


def launch_forward(logp, old_logp, advantages, mask_u8, ref_logp, entropy, rollout_logp, clip_low, clip_high,
                   normalizer, kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap, aggregation="seq-mean-token-mean",
                   tis_scope="loss"):
    """(loss [], sequence terms [B], diagnostics [6], row weight [B], coef [B], n [B]), fp32."""
    B, T = logp.shape
    dev = logp.device
    # The rows kernel writes all seven values of every row and the batch kernel the loss, the
    # diagnostics and every row weight, so the buffers need no zero fill where they run: only rows of
    # no tokens (T = 0, no rows kernel; the batch kernel reads them) and the loss and diagnostics of
    # an empty batch are zeros.
    alloc = torch.empty if T else torch.zeros
    rows = [alloc(B, dtype=torch.float32, device=dev) for _ in range(N_ROWS)]  # loss, s, coef, n, clipped, k3, lr
    alloc = torch.empty if B else torch.zeros
    loss = alloc((), dtype=torch.float32, device=dev)
    diag = alloc(len(DIAGNOSTICS), dtype=torch.float32, device=dev)
    weight = torch.empty(B, dtype=torch.float32, device=dev)
    if not B:
        return loss, rows[0], diag, weight, rows[2], rows[3]
    opt = lambda x: logp if x is None else x  # noqa: E731 - an unused pointer
    terms = _token_terms(ref_logp, entropy, kl_estimator, tis_mode, tis_scope)
    key = (terms, aggregation, normalizer is not None, dev)
    token_rows, batch = planned(_FORWARD_PLANS, key, _forward_plan, terms, aggregation, normalizer is not None, dev)
    if T:
        token_rows((B,), logp, old_logp, advantages, mask_u8, opt(ref_logp), opt(entropy), opt(rollout_logp), *rows,
                   T, float(clip_low), float(clip_high), *_token_args(kl_coef, entropy_coef, tis_cap))
    batch((1,), rows[0], rows[1], rows[3], rows[4], rows[5], rows[6], loss, diag, weight, B,
          float(normalizer) if normalizer is not None else 1.0)
    return loss, rows[0], diag, weight, rows[2], rows[3]


_FORWARD_PLANS = configs.plan_store()  # launch_forward's (rows Template, batch Template) per key (launch.planned)


def _forward_plan(terms, aggregation, has_normalizer, device):
    """(the rows kernel's Template, the batch kernel's) for the token terms, the aggregation and whether
    a normalizer is given. SLOTs: every argument but the constexprs (B and T vary per call)."""
    cfg = _cfg("rl_policy_loss_rows", device)
    batch = _cfg("rl_policy_loss_batch", device)
    return (Template(_gspo_rows_kernel, (SLOT,) * 20,
                     dict(_token_flags(*terms), BLOCK_T=cfg.block_v, num_warps=cfg.num_warps)),
            Template(_gspo_batch_kernel, (SLOT,) * 11,
                     dict(AGG=AGGREGATIONS[aggregation], HAS_NORMALIZER=has_normalizer, BLOCK_B=batch.block_v,
                          num_warps=batch.num_warps)))


@torch.library.custom_op("rlk_triton::gspo_loss_fwd", mutates_args=())
def gspo_loss_fwd(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  ref_logp: Optional[torch.Tensor], entropy: Optional[torch.Tensor],
                  rollout_logp: Optional[torch.Tensor], clip_low: float, clip_high: float,
                  normalizer: Optional[float], kl_coef: float, kl_estimator: str, entropy_coef: float,
                  tis_mode: str, tis_cap: Optional[float], aggregation: str = "seq-mean-token-mean",
                  tis_scope: str = "loss",
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(logp, old_logp, advantages, mask, ref_logp, entropy, rollout_logp, clip_low, clip_high,
                          normalizer, kl_coef, kl_estimator, entropy_coef, tis_mode, tis_cap, aggregation, tis_scope)


@gspo_loss_fwd.register_fake
def _(logp, *rest):
    f = lambda *shape: logp.new_empty(shape, dtype=torch.float32)  # noqa: E731
    B = logp.shape[0]
    return f(), f(B), f(len(DIAGNOSTICS)), f(B), f(B), f(B)


@torch.library.custom_op("rlk_triton::gspo_loss_bwd", mutates_args=())
def gspo_loss_bwd(grad_loss: Optional[torch.Tensor], grad_rows: Optional[torch.Tensor], weight: torch.Tensor,
                  coef: torch.Tensor, n: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                  ref_logp: Optional[torch.Tensor], entropy: Optional[torch.Tensor],
                  rollout_logp: Optional[torch.Tensor], kl_coef: float, kl_estimator: str, entropy_coef: float,
                  tis_mode: str, tis_cap: Optional[float], with_entropy_grad: bool, tis_scope: str = "loss",
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    B, T = mask.shape
    grad = torch.empty(B, T, dtype=torch.float32, device=mask.device)
    grad_ent = torch.empty(B, T, dtype=torch.float32, device=mask.device) if with_entropy_grad else grad.new_empty(0)
    if B and T:
        opt = lambda x: logp if x is None else x  # noqa: E731 - an unused pointer
        terms = _token_terms(ref_logp, entropy, kl_estimator, tis_mode, tis_scope)
        upstream = (grad_loss is not None, grad_rows is not None)
        block, template = planned(_BACKWARD_PLANS, (terms, with_entropy_grad, upstream, mask.device), _backward_plan,
                                  terms, with_entropy_grad, upstream, mask.device)
        template((B, cdiv(T, block)), opt(grad_loss), opt(grad_rows), weight, coef, n, logp, old_logp, mask,
                 opt(ref_logp), opt(entropy), opt(rollout_logp), grad, grad_ent if with_entropy_grad else grad, T,
                 *_token_args(kl_coef, entropy_coef, tis_cap))
    return grad, grad_ent


@gspo_loss_bwd.register_fake
def _(grad_loss, grad_rows, weight, coef, n, logp, old_logp, mask, ref_logp, entropy, rollout_logp, kl_coef,
      kl_estimator, entropy_coef, tis_mode, tis_cap, with_entropy_grad, tis_scope="loss"):
    return logp.new_empty(logp.shape), logp.new_empty(logp.shape) if with_entropy_grad else logp.new_empty(0)


_BACKWARD_PLANS = configs.plan_store()  # gspo_loss_bwd's (BLOCK_T, Template) per key (launch.planned)


def _backward_plan(terms, with_entropy_grad, upstream, device):
    """(tokens per program, the backward's Template) for the token terms, whether the entropy's
    gradient flows and which upstream gradients (loss, sequence terms) there are. SLOTs: every
    argument but the constexprs."""
    cfg = _cfg("rl_policy_loss_bwd", device)
    has_loss_grad, has_row_grad = upstream
    return cfg.block_v, Template(_gspo_bwd_kernel, (SLOT,) * 17,
                                 dict(_token_flags(*terms), WITH_ENTROPY_GRAD=with_entropy_grad,
                                      HAS_LOSS_GRAD=has_loss_grad, HAS_ROW_GRAD=has_row_grad,
                                      BLOCK_T=cfg.block_v, num_warps=cfg.num_warps))


_PARAMS = ("clip_low", "clip_high", "normalizer", "kl_coef", "kl_estimator", "entropy_coef", "tis_mode", "tis_cap",
           "aggregation", "tis_scope")


def _setup(ctx, inputs, output):
    logp, old_logp, _adv, mask, ref_logp, entropy, rollout_logp, *params = inputs
    _loss, _rows, _diag, weight, coef, n = output
    ctx.save_for_backward(weight, coef, n, logp, old_logp, mask, ref_logp, entropy, rollout_logp)
    ctx.params = dict(zip(_PARAMS, params))
    ctx.set_materialize_grads(False)  # unused outputs (diagnostics, weights, counts) arrive as None, not as zeros


def _backward(ctx, g_loss, g_rows, _g_diag, _g_weight, _g_coef, _g_n):
    weight, coef, n, logp, old_logp, mask, ref_logp, entropy, rollout_logp = ctx.saved_tensors
    p = ctx.params
    # An upstream gradient autograd left out stays None (the kernel reads no zeros); with neither (a
    # backward through the diagnostics only), the loss's zero stands for both
    if g_loss is None and g_rows is None:
        g_loss = torch.zeros((), device=mask.device)
    g_loss = None if g_loss is None else g_loss.float().contiguous()
    g_rows = None if g_rows is None else g_rows.float().contiguous()
    with_entropy_grad = entropy is not None and ctx.needs_input_grad[5]
    grad, grad_ent = call_gspo_loss_bwd(g_loss, g_rows, weight, coef, n, logp, old_logp, mask, ref_logp,
                                        entropy, rollout_logp, p["kl_coef"], p["kl_estimator"], p["entropy_coef"],
                                        p["tis_mode"], p["tis_cap"], with_entropy_grad, p["tis_scope"])
    grads = [None] * (7 + len(_PARAMS))
    grads[0] = grad
    if with_entropy_grad:
        grads[5] = grad_ent
    return tuple(grads)


call_gspo_loss_fwd = autograd_op(gspo_loss_fwd, _backward, _setup)
call_gspo_loss_bwd = direct(gspo_loss_bwd)
