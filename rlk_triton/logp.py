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

from ._runtime import interpreter_active
from .errors import (BackendError, DeviceError, DTypeError, LayoutError, ShapeError, TargetIndexError,
                     TemperatureError)
from .ops import selected_logp as _op
from .ops.selected_logp_torch import selected_logp_torch as _torch_reference

SUPPORTED_LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_INDEX_DTYPES = (torch.int32, torch.int64)
DEFAULT_IGNORE_INDEX = -100
# Backend ids of this op (rlk_triton.registry describes them; rlk_triton.policy chooses).
BACKENDS = ("triton", "torch_reference")

Temperature = Union[float, torch.Tensor]

# Triton decides interpreted-or-compiled when it decorates the kernels, which happened on import.
_INTERPRETED = interpreter_active()

__all__ = ["selected_logp", "selected_logp_indexed", "DEFAULT_IGNORE_INDEX"]


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
        backend: "triton" (the kernels) or "torch_reference" (float64 torch, runs anywhere, slow,
            same contract); rlk_triton.policy.resolve chooses one for a framework.

    Returns:
        logp (float32, shape of target_ids), or (logp, entropy) when return_entropy.
        Differentiable w.r.t. logits; the gradient comes back in the logits' dtype.
    """
    lead = _check_logits(logits, backend)
    _check_index("target_ids", target_ids, logits, lead)
    t_value, t_rows = _check_temperature(temperature, target_ids.shape, logits.device, validate)
    flat_targets = target_ids.reshape(-1).contiguous()  # the kernel reads targets densely
    if validate:
        _check_targets(flat_targets, logits.shape[-1], ignore_index)
    if backend == "torch_reference":
        logp, entropy = _torch_reference(logits, flat_targets, t_value, t_rows, ignore_index, return_entropy)
    else:
        logp, entropy, _, _ = _op.selected_logp_fwd(
            logits, flat_targets, None, t_value, t_rows, int(ignore_index), bool(return_entropy)
        )
    logp = logp.view(target_ids.shape)
    if return_entropy:
        return logp, entropy.view(target_ids.shape)
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
    temperature is [K]. Returns [K] float32 (and entropy), bitwise equal to the dense result on
    those rows. The gradient is zero on the rows not scored.
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
    t_value, t_rows = _check_temperature(temperature, target_ids.shape, logits.device, validate)
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
        rows = logits.reshape(-1, logits.shape[-1]).index_select(0, row_indices)
        logp, entropy = _torch_reference(rows, target_ids.reshape(-1), t_value, t_rows, ignore_index,
                                         return_entropy)
    else:
        logp, entropy, _, _ = _op.selected_logp_fwd(
            logits, target_ids.contiguous(), row_indices, t_value, t_rows, int(ignore_index),
            bool(return_entropy),
        )
    return (logp, entropy) if return_entropy else logp


# ---- validation: typed errors that name the argument ----

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


def _check_index(name, ids, logits, shape):
    if not isinstance(ids, torch.Tensor):
        raise DTypeError(name, f"expected a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype not in SUPPORTED_INDEX_DTYPES:
        raise DTypeError(name, f"dtype {ids.dtype} is not int32 or int64")
    if tuple(ids.shape) != tuple(shape):
        raise ShapeError(name, f"shape {tuple(ids.shape)} does not match {tuple(shape)}"
                         f" (logits {tuple(logits.shape)})")
    if ids.device != logits.device:
        raise DeviceError(name, f"on {ids.device}, logits on {logits.device}")


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


def _check_targets(flat_targets, V, ignore_index):
    if flat_targets.numel() == 0:
        return
    bad = ((flat_targets < 0) | (flat_targets >= V)) & (flat_targets != ignore_index)
    if bool(bad.any()):  # the one host sync of validation
        pos = int(bad.nonzero()[0, 0])
        val = int(flat_targets[pos])
        raise TargetIndexError("target_ids", f"id {val} at flat position {pos} is outside "
                               f"[0, {V}) and is not ignore_index={ignore_index}")
