"""Log-probabilities of sampled tokens: the module RL frameworks import.

    from rlk_triton.logp import selected_logp
    logp = selected_logp(logits[:, :-1], tokens[:, 1:], temperature=0.7)       # fp32 [B, T-1]
    logp, ent = selected_logp(logits, targets, return_entropy=True)

Both the rollout side and the trainer side call the same kernel, so a token's value is bitwise the
same wherever it is computed on the same device and build (docs/selected_logp.md).
"""
from __future__ import annotations

import math
from typing import Union

import torch

from . import native
from ._runtime import first_id_outside, interpreter_active, shaped
from .errors import (BackendError, DeviceError, DTypeError, InputError, LayoutError, ShapeError, TargetIndexError,
                     TemperatureError)
from .ops import linear_logp as _linear_op
from .ops import selected_logp as _op
from .ops.selected_logp_torch import selected_logp_torch as _torch_reference
from .ops.selected_logp_torch import selected_logp_torch_indexed as _torch_reference_indexed

SUPPORTED_LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_INDEX_DTYPES = (torch.int32, torch.int64)
DEFAULT_IGNORE_INDEX = -100
# Backend ids of this op (rlk_triton.registry describes them; rlk_triton.policy chooses).
BACKENDS = ("triton", "torch_reference", "cuda_native")

Temperature = Union[float, torch.Tensor]

# Triton decides interpreted-or-compiled when it decorates the kernels, which happened on import.
_INTERPRETED = interpreter_active()

__all__ = ["selected_logp", "selected_logp_indexed", "linear_logp", "DEFAULT_IGNORE_INDEX"]


def selected_logp(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    temperature: Temperature = 1.0,
    return_entropy: bool = False,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
    validate: bool = True,
    backend: str = "triton",
):
    """log softmax(logits / T)[target] in float32, optionally with the entropy of softmax(logits / T).

    Args:
        logits: [..., V] bf16 / fp16 / fp32. Any leading shape and strides; the last dim must be
            contiguous (a non-contiguous last dim raises LayoutError rather than copying).
        target_ids: int32 / int64 with shape logits.shape[:-1].
        temperature: a positive finite float, or a tensor of per-row temperatures with the shape of
            target_ids (or 0-dim). A runtime value: changing it never recompiles a kernel.
            Not differentiated.
        return_entropy: also return the entropy, computed in the same pass over the logits.
        ignore_index: rows whose target equals it get logp 0 and no logp gradient (their entropy
            is still computed). Any other target outside [0, V) is an error.
        validate: check target ids (and tensor temperatures) on the host. It costs one device sync;
            with validate=False an invalid target gives NaN logp instead of an error.
        backend: "triton" (the kernels), "torch_reference" (float64 torch, runs anywhere, slow,
            same contract), or "cuda_native": the native kernels (docs/native.md), only where
            `rlk-triton native admit --op selected_logp` recorded it bitwise equal to the Triton
            kernels under this process's fingerprint (BackendError saying why otherwise); logits
            whose leading dims view as [N, V] (dense row strides), eager only; forward and backward.
            rlk_triton.policy.resolve chooses one for a framework.

    Returns:
        logp (float32, shape of target_ids), or (logp, entropy) when return_entropy.
        Differentiable w.r.t. logits; the gradient comes back in the logits' dtype.
    """
    lead = _check_logits(logits, backend)
    _check_index("target_ids", target_ids, logits, lead)
    t_value, t_rows = _check_temperature(temperature, target_ids.shape, logits.device, validate)
    ignore_index = _check_ignore_index(ignore_index)
    flat_targets = target_ids.reshape(-1).contiguous()  # the kernel reads targets densely
    if validate:
        _check_targets(flat_targets, logits.shape[-1], ignore_index)
    if backend == "torch_reference":
        logp, entropy = _torch_reference(logits, flat_targets, t_value, t_rows, ignore_index, return_entropy)
    elif backend == "cuda_native":
        logp, entropy, _, _ = _native_selected_logp(logits, flat_targets, t_value, t_rows, int(ignore_index),
                                                    bool(return_entropy))
    else:
        logp, entropy, _, _ = _op.call_selected_logp_fwd(
            logits, flat_targets, None, t_value, t_rows, int(ignore_index), bool(return_entropy)
        )
    logp = shaped(logp, target_ids.shape)
    if return_entropy:
        return logp, shaped(entropy, target_ids.shape)
    return logp


