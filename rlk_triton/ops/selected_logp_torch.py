"""The contract-preserving torch reference backend of selected_logp: runs anywhere, slow.

It follows the same numeric contract as the Triton kernels (contracts/selected_logp.yaml) by
computing in float64 and rounding once at the end: logp and entropy to float32, the gradient to
the logits' dtype. It is batch-invariant by construction: rows are processed in chunks of exactly
CHUNK_ROWS rows (the last chunk padded), so every row goes through reductions of one fixed shape,
and no reduction mixes rows. The backward is elementwise (no scatter, no atomics).
"""
from __future__ import annotations

import math

import torch

CHUNK_ROWS = 16


def _chunks(n):
    for start in range(0, n, CHUNK_ROWS):
        yield start, min(start + CHUNK_ROWS, n)


def _padded(t, start, stop):
    """Rows [start, stop) of t padded with zeros to CHUNK_ROWS rows (a fixed reduction shape)."""
    part = t[start:stop]
    if part.shape[0] == CHUNK_ROWS:
        return part
    pad = torch.zeros((CHUNK_ROWS - part.shape[0],) + tuple(part.shape[1:]), dtype=part.dtype, device=part.device)
    return torch.cat([part, pad])


def _stats(x64):
    """(log-softmax, entropy) of float64 [CHUNK_ROWS, V] rows, -inf safe."""
    m = x64.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    logq = x64 - (m + torch.log(torch.exp(x64 - m).sum(-1, keepdim=True)))
    p = torch.exp(logq)
    ent = -torch.where(p > 0, p * logq, torch.zeros_like(p)).sum(-1)
    return logq, p, ent


def _rows(logits2d, targets, temps, ignore_index):
    """Yield per chunk: (start, stop, logq, p, entropy, onehot mask, ignored, 1/T) in float64."""
    V = logits2d.shape[-1]
    cols = torch.arange(V, device=logits2d.device)
    for start, stop in _chunks(logits2d.shape[0]):
        t64 = _padded(temps, start, stop).to(torch.float64)[:, None]
        t64 = torch.where(t64 > 0, t64, torch.ones_like(t64))  # padding rows
        x64 = _padded(logits2d, start, stop).to(torch.float64) / t64
        logq, p, ent = _stats(x64)
        tgt = _padded(targets, start, stop).to(torch.int64)
        ignored = tgt == ignore_index
        onehot = (cols[None, :] == tgt[:, None]) & ~ignored[:, None]
        in_range = (tgt >= 0) & (tgt < V)
        yield start, stop, logq, p, ent, onehot, ignored, in_range, t64


class _SelectedLogpTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits2d, targets, temps, ignore_index):
        n = logits2d.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits2d.device)
        entropy = torch.empty(n, dtype=torch.float32, device=logits2d.device)
        for start, stop, logq, _p, ent, onehot, ignored, in_range, _t in _rows(logits2d, targets, temps,
                                                                                ignore_index):
            k = stop - start
            lp = torch.where(onehot, logq, torch.zeros_like(logq)).sum(-1)  # one term per row: exact
            lp = torch.where(in_range, lp, torch.full_like(lp, float("nan")))  # the kernel's: never silent
            lp = torch.where(ignored, torch.zeros_like(lp), lp)
            logp[start:stop] = lp[:k].to(torch.float32)
            entropy[start:stop] = ent[:k].to(torch.float32)
        ctx.save_for_backward(logits2d, targets, temps)
        ctx.ignore_index = ignore_index
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits2d, targets, temps = ctx.saved_tensors
        grad = torch.empty_like(logits2d)
        g_all = torch.zeros(logits2d.shape[0], device=logits2d.device) if grad_logp is None else grad_logp
        h_all = None if grad_entropy is None else grad_entropy
        for start, stop, logq, p, ent, onehot, ignored, _ok, t64 in _rows(logits2d, targets, temps,
                                                                           ctx.ignore_index):
            k = stop - start
            g = _padded(g_all, start, stop).to(torch.float64)[:, None]
            d = g * (onehot.to(torch.float64) - p)
            d = torch.where(ignored[:, None], torch.zeros_like(d), d)
            if h_all is not None:
                h = _padded(h_all, start, stop).to(torch.float64)[:, None]
                d = d - h * torch.where(p > 0, p * (logq + ent[:, None]), torch.zeros_like(p))
            grad[start:stop] = (d / t64)[:k].to(logits2d.dtype)
        return grad, None, None, None


def selected_logp_torch(logits, target_ids, temperature, temperature_rows, ignore_index, with_entropy):
    """Same signature and outputs as the Triton path's (logp, entropy) over flat rows."""
    V = logits.shape[-1]
    logits2d = logits.reshape(math.prod(logits.shape[:-1]), V)  # not -1: V may be 0 (no rows then)
    n = logits2d.shape[0]
    temps = temperature_rows if temperature_rows is not None else \
        torch.full((n,), float(temperature), dtype=torch.float32, device=logits.device)
    logp, entropy = _SelectedLogpTorch.apply(logits2d, target_ids.reshape(-1), temps, int(ignore_index))
    return logp, entropy if with_entropy else entropy[:0]


def selected_logp_torch_indexed(logits, target_ids, row_indices, temperature, temperature_rows, ignore_index,
                                with_entropy):
    """selected_logp_torch on the rows row_indices of logits.reshape(-1, V) (at least one row).

    A row number outside the rows (row_indices unvalidated) reads row 0 instead and gives NaN logp
    and entropy, as the Triton kernel does: no index_select out of range (an error on the CPU, a
    device assert on CUDA). Its gradient is zero, so it adds only +0.0 to row 0's gradient.
    """
    V = logits.shape[-1]
    logits2d = logits.reshape(math.prod(logits.shape[:-1]), V)
    ok = (row_indices >= 0) & (row_indices < logits2d.shape[0])
    rows = logits2d.index_select(0, torch.where(ok, row_indices, torch.zeros_like(row_indices)))
    logp, entropy = selected_logp_torch(rows, target_ids, temperature, temperature_rows, ignore_index, with_entropy)
    nan = torch.full_like(logp, float("nan"))
    return torch.where(ok, logp, nan), (torch.where(ok, entropy, nan) if with_entropy else entropy)
