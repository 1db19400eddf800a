"""The packed 1-D token layout of RL batches, next to the padded [B, T] one the kernels take.

A packed batch holds the tokens of B sequences back to back: values [N] and cu_seqlens [B + 1]
(int32 / int64, cu_seqlens[0] = 0, non-decreasing, cu_seqlens[-1] = N), as varlen attention uses.
`pad` lays it out as [B, max_seqlen] plus the mask of real tokens; `unpad` takes the real tokens
back. Both are differentiable gathers (every output element has exactly one source), so the RL
operators' per-token values and gradients are the same bits in either layout:

    lp, old, adv = (pad(x, cu, max_len)[0] for x in (logp_packed, old_packed, adv_packed))
    loss, per_token, diag = policy_loss(lp, old, adv, mask=pad(logp_packed, cu, max_len)[1], ...)
    per_token_packed = unpad(per_token, cu)

max_seqlen is an argument (as in varlen attention) so that no host sync is needed to size [B, T].
cu_seqlens may be a strided view (it is read as its contiguous copy).
"""
from __future__ import annotations

import numbers

import torch

from .errors import DeviceError, DTypeError, InputError, ShapeError

__all__ = ["pad", "unpad", "sequence_ids"]


def _check_cu(cu_seqlens, n_tokens, device):
    if not torch.is_tensor(cu_seqlens) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise DTypeError("cu_seqlens", "must be an int32 / int64 tensor [B + 1]")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ShapeError("cu_seqlens", f"must be 1-D [B + 1], got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise DeviceError("cu_seqlens", f"on {cu_seqlens.device}, values on {device}")
    return cu_seqlens.long().contiguous()


def _cu_summary(cu):
    """(cu[0], cu[-1], whether some length is negative, the longest length): one host sync."""
    lengths = cu[1:] - cu[:-1]
    longest = lengths.max() if lengths.numel() else cu.new_zeros(())
    first, last, decreasing, longest = torch.stack([cu[0], cu[-1], (lengths < 0).any().long(), longest]).tolist()
    return first, last, bool(decreasing), longest


def sequence_ids(cu_seqlens: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """[N] int64: the sequence of each packed token (no host sync; cu_seqlens is not checked: a token
    at or past cu_seqlens[-1] gets B, the number of sequences)."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 0:
        raise InputError("n_tokens", f"must be an int >= 0, got {n_tokens!r}")
    cu = _check_cu(cu_seqlens, n_tokens, getattr(cu_seqlens, "device", None))
    tokens = torch.arange(n_tokens, device=cu.device)
    return torch.searchsorted(cu[1:], tokens, right=True)


def pad(values: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *, validate: bool = True):
    """(padded [B, max_seqlen, ...], mask [B, max_seqlen] bool) from packed values [N, ...].

    Padding positions hold 0. validate=True checks on the host (one sync): cu_seqlens starts at 0,
    does not decrease and ends at N (else InputError naming cu_seqlens), and no sequence is longer
    than max_seqlen (else InputError naming max_seqlen).
    validate=False checks nothing and never reads outside values: position (b, j) holds
    values[cu_seqlens[b] + j] and mask True exactly where cu_seqlens[b] + j lies in
    [max(cu_seqlens[b], 0), min(cu_seqlens[b + 1], N)); elsewhere 0 and False. So a sequence longer
    than max_seqlen is cut to its first max_seqlen tokens (its tail is dropped, not an error).
    """
    if not torch.is_tensor(values) or values.dim() < 1:
        raise ShapeError("values", "must be a tensor [N, ...]")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise InputError("max_seqlen", f"must be an int >= 0, got {max_seqlen!r}")
    cu = _check_cu(cu_seqlens, values.shape[0], values.device)
    n = values.shape[0]
    if validate:
        first, last, decreasing, longest = _cu_summary(cu)
        if first != 0 or last != n or decreasing:
            raise InputError("cu_seqlens", f"must start at 0, not decrease and end at N={n}; got "
                             f"cu_seqlens[0]={first}, cu_seqlens[-1]={last}"
                             f"{', a decreasing step' if decreasing else ''}")
        if longest > max_seqlen:
            raise InputError("max_seqlen", f"{max_seqlen} is shorter than the longest sequence ({longest} "
                             "tokens): its tail would be dropped")
    B = cu.numel() - 1
    pos = torch.arange(max_seqlen, device=values.device)
    src = cu[:-1, None] + pos[None, :]  # [B, max_seqlen]
    # (src >= 0) & (src < n) hold for every valid cu_seqlens; without validation they keep the
    # gather inside values
    mask = (src < cu[1:, None]) & (src >= 0) & (src < n)
    gathered = values[src.clamp(0, max(n - 1, 0)).reshape(-1)] if n else \
        values.new_zeros((B * max_seqlen,) + tuple(values.shape[1:]))
    gathered = gathered.reshape((B, max_seqlen) + tuple(values.shape[1:]))
    m = mask.reshape(mask.shape + (1,) * (values.dim() - 1))
    return torch.where(m, gathered, torch.zeros((), dtype=values.dtype, device=values.device)), mask


def unpad(padded: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Packed [N, ...] from padded [B, T, ...]: the real tokens of each row, in order.

    cu_seqlens is always checked, in the one host sync that sizing the output needs anyway: it must
    start at 0 and not decrease (InputError naming cu_seqlens), and no sequence may be longer than
    T (ShapeError naming cu_seqlens).
    """
    if not torch.is_tensor(padded) or padded.dim() < 2:
        raise ShapeError("padded", "must be a tensor [B, T, ...]")
    cu = _check_cu(cu_seqlens, None, padded.device)
    B, T = padded.shape[:2]
    if cu.numel() != B + 1:
        raise ShapeError("cu_seqlens", f"has {cu.numel() - 1} sequences, padded has {B} rows")
    first, n, decreasing, longest = _cu_summary(cu)  # n = cu_seqlens[-1]: the output's size
    if first != 0 or decreasing:
        raise InputError("cu_seqlens", f"must start at 0 and not decrease; got cu_seqlens[0]={first}"
                         f"{', a decreasing step' if decreasing else ''}")
    if longest > T:
        raise ShapeError("cu_seqlens", f"holds a sequence of {longest} tokens; padded holds {T} per row")
    ids = sequence_ids(cu, n)
    within = torch.arange(n, device=padded.device) - cu[ids]
    return padded[ids, within]