def selected_logp_indexed(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    row_indices: torch.Tensor,
    *,
    temperature: Temperature = 1.0,
    return_entropy: bool = False,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
    validate: bool = True,
    backend: str = "triton",
):
    """selected_logp on the rows ``row_indices`` of logits only; the other rows are never read.

    The rows of logits [..., V] are numbered in row-major order of the leading dims (as in
    logits.reshape(-1, V)). row_indices [K] int32 / int64, distinct; target_ids [K]; a tensor
    temperature is [K]. Index tensors may have any strides (a strided view gives the bits of its
    contiguous copy). Returns [K] float32 (and entropy), bitwise equal to the dense result on
    those rows. The gradient is zero on the rows not scored.

    validate=True checks targets and row numbers on the host (one device sync): a row number
    outside [0, rows) or a repeated one raises ShapeError naming row_indices. With validate=False
    an out-of-range row number gives NaN logp and entropy for that entry and adds nothing to the
    gradient (no read or write outside logits); repeated rows give undefined gradient values on
    those rows. Row numbers into logits with no rows at all raise ShapeError either way (no sync).
    """
    lead = _check_logits(logits, backend)
    n_rows = math.prod(lead)
    if not isinstance(row_indices, torch.Tensor) or row_indices.dim() != 1:
        raise ShapeError("row_indices", "must be a 1-D tensor of row numbers")
    if row_indices.dtype not in SUPPORTED_INDEX_DTYPES:
        raise DTypeError("row_indices", f"dtype {row_indices.dtype} is not int32 or int64")
    if row_indices.device != logits.device:
        raise DeviceError("row_indices", f"on {row_indices.device}, logits on {logits.device}")
    _check_index("target_ids", target_ids, logits, tuple(row_indices.shape))
    if n_rows == 0 and row_indices.numel():  # no row exists: known from the shapes, no sync
        raise ShapeError("row_indices", f"{row_indices.numel()} row numbers into logits with no rows "
                         f"{tuple(logits.shape)}")
    t_value, t_rows = _check_temperature(temperature, target_ids.shape, logits.device, validate)
    ignore_index = _check_ignore_index(ignore_index)
    row_indices = row_indices.contiguous()
    if validate:
        _check_targets(target_ids, logits.shape[-1], ignore_index)
        if row_indices.numel():
            bad = ((row_indices < 0) | (row_indices >= n_rows)).any()
            dup = torch.unique(row_indices).numel() != row_indices.numel()
            if bool(bad):
                raise ShapeError("row_indices", f"row numbers must lie in [0, {n_rows})")
            if dup:
                raise ShapeError("row_indices", "row numbers must be distinct")
    if backend == "torch_reference":
        logp, entropy = _torch_reference_indexed(logits, target_ids.reshape(-1), row_indices, t_value, t_rows,
                                                 ignore_index, return_entropy)
    elif backend == "cuda_native":
        logp, entropy, _, _ = _native_selected_logp(logits, target_ids.contiguous(), t_value, t_rows,
                                                    int(ignore_index), bool(return_entropy), row_indices)
    else:
        logp, entropy, _, _ = _op.call_selected_logp_fwd(
            logits, target_ids.contiguous(), row_indices, t_value, t_rows, int(ignore_index),
            bool(return_entropy),
        )
    return (logp, entropy) if return_entropy else logp


