"""GSPO, the sequence-level clipped policy loss: kernels, launchers, custom ops.

Per sequence i with active tokens T_i (n_i = |T_i| > 0):
  s_i  = exp(mean_{t in T_i} (logp_t - old_logp_t))          the sequence-level importance ratio
  l_i  = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))
  loss = sum_{i: n_i > 0} l_i / (normalizer or #{i: n_i > 0})
  d l_i / d logp_t = c_i = (-A_i if the unclipped term is the max else 0) * s_i / n_i,  t in T_i
Kernels: (1) one program per row folds BLOCK_T-token tiles in increasing order into the row's sum of
log-ratios and its count, and writes l_i, s_i, c_i; (2) one program folds the rows' terms in
BLOCK_B-row tiles in increasing order into the loss and the diagnostics; (3) the backward is
elementwise: d logp_t = (g_loss * w + g_row_i) * c_i. No atomics; configs in rlk_triton/configs.py.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of

DIAGNOSTICS = ("clipfrac", "ratio_mean", "ratio_min", "ratio_max")


def _cfg(kernel, device):
    return configs.lookup_fixed(kernel, arch_of(device))


@triton.jit(do_not_specialize=["T", "clip_low", "clip_high"])
def _gspo_rows_kernel(logp_ptr, old_ptr, adv_ptr, mask_ptr, loss_ptr, s_ptr, coef_ptr, n_ptr, clipped_ptr,
                      T, clip_low, clip_high, BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_T)
    total = tl.zeros((), tl.float32)
    count = tl.zeros((), tl.float32)  # exact: T < 2^24
    for start in range(0, T, BLOCK_T):
        offs = start + lanes
        p = row * T + offs
        active = (offs < T) & (tl.load(mask_ptr + p, mask=offs < T, other=0) != 0)
        lr = tl.load(logp_ptr + p, mask=active, other=0.0) - tl.load(old_ptr + p, mask=active, other=0.0)
        total += tl.sum(tl.where(active, lr, 0.0), 0)
        count += tl.sum(active.to(tl.float32), 0)
    has = count > 0.0
    s = tl.exp(total / tl.maximum(count, 1.0))
    a = tl.load(adv_ptr + row)
    cs = tl.minimum(tl.maximum(s, clip_low), clip_high)
    unclipped = -a * s >= -a * cs
    loss = tl.where(unclipped, -a * s, -a * cs)
    coef = tl.where(unclipped, -a, 0.0) * s / tl.maximum(count, 1.0)
    tl.store(loss_ptr + row, tl.where(has, loss, 0.0))
    tl.store(s_ptr + row, tl.where(has, s, 0.0))
    tl.store(coef_ptr + row, tl.where(has, coef, 0.0))
    tl.store(n_ptr + row, count)
    tl.store(clipped_ptr + row, tl.where(has & (s != cs), 1.0, 0.0))


@triton.jit(do_not_specialize=["B", "normalizer"])
def _gspo_batch_kernel(loss_rows_ptr, s_ptr, n_ptr, clipped_ptr, out_ptr, diag_ptr, weight_ptr, B, normalizer,
                       HAS_NORMALIZER: tl.constexpr, BLOCK_B: tl.constexpr):
    lanes = tl.arange(0, BLOCK_B)
    total = tl.zeros((), tl.float32)
    seqs = tl.zeros((), tl.float32)
    clipped = tl.zeros((), tl.float32)
    s_sum = tl.zeros((), tl.float32)
    s_min = tl.full((), float("inf"), tl.float32)
    s_max = tl.full((), float("-inf"), tl.float32)
    for start in range(0, B, BLOCK_B):
        i = start + lanes
        has = (i < B) & (tl.load(n_ptr + i, mask=i < B, other=0.0) > 0.0)
        s = tl.load(s_ptr + i, mask=has, other=0.0)
        total += tl.sum(tl.load(loss_rows_ptr + i, mask=has, other=0.0), 0)
        seqs += tl.sum(has.to(tl.float32), 0)
        clipped += tl.sum(tl.load(clipped_ptr + i, mask=has, other=0.0), 0)
        s_sum += tl.sum(s, 0)
        s_min = tl.minimum(s_min, tl.min(tl.where(has, s, float("inf")), 0))
        s_max = tl.maximum(s_max, tl.max(tl.where(has, s, float("-inf")), 0))
    if HAS_NORMALIZER:
        denom = tl.cast(normalizer, tl.float32)
    else:
        denom = seqs
    weight = tl.where(denom > 0.0, 1.0 / tl.maximum(denom, 1e-30), 0.0)  # no sequence: loss 0
    any_seq = seqs > 0.0
    tl.store(out_ptr, total * weight)
    tl.store(weight_ptr, weight)
    tl.store(diag_ptr + 0, tl.where(any_seq, clipped / tl.maximum(seqs, 1.0), 0.0))
    tl.store(diag_ptr + 1, tl.where(any_seq, s_sum / tl.maximum(seqs, 1.0), 0.0))
    tl.store(diag_ptr + 2, tl.where(any_seq, s_min, 0.0))
    tl.store(diag_ptr + 3, tl.where(any_seq, s_max, 0.0))


@triton.jit(do_not_specialize=["T"])
def _gspo_bwd_kernel(grad_loss_ptr, grad_rows_ptr, weight_ptr, coef_ptr, mask_ptr, grad_ptr, T,
                     BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    p = row * T + offs
    active = (offs < T) & (tl.load(mask_ptr + p, mask=offs < T, other=0) != 0)
    up = tl.load(grad_loss_ptr) * tl.load(weight_ptr) + tl.load(grad_rows_ptr + row)
    d = up * tl.load(coef_ptr + row)
    tl.store(grad_ptr + p, tl.where(active, d, 0.0), mask=offs < T)


def launch_forward(logp, old_logp, advantages, mask_u8, clip_low, clip_high, normalizer):
    B, T = logp.shape
    dev = logp.device
    rows = [torch.zeros(B, dtype=torch.float32, device=dev) for _ in range(5)]  # loss, s, coef, n, clipped
    loss = torch.zeros((), dtype=torch.float32, device=dev)
    diag = torch.zeros(len(DIAGNOSTICS), dtype=torch.float32, device=dev)
    weight = torch.zeros((), dtype=torch.float32, device=dev)
    if B and T:
        cfg = _cfg("rl_policy_loss_rows", dev)
        _gspo_rows_kernel[(B,)](logp, old_logp, advantages, mask_u8, *rows, T, float(clip_low), float(clip_high),
                                BLOCK_T=cfg.block_v, num_warps=cfg.num_warps)
    if B:
        cfg = _cfg("rl_policy_loss_batch", dev)
        _gspo_batch_kernel[(1,)](rows[0], rows[1], rows[3], rows[4], loss, diag, weight, B,
                                 float(normalizer) if normalizer is not None else 1.0,
                                 HAS_NORMALIZER=normalizer is not None, BLOCK_B=cfg.block_v,
                                 num_warps=cfg.num_warps)
    return loss, rows[0], diag, weight, rows[2]


@torch.library.custom_op("rlk_triton::gspo_loss_fwd", mutates_args=())
def gspo_loss_fwd(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_low: float, clip_high: float, normalizer: Optional[float],
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(logp, old_logp, advantages, mask, clip_low, clip_high, normalizer)


@gspo_loss_fwd.register_fake
def _(logp, old_logp, advantages, mask, clip_low, clip_high, normalizer):
    f = lambda *shape: logp.new_empty(shape, dtype=torch.float32)  # noqa: E731
    B = logp.shape[0]
    return f(), f(B), f(len(DIAGNOSTICS)), f(), f(B)


@torch.library.custom_op("rlk_triton::gspo_loss_bwd", mutates_args=())
def gspo_loss_bwd(grad_loss: torch.Tensor, grad_rows: torch.Tensor, weight: torch.Tensor, coef: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
    B, T = mask.shape
    grad = torch.empty(B, T, dtype=torch.float32, device=mask.device)
    if B and T:
        cfg = _cfg("rl_policy_loss_bwd", mask.device)
        _gspo_bwd_kernel[(B, triton.cdiv(T, cfg.block_v))](grad_loss, grad_rows, weight, coef, mask, grad, T,
                                                             BLOCK_T=cfg.block_v, num_warps=cfg.num_warps)
    return grad


@gspo_loss_bwd.register_fake
def _(grad_loss, grad_rows, weight, coef, mask):
    return mask.new_empty(mask.shape, dtype=torch.float32)


def _setup(ctx, inputs, output):
    mask = inputs[3]
    _loss, _rows, _diag, weight, coef = output
    ctx.save_for_backward(weight, coef, mask)


def _backward(ctx, g_loss, g_rows, _g_diag, _g_weight, _g_coef):
    weight, coef, mask = ctx.saved_tensors
    g_loss = torch.zeros((), device=mask.device) if g_loss is None else g_loss.contiguous()
    g_rows = torch.zeros(mask.shape[0], device=mask.device) if g_rows is None else g_rows.contiguous()
    grad = gspo_loss_bwd(g_loss.float(), g_rows.float(), weight, coef, mask)
    return grad, None, None, None, None, None, None


gspo_loss_fwd.register_autograd(_backward, setup_context=_setup)
