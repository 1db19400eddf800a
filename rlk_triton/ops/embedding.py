"""Token embedding lookup with a deterministic backward: kernels, launchers, custom ops, public API.

    from rlk_triton.ops.embedding import embedding
    h = embedding(token_ids, weight)                  # [*token_ids.shape, H], weight's dtype

Forward: one program per (token, column tile) copies weight[id] bit for bit.
Backward (dW, the weight's dtype): a sorted segment reduction, no atomics. Token indices are
stably sorted by id, so each id's tokens are one segment in ascending token order; one program per
(id, column tile) sums its segment's gradient rows in that order in fp32, rounds once and writes the
row (zero for ids without tokens). The order is documented in rlk_triton/ops/reduction.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of, first_id_outside, interpreter_active, shaped
from ..errors import DeviceError, DTypeError, IdRangeError, InputError, LayoutError, ShapeError
from .dispatch import autograd_op, direct
from .launch import cached, cdiv, next_power_of_2

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
NO_PADDING = -1  # padding_idx of the custom ops when there is none

_INTERPRETED = interpreter_active()

__all__ = ["embedding"]


@cached
@triton.jit
def _gather_kernel(ids_ptr, weight_ptr, out_ptr, weight_stride, V, H, BLOCK_H: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    idx = tl.load(ids_ptr + tok).to(tl.int64) + tl.zeros([BLOCK_H], tl.int64)  # a vector: masks broadcast
    ok = (idx >= 0) & (idx < V)
    bad = (idx < 0) | (idx >= V)
    row = tl.load(weight_ptr + tl.where(ok, idx, 0) * weight_stride + cols, mask=col_ok & ok)
    dst = out_ptr + tok * H + cols
    tl.store(dst, row, mask=col_ok & ok)  # no arithmetic: the weight's bits
    # an out-of-range id (validate=False) gives a NaN row, never another row's values
    nan = tl.full([BLOCK_H], float("nan"), tl.float32).to(out_ptr.dtype.element_ty)
    tl.store(dst, nan, mask=col_ok & bad)


@cached
@triton.jit
def _segment_sum_kernel(grad_ptr, grad_stride, order_ptr, start_ptr, count_ptr, dw_ptr, H,
                        BLOCK_H: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    start = tl.load(start_ptr + v)
    n = tl.load(count_ptr + v)
    seg = order_ptr + start
    acc = tl.zeros([BLOCK_H], tl.float32)
    lane0 = tl.zeros([BLOCK_H], tl.int64)  # slot tests as vectors, so that masks broadcast
    for j in range(0, n, 4):
        # four rows in flight, added strictly in token order; a row past the segment adds +0.0,
        # which leaves acc unchanged (acc starts at +0.0, so it is never -0.0)
        t0 = tl.load(seg + j).to(tl.int64)
        t1 = tl.load(seg + j + 1, mask=j + 1 < n, other=0).to(tl.int64)
        t2 = tl.load(seg + j + 2, mask=j + 2 < n, other=0).to(tl.int64)
        t3 = tl.load(seg + j + 3, mask=j + 3 < n, other=0).to(tl.int64)
        g0 = tl.load(grad_ptr + t0 * grad_stride + cols, mask=col_ok, other=0.0)
        g1 = tl.load(grad_ptr + t1 * grad_stride + cols, mask=col_ok & (lane0 + j + 1 < n), other=0.0)
        g2 = tl.load(grad_ptr + t2 * grad_stride + cols, mask=col_ok & (lane0 + j + 2 < n), other=0.0)
        g3 = tl.load(grad_ptr + t3 * grad_stride + cols, mask=col_ok & (lane0 + j + 3 < n), other=0.0)
        acc = acc + g0.to(tl.float32)
        acc = acc + g1.to(tl.float32)
        acc = acc + g2.to(tl.float32)
        acc = acc + g3.to(tl.float32)
    tl.store(dw_ptr + v * H + cols, acc.to(dw_ptr.dtype.element_ty), mask=col_ok)  # the one downcast


def _block(kernel, weight_dtype, H, device) -> tuple[int, int]:
    cfg = configs.lookup(kernel, arch_of(device), weight_dtype, H)
    # a tile wider than the row only adds masked lanes; the result never depends on it
    return min(cfg.block_v, next_power_of_2(max(H, 1))), cfg.num_warps


def launch_forward(token_ids, weight):
    """weight[token_ids] as a contiguous [N, H] tensor; token_ids is flat (a strided one is copied)."""
    if not token_ids.is_contiguous():  # the kernel reads the ids densely
        token_ids = token_ids.contiguous()
    N = token_ids.numel()
    V, H = weight.shape
    out = torch.empty((N, H), dtype=weight.dtype, device=weight.device)
    if N == 0 or H == 0:
        return out
    block, warps = _block("embedding_fwd", weight.dtype, H, weight.device)
    _gather_kernel[(N, cdiv(H, block))](token_ids, weight, out, weight.stride(0), V, H,
                                               BLOCK_H=block, num_warps=warps)
    return out


def segments(token_ids, V: int, padding_idx: int):
    """(order, start, count): token indices stably sorted by id, and each id's segment in them.

    Tokens whose id is padding_idx or outside [0, V) get the sentinel key V: they sort last and
    belong to no id's segment. Counts come from an integer scatter_add (exact, and no host sync).
    """
    ids = token_ids.long()
    used = (ids >= 0) & (ids < V)
    if padding_idx != NO_PADDING:
        used &= ids != padding_idx
    key = torch.where(used, ids, V)
    order = torch.argsort(key, stable=True)
    count = torch.zeros(V + 1, dtype=torch.int64, device=ids.device).scatter_add_(0, key, torch.ones_like(key))
    start = torch.cumsum(count, 0) - count
    return order, start[:V].contiguous(), count[:V].contiguous()


def launch_backward(grad_out, token_ids, V: int, padding_idx: int, weight_dtype):
    """dW [V, H] in weight_dtype from grad_out [N, H] (last dim contiguous, any row stride)."""
    N, H = grad_out.shape
    dw = torch.empty((V, H), dtype=weight_dtype, device=grad_out.device)
    if V == 0 or H == 0:
        return dw
    order, start, count = segments(token_ids, V, padding_idx)
    block, warps = _block("embedding_bwd", weight_dtype, H, grad_out.device)
    _segment_sum_kernel[(V, cdiv(H, block))](grad_out, grad_out.stride(0), order, start, count, dw, H,
                                                    BLOCK_H=block, num_warps=warps)
    return dw


# ---- torch.library custom ops: usable under torch.compile, autograd through register_autograd ----

@torch.library.custom_op("rlk_triton::embedding_fwd", mutates_args=())
def embedding_fwd(token_ids: torch.Tensor, weight: torch.Tensor, padding_idx: int) -> torch.Tensor:
    return launch_forward(token_ids, weight)


@embedding_fwd.register_fake
def _(token_ids, weight, padding_idx):
    return weight.new_empty((token_ids.numel(), weight.shape[1]))


@torch.library.custom_op("rlk_triton::embedding_bwd", mutates_args=())
def embedding_bwd(grad_out: torch.Tensor, token_ids: torch.Tensor, num_embeddings: int, padding_idx: int,
                  weight_dtype: torch.dtype) -> torch.Tensor:
    return launch_backward(grad_out, token_ids, num_embeddings, padding_idx, weight_dtype)


@embedding_bwd.register_fake
def _(grad_out, token_ids, num_embeddings, padding_idx, weight_dtype):
    return grad_out.new_empty((num_embeddings, grad_out.shape[1]), dtype=weight_dtype)


def _setup_context(ctx, inputs, output):
    token_ids, weight, padding_idx = inputs
    ctx.save_for_backward(token_ids)
    ctx.num_embeddings = weight.shape[0]
    ctx.padding_idx = padding_idx
    ctx.weight_dtype = weight.dtype


def _backward(ctx, grad_out):
    (token_ids,) = ctx.saved_tensors
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dw = call_embedding_bwd(grad_out, token_ids, ctx.num_embeddings, ctx.padding_idx, ctx.weight_dtype)
    return None, dw, None


call_embedding_fwd = autograd_op(embedding_fwd, _backward, _setup_context)
call_embedding_bwd = direct(embedding_bwd)


# ---- the public op ----

def embedding(token_ids: torch.Tensor, weight: torch.Tensor, *, padding_idx=None, validate: bool = True):
    """weight[token_ids]: [*token_ids.shape, H] in the weight's dtype, bitwise the weight's rows.

    Args:
        token_ids: int32 / int64 of any shape and strides (a strided view gives the bits of its
            contiguous copy), ids in [0, V).
        weight: [V, H] bf16 / fp16 / fp32; any row stride, contiguous last dim.
        padding_idx: None, or an id in [-V, V) (negative counts from the end, as torch). Its tokens
            still read weight[padding_idx] but add nothing to its gradient: dW[padding_idx] = 0.
        validate: check the ids on the host (one device sync) and raise IdRangeError naming
            token_ids, the id and its flat position; with validate=False an out-of-range id gives a
            NaN row and adds nothing to dW (the kernel reads no weight row for it: never another
            row's values, never a read outside weight).

    Returns:
        [*token_ids.shape, H], contiguous. Differentiable w.r.t. weight: dW [V, H] in the weight's
        dtype, each row the fp32 sum of its tokens' gradient rows in ascending token order, rounded
        once (rlk_triton/ops/reduction.py); deterministic, no atomics.
    """
    _check_weight(weight)
    V = weight.shape[0]
    if not isinstance(token_ids, torch.Tensor):
        raise DTypeError("token_ids", f"expected a torch.Tensor, got {type(token_ids).__name__}")
    if token_ids.dtype not in INDEX_DTYPES:
        raise DTypeError("token_ids", f"dtype {token_ids.dtype} is not int32 or int64")
    if token_ids.device != weight.device:
        raise DeviceError("token_ids", f"on {token_ids.device}, weight on {weight.device}")
    pad = NO_PADDING
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or not -V <= padding_idx < V:
            raise InputError("padding_idx", f"must be None or an int in [{-V}, {V}), got {padding_idx!r}")
        pad = padding_idx % V
    flat = token_ids.reshape(-1).contiguous()
    bad = first_id_outside(flat, 0, V) if validate else None  # the one host sync of validation
    if bad is not None:
        raise IdRangeError("token_ids", f"id {bad[1]} at flat position {bad[0]} is outside [0, {V})")
    out = call_embedding_fwd(flat, weight, pad)
    return shaped(out, (*token_ids.shape, weight.shape[1]))


def _check_weight(weight):
    if not isinstance(weight, torch.Tensor):
        raise DTypeError("weight", f"expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in SUPPORTED_DTYPES:
        raise DTypeError("weight", f"dtype {weight.dtype} is not one of bfloat16, float16, float32")
    if weight.dim() != 2:
        raise ShapeError("weight", f"must be [V, H], got {tuple(weight.shape)}")
    if weight.shape[1] > 1 and weight.stride(1) != 1:
        raise LayoutError("weight", f"the hidden dim must be contiguous (stride {weight.stride(1)});"
                          " call .contiguous() first")
    if weight.device.type == "cpu":
        if not _INTERPRETED:
            raise DeviceError("weight", "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before "
                              "importing rlk_triton, or move to CUDA")
    elif weight.device.type != "cuda":
        raise DeviceError("weight", f"unsupported device {weight.device}")