def linear_logp(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    tp_group=None,
    vocab_start_index: int = 0,
    global_vocab_size: int | None = None,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
    validate: bool = True,
    saved: str = "recompute",
    saved_vocab: int | None = None,
):
    """log softmax((hidden @ weight.T + bias) / T)[target] in float32, without [tokens, V] logits.

    Args:
        hidden: [..., H] bf16 / fp16 / fp32; the last dim contiguous.
        weight: [V_local, H], hidden's dtype and device, rows contiguous. With tp_group, this rank's
            contiguous vocab shard [vocab_start_index, vocab_start_index + V_local).
        target_ids: int32 / int64 with shape hidden.shape[:-1]: GLOBAL vocab ids (with tp_group a
            rank sees targets outside its shard; the rank holding a target contributes its logit).
        bias: optional [V_local], hidden's dtype.
        temperature: a positive finite float, a runtime value (never recompiles). Not differentiated.
        return_entropy: also return the entropy of softmax(logits / T), from the same pass.
        tp_group: a torch.distributed process group whose ranks hold the vocab shards in rank
            order. Every rank passes the same hidden and target_ids. Row statistics merge in rank
            order; logp, entropy and d hidden are bitwise equal to one shard's when every
            vocab_start_index is a multiple of the canonical chunk (configs chunk_v; 4096 on CUDA).
        vocab_start_index, global_vocab_size: this shard's offset and the full vocab size (without
            tp_group: 0 and V_local).
        ignore_index: rows with this target get logp 0 and no logp gradient; other targets must lie
            in [0, global_vocab_size).
        validate: check targets (and, with tp_group, that the shards tile the vocab in rank order);
            costs a host sync (and a small collective). Invalid targets otherwise give NaN logp.
        saved: what the backward keeps. "recompute" (default): O(N) state, the backward recomputes
            the logits (one more GEMM). "logits": the forward also writes z minus its tile's row max
            into an operator-owned [N, V] buffer (float16 for 16-bit inputs, float32 for float32) that
            the backward reads instead; logp and entropy are the same bits either way, the gradients
            are within their own contract (docs/linear_logp.md). With tp_group each rank keeps its
            shard's [N, V_local]; aligned shards give one shard's bits, as for "recompute".
        saved_vocab: with saved="logits", keep only the logits of the vocab's first saved_vocab
            columns (global ids), rounded down to whole backward chunks (configs chunk_v: 4096 on
            sm90); the backward recomputes the rest. None (default): every column. A memory budget
            of B bytes at N tokens buys about B / (2 N) columns for 16-bit inputs; fix the value for
            a run (e.g. from the largest micro-batch) rather than per batch, since the gradients'
            bits depend on it (never on the tokens for a given value). With tp_group each rank keeps
            its part of those columns; aligned shards give one shard's bits.

    Returns:
        logp float32 with target_ids' shape, or (logp, entropy). Differentiable w.r.t. hidden, weight
        and bias; gradients in their dtypes, accumulated in fp32 (docs/linear_logp.md).
    """
    hidden2d, lead = _check_linear_inputs(hidden, weight, bias, target_ids)
    t = _check_scalar_temperature(temperature)
    V_local = weight.shape[0]
    if tp_group is None:
        if vocab_start_index != 0:
            raise ShapeError("vocab_start_index", "must be 0 without tp_group (the weight is the whole vocab)")
        if global_vocab_size not in (None, V_local):
            raise ShapeError("global_vocab_size", f"is {global_vocab_size} but the weight holds {V_local} "
                             "rows and there is no tp_group")
        global_V = V_local
    else:
        if global_vocab_size is None:
            raise ShapeError("global_vocab_size", "is required with tp_group")
        global_V = int(global_vocab_size)
        if vocab_start_index < 0 or vocab_start_index + V_local > global_V:
            raise ShapeError("vocab_start_index", f"shard [{vocab_start_index}, {vocab_start_index + V_local})"
                             f" is not inside the vocab [0, {global_V})")
    ignore_index = _check_ignore_index(ignore_index)
    if saved not in _linear_op.SAVED:
        raise InputError("saved", f"must be one of {_linear_op.SAVED}, got {saved!r}")
    if saved_vocab is not None:
        if isinstance(saved_vocab, bool) or not isinstance(saved_vocab, int) or saved_vocab < 0:
            raise InputError("saved_vocab", f"must be None or an int >= 0, got {saved_vocab!r}")
        if saved != "logits":
            raise InputError("saved_vocab", f"applies to saved='logits' only (saved={saved!r} keeps no logits)")
    flat_targets = target_ids.reshape(-1).contiguous()
    if validate:
        _check_targets(flat_targets, global_V, ignore_index)
        if tp_group is not None:
            _check_shards(tp_group, vocab_start_index, V_local, global_V, hidden2d, flat_targets)
    # the logits are kept only for a backward that will read them
    keep = saved == "logits" and torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (hidden2d, weight, bias))
    save_cols = _linear_op.kept_columns(_linear_op.tile_config("linear_logp_dlogits", hidden2d), V_local,
                                        int(vocab_start_index), global_V, saved_vocab) if keep else 0
    if tp_group is None:
        logp, entropy, *_ = _linear_op.call_linear_logp_fwd(hidden2d, weight, bias, flat_targets, t,
                                                            int(ignore_index), bool(return_entropy), save_cols)
    else:
        logp, entropy, _, _ = _linear_op.LinearLogpTP.apply(hidden2d, weight, bias, flat_targets, t,
                                                            int(ignore_index), bool(return_entropy),
                                                            tp_group, int(vocab_start_index), save_cols)
    logp = shaped(logp, lead)
    return (logp, shaped(entropy, lead)) if return_entropy else logp


# ---- validation: typed errors that name the argument ----

