"""The training path: teacher forcing over a packed varlen batch, autograd through every op.

    logp = train_forward(model, tokens, cu_seqlens)                            # fp32 [N]
    logp, ent = train_forward(model, tokens, cu_seqlens, temperature=0.7, return_entropy=True)
    logp = train_forward(model, tokens, cu_seqlens, logp_mode="processed", top_k=50, top_p=0.9)

Row t of the result scores targets[t] (default: the next token of the same sequence; the last
token of each sequence gets ignore_index and logp 0) from token t's final hidden state. The logp
modes are rollout.py's (sampling.py documents them): "raw" through linear_logp (no [N, V] logits,
the default); "logits" (= use_logits=True) through the model-dtype logits and selected_logp;
"processed" through the same logits masked to the top-k / top-p kept set. Each is the exact
computation the rollout engine runs for that mode, on the same rows, hence the same bits.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..attention import attention
from ..errors import DTypeError, InputError, ShapeError
from ..logp import DEFAULT_IGNORE_INDEX, linear_logp, selected_logp
from ..ops.rope import rope_position_ids
from .decoder import DecoderModel
from .sampling import LOGP_MODES, keep_mask

__all__ = ["train_forward", "next_token_targets", "score_logits"]

# record(name, tensor, keys): keys int64 [rows, 2] = (sequence id, position) of each row
KeyedRecord = Callable[[str, torch.Tensor, torch.Tensor], None]


def next_token_targets(tokens: torch.Tensor, cu_seqlens: torch.Tensor,
                       ignore_index: int = DEFAULT_IGNORE_INDEX) -> torch.Tensor:
    """targets[t] = tokens[t + 1] inside each sequence; ignore_index at each sequence's last token."""
    targets = torch.full_like(tokens, ignore_index)
    if tokens.numel() > 1:
        targets[:-1] = tokens[1:]
    ends = cu_seqlens[1:].long() - 1
    ends = ends[(ends >= 0) & (cu_seqlens[1:].long() > cu_seqlens[:-1].long())]
    targets[ends] = ignore_index
    return targets


def score_logits(logits: torch.Tensor, targets: torch.Tensor, *, logp_mode: str, temperature,
                 top_k=0, top_p=1.0, return_entropy: bool = False, ignore_index: int = DEFAULT_IGNORE_INDEX):
    """The "logits" / "processed" logp of targets from model-dtype logits [N, V] (shared with the rollout).

    temperature, top_k, top_p: numbers or per-row tensors [N]. "processed" masks the tokens outside
    keep_mask to -inf and renormalizes with selected_logp (fp32 inside)."""
    if logp_mode == "processed":
        keep = keep_mask(logits, temperature, top_k, top_p)
        logits = torch.where(keep, logits, torch.full_like(logits, float("-inf")))
    elif logp_mode != "logits":
        raise InputError("logp_mode", f"score_logits handles 'logits' and 'processed', got {logp_mode!r}")
    t = temperature
    if isinstance(t, torch.Tensor) and t.dim() > 0:
        t = t.to(device=logits.device, dtype=torch.float32)
    return selected_logp(logits, targets, temperature=t, return_entropy=return_entropy, ignore_index=ignore_index)


def train_forward(model: DecoderModel, tokens: torch.Tensor, cu_seqlens: torch.Tensor,
                  position_ids: Optional[torch.Tensor] = None, *, targets: Optional[torch.Tensor] = None,
                  temperature: float = 1.0, return_entropy: bool = False, use_logits: bool = False,
                  logp_mode: str = "raw", top_k: int = 0, top_p: float = 1.0,
                  ignore_index: int = DEFAULT_IGNORE_INDEX, record: Optional[KeyedRecord] = None,
                  seq_ids: Optional[Sequence[int]] = None):
    """Per-token float32 logp (and entropy) of targets under the model, differentiable.

    Args:
        tokens: int [N] packed token ids; cu_seqlens: int32 [S + 1] offsets (0 ... N).
        position_ids: int [N]; default 0 .. len - 1 within each sequence.
        targets: int [N]; default next_token_targets(tokens, cu_seqlens, ignore_index).
        temperature: logits / T (a positive float).
        logp_mode: "raw" (linear_logp on the final hidden states: no [N, V] logits), "logits"
            (model-dtype logits + selected_logp; use_logits=True means this), "processed" (the
            top_k / top_p renormalized distribution from those logits).
        record: record(name, tensor, keys) for every op's output (decoder.forward_packed names,
            plus "logits" outside "raw" mode and "logp"), keys int64 [N, 2] = (seq_ids[s], position) per row.
        seq_ids: the id of each sequence for record's keys (default 0 .. S - 1); pass the rollout's
            request ids to align a training pass with a rollout row by row.
    Returns:
        logp float32 [N], or (logp, entropy) with return_entropy.
    """
    if use_logits and logp_mode == "raw":
        logp_mode = "logits"
    if logp_mode not in LOGP_MODES:
        raise InputError("logp_mode", f"{logp_mode!r} is not one of {LOGP_MODES}")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
        raise ShapeError("tokens", "must be a 1-D tensor of packed token ids")
    if tokens.dtype not in (torch.int32, torch.int64):
        raise DTypeError("tokens", f"dtype {tokens.dtype} is not int32 or int64")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        raise DTypeError("cu_seqlens", "must be a 1-D int32 tensor [S + 1]")
    dev = model.device
    tokens, cu_seqlens = tokens.to(dev), cu_seqlens.to(dev)
    N = tokens.shape[0]
    if position_ids is None:
        position_ids = rope_position_ids(cu_seqlens, num_tokens=N)
    position_ids = position_ids.to(dev)
    if position_ids.numel() and int(position_ids.max()) >= model.max_positions:
        raise InputError("position_ids", f"position {int(position_ids.max())} is past the RoPE tables "
                         f"({model.max_positions}; raise max_positions)")
    if targets is None:
        targets = next_token_targets(tokens, cu_seqlens, ignore_index)
    targets = targets.to(dev)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long().cpu()
    max_seqlen = int(lengths.max()) if lengths.numel() else 0

    if record is not None:
        S = lengths.numel()
        ids = torch.arange(S) if seq_ids is None else torch.as_tensor(list(seq_ids), dtype=torch.int64)
        if ids.numel() != S:
            raise ShapeError("seq_ids", f"{ids.numel()} ids for {S} sequences")
        keys = torch.stack([torch.repeat_interleave(ids, lengths), position_ids.cpu().long()], dim=1)

    def record_keyed(name, t):  # the probe's record with each token's (sequence id, position)
        record(name, t, keys)

    def attend(i, q, k, v):
        return attention(q, k, v, cu_seqlens, max_seqlen=max_seqlen, validate=False)

    hidden = model.forward_packed(tokens, position_ids, attend, record=record_keyed if record is not None else None)
    if logp_mode == "raw":
        res = linear_logp(hidden, model.lm_head_weight, targets, temperature=temperature,
                          return_entropy=return_entropy, ignore_index=ignore_index)
    else:
        logits = model.logits(hidden)
        if record is not None:
            record_keyed("logits", logits)
        res = score_logits(logits, targets, logp_mode=logp_mode, temperature=temperature,
                           top_k=top_k, top_p=top_p, return_entropy=return_entropy, ignore_index=ignore_index)
    if record is not None:
        record_keyed("logp", res[0] if return_entropy else res)
    return res