def _check_linear_inputs(hidden, weight, bias, target_ids):
    for name, x in (("hidden", hidden), ("weight", weight)):
        if not isinstance(x, torch.Tensor):
            raise DTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in SUPPORTED_LOGITS_DTYPES:
            raise DTypeError(name, f"dtype {x.dtype} is not one of bfloat16, float16, float32")
    if hidden.dim() < 1:
        raise ShapeError("hidden", "needs a hidden dim: shape [..., H]")
    if weight.dim() != 2:
        raise ShapeError("weight", f"must be [V_local, H], got shape {tuple(weight.shape)}")
    H = hidden.shape[-1]
    if weight.shape[1] != H:
        raise ShapeError("weight", f"hidden size {weight.shape[1]} does not match hidden's {H}")
    if weight.dtype != hidden.dtype:
        raise DTypeError("weight", f"dtype {weight.dtype} differs from hidden's {hidden.dtype}")
    if weight.device != hidden.device:
        raise DeviceError("weight", f"on {weight.device}, hidden on {hidden.device}")
    if H > 1 and weight.stride(1) != 1:
        raise LayoutError("weight", f"rows must be contiguous (stride {weight.stride(1)}); call .contiguous()")
    if H > 1 and hidden.stride(-1) != 1:
        raise LayoutError("hidden", f"the hidden dim must be contiguous (stride {hidden.stride(-1)})")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype != hidden.dtype:
            raise DTypeError("bias", f"must be a tensor of hidden's dtype {hidden.dtype}")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ShapeError("bias", f"shape {tuple(bias.shape)} is not [V_local] = [{weight.shape[0]}]")
        if bias.device != hidden.device:
            raise DeviceError("bias", f"on {bias.device}, hidden on {hidden.device}")
        bias_ok = bias.stride(0) == 1 or bias.numel() <= 1
        if not bias_ok:
            raise LayoutError("bias", "must be contiguous")
    if hidden.device.type == "cpu":
        if not _INTERPRETED:
            raise DeviceError("hidden", "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 "
                              "before importing rlk_triton, or move to CUDA")
    elif hidden.device.type != "cuda":
        raise DeviceError("hidden", f"unsupported device {hidden.device}")
    lead = tuple(hidden.shape[:-1])
    _check_index("target_ids", target_ids, hidden, lead, against="hidden")
    if weight.shape[0] == 0 and math.prod(lead) > 0:
        raise ShapeError("weight", "has no vocab rows")
    return hidden.reshape(math.prod(lead), H), lead  # not -1: H may be 0


def _check_scalar_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TemperatureError("temperature", f"expected a float, got {type(temperature).__name__}")
    t = float(temperature)
    if not math.isfinite(t) or t <= 0.0:
        raise TemperatureError("temperature", f"must be finite and > 0, got {temperature!r}")
    return t


def _check_shards(group, start, V_local, global_V, hidden2d, flat_targets):
    """Every rank: same vocab size, token count and hidden size; shards tile [0, V) in rank order."""
    import torch.distributed as dist

    mine = torch.tensor([start, V_local, global_V, hidden2d.shape[0], hidden2d.shape[1]],
                        dtype=torch.int64, device=hidden2d.device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    rows = [[int(v) for v in e] for e in every]
    expect = 0
    for r, (s, n, gv, N, H) in enumerate(rows):
        if (gv, N, H) != (global_V, hidden2d.shape[0], hidden2d.shape[1]):
            raise ShapeError("tp_group", f"rank {r} has (global_vocab_size, tokens, H) = {(gv, N, H)}, "
                             f"this rank {(global_V, hidden2d.shape[0], hidden2d.shape[1])}")
        if s != expect:
            raise ShapeError("vocab_start_index", f"rank {r} starts at {s}, expected {expect}: shards "
                             "must be contiguous and in rank order")
        expect = s + n
    if expect != global_V:
        raise ShapeError("global_vocab_size", f"the shards cover [0, {expect}), not [0, {global_V})")


def _native_selected_logp(logits, flat_targets, t_value, t_rows, ignore_index, with_entropy, row_indices=None):
    """The native forward where it is admitted and has a kernel for these logits; BackendError saying
    why otherwise (never a silent switch to the Triton kernels). row_indices: the scored rows of the
    [N, V] view (selected_logp_indexed), or None for every row."""
    if torch.compiler.is_compiling():
        raise BackendError("backend", "cuda_native runs in eager only: use backend='triton' under torch.compile")
    ok, why = native.usable("selected_logp", str(logits.device))
    if not ok:
        raise BackendError("backend", f"selected_logp.cuda_native is not usable here: {why}")
    rows = native._slp_rows(logits)
    if rows is None:
        raise BackendError("backend", f"cuda_native takes logits whose leading dims view as [N, V] (dense row "
                           f"strides), got shape {tuple(logits.shape)} with strides {logits.stride()}: "
                           "use backend='triton'")
    if rows.shape[1] == 0 and flat_targets.numel():  # (no rows at all: empty results, as the other backends)
        raise BackendError("backend", "cuda_native needs V >= 1: use backend='triton'")
    layout = native._slp_config(rows)
    chunk_v = layout[1]
    if -(-rows.shape[1] // chunk_v) > 64:
        raise BackendError("backend", f"cuda_native merges at most 64 vocab chunks of {chunk_v} (V <= "
                           f"{64 * chunk_v} here), got V = {rows.shape[1]}: use backend='triton'")
    if rows.data_ptr() % 16:  # the layout rule is known for 16-byte aligned logits only (docs/native.md)
        raise BackendError("backend", "cuda_native needs the logits 16-byte aligned: use backend='triton'")
    return _op.native_forward(rows, flat_targets, t_value, t_rows, ignore_index, with_entropy, layout, row_indices)


def _check_logits(logits, backend) -> tuple[int, ...]:
    if backend not in BACKENDS:
        raise BackendError("backend", f"unknown backend {backend!r} (have: {', '.join(BACKENDS)})")
    if not isinstance(logits, torch.Tensor):
        raise DTypeError("logits", f"expected a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in SUPPORTED_LOGITS_DTYPES:
        raise DTypeError("logits", f"dtype {logits.dtype} is not one of bfloat16, float16, float32")
    if logits.dim() < 1:
        raise ShapeError("logits", "needs a vocab dim: shape [..., V]")
    if logits.shape[-1] > 1 and logits.stride(-1) != 1:
        raise LayoutError("logits", f"the vocab dim must be contiguous (stride {logits.stride(-1)});"
                          " call .contiguous() first")
    if logits.device.type == "cpu" and backend == "triton":
        if not _INTERPRETED:
            raise DeviceError("logits", "CPU tensors need the Triton interpreter: set "
                              "TRITON_INTERPRET=1 before importing rlk_triton, or move to CUDA")
    elif logits.device.type not in ("cuda", "cpu"):
        raise DeviceError("logits", f"unsupported device {logits.device}")
    lead = tuple(logits.shape[:-1])
    if logits.shape[-1] == 0 and math.prod(lead) > 0:
        raise ShapeError("logits", "the vocab dim V is 0")
    return lead


def _check_index(name, ids, logits, shape, against="logits"):
    if not isinstance(ids, torch.Tensor):
        raise DTypeError(name, f"expected a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype not in SUPPORTED_INDEX_DTYPES:
        raise DTypeError(name, f"dtype {ids.dtype} is not int32 or int64")
    if tuple(ids.shape) != tuple(shape):
        raise ShapeError(name, f"shape {tuple(ids.shape)} does not match {tuple(shape)}"
                         f" ({against} {tuple(logits.shape)})")
    if ids.device != logits.device:
        raise DeviceError(name, f"on {ids.device}, {against} on {logits.device}")


def _check_temperature(temperature, shape, device, validate):
    """(scalar, None) or (1.0, fp32 per-row tensor)."""
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise DTypeError("temperature", f"dtype {temperature.dtype} is not floating point")
        if temperature.device != device:
            raise DeviceError("temperature", f"on {temperature.device}, logits on {device}")
        if temperature.dim() == 0:
            temperature = temperature.expand(shape)
        if tuple(temperature.shape) != tuple(shape):
            raise ShapeError("temperature", f"shape {tuple(temperature.shape)} does not match the "
                             f"rows {tuple(shape)}")
        rows = temperature.detach().reshape(-1).to(torch.float32).contiguous()
        if validate and rows.numel():
            if not bool((torch.isfinite(rows) & (rows > 0)).all()):
                raise TemperatureError("temperature", "every temperature must be finite and > 0")
        return 1.0, rows
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TemperatureError("temperature", f"expected a float or a tensor, got {type(temperature).__name__}")
    t = float(temperature)
    if not math.isfinite(t) or t <= 0.0:
        raise TemperatureError("temperature", f"must be finite and > 0, got {temperature!r}")
    return t, None


def _check_ignore_index(ignore_index):
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise InputError("ignore_index", f"must be an int, got {ignore_index!r}")
    return ignore_index


def _check_targets(flat_targets, V, ignore_index):
    bad = first_id_outside(flat_targets, 0, V, ignore_index)  # the one host sync of validation
    if bad is not None:
        raise TargetIndexError("target_ids", f"id {bad[1]} at flat position {bad[0]} is outside "
                               f"[0, {V}) and is not ignore_index={ignore_index}")
