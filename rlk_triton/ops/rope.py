"""Rotary position embedding (RoPE): tables, kernel, launcher, custom ops and the public API.

    from rlk_triton.ops.rope import apply_rope, rope_position_ids, rope_tables
    cos, sin = rope_tables(8192, 128, base=500000.0)              # fp32 [8192, 64] each
    pos = rope_position_ids(cu_seqlens, offsets=cache_lens)         # int64 [tokens]
    q_rot, k_rot = apply_rope(q, k, cos, sin, pos)                  # [T, H, D], [T, Hkv, D]

A token's result is a function of its own q / k values, its position id and the tables only: the
kernel is elementwise over (token, head) rows, so prefill, a decode step with a cache offset and a
packed varlen batch give the same bits for the same (values, position) (docs/rope.md).

Kernel: one program per block of BLOCK_R (token, head) rows of q, then of k (one launch). Per
rotated pair (x1, x2) at angle a (cos c, sin s from the fp32 tables), in fp32:
  y1 = fma(x1, c, -(x2 * s)),   y2 = fma(x2, c, x1 * s)
then rounded once to the input dtype.
Backward: the inverse rotation (angle -a), the same kernel with s negated (exact in fp32).
Pairs: half rotation (GPT-NeoX / Llama) pairs element i with i + R/2; interleaved (GPT-J) pairs
2i with 2i + 1. Dims past the rotary dim R are copied unchanged (partial rotary).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of, as_device, first_id_outside, interpreter_active, shaped
from ..errors import DeviceError, DTypeError, IdRangeError, InputError, LayoutError, ShapeError
from .dispatch import autograd_op, direct
from .launch import SLOT, Template, cached, cdiv, next_power_of_2, planned

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
SCALING_TYPES = ("linear", "llama3", "ntk")

# Triton decides interpreted-or-compiled when it decorates the kernels, which happened on import.
_INTERPRETED = interpreter_active()

__all__ = ["apply_rope", "rope_tables", "rope_inv_freq", "rope_position_ids"]


@triton.jit
def _rotate_block(x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr, block, n_rows, heads, stride_t, stride_h,
                  n_positions, HALF: tl.constexpr, D: tl.constexpr, HALF_PAD: tl.constexpr,
                  PASS_PAD: tl.constexpr, INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr,
                  BLOCK_R: tl.constexpr):
    rows = block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    tok = rows // heads
    head = rows % heads
    pos = tl.load(pos_ptr + tok, mask=row_ok, other=0).to(tl.int64)
    pos_ok = (pos >= 0) & (pos < n_positions)
    pos = tl.where(pos_ok, pos, 0)  # never read outside the tables (validate=False)
    i = tl.arange(0, HALF_PAD)
    m = row_ok[:, None] & (i < HALF)[None, :]
    table = pos[:, None] * HALF + i[None, :]
    # a bad position reads no table entry at all (position 0 does not exist in an empty table);
    # its outputs are NaN below. A valid position's mask is m itself.
    m_table = m & pos_ok[:, None]
    c = tl.load(cos_ptr + table, mask=m_table, other=0.0)
    s = tl.load(sin_ptr + table, mask=m_table, other=0.0)
    if INVERSE:
        s = -s
    if INTERLEAVED:
        o1 = 2 * i
        o2 = 2 * i + 1
    else:
        o1 = i
        o2 = i + HALF
    src = x_ptr + (tok * stride_t + head * stride_h)[:, None]
    x1 = tl.load(src + o1[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + o2[None, :], mask=m, other=0.0).to(tl.float32)
    # explicit FMAs: the compiler has no contraction choice left, so every build and specialization
    # (and the interpreter, whose fma rounds once too) computes the same two roundings per output
    y1 = tl.fma(x1, c, -(x2 * s))
    y2 = tl.fma(x2, c, x1 * s)
    # an out-of-table position (validate=False) gives NaN, never another position's rotation
    bad = (~pos_ok)[:, None]
    y1 = tl.where(bad, float("nan"), y1)
    y2 = tl.where(bad, float("nan"), y2)
    dst = out_ptr + (rows * D)[:, None]
    out_ty = out_ptr.dtype.element_ty
    tl.store(dst + o1[None, :], y1.to(out_ty), mask=m)  # the one downcast
    tl.store(dst + o2[None, :], y2.to(out_ty), mask=m)
    if PASS_PAD > 0:  # partial rotary: the dims past 2 * HALF are copied bit for bit
        j = 2 * HALF + tl.arange(0, PASS_PAD)
        mp = row_ok[:, None] & (j < D)[None, :]
        tl.store(dst + j[None, :], tl.load(src + j[None, :], mask=mp), mask=mp)


@cached
@triton.jit(do_not_specialize=["q_rows", "k_rows", "q_blocks"])
def _rope_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, cos_ptr, sin_ptr,
                 q_rows, k_rows, q_heads, k_heads, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
                 n_positions, q_blocks,
                 HALF: tl.constexpr, D: tl.constexpr, HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr,
                 INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    if pid < q_blocks:
        _rotate_block(q_ptr, q_out_ptr, pos_ptr, cos_ptr, sin_ptr, pid, q_rows, q_heads, q_stride_t,
                      q_stride_h, n_positions, HALF, D, HALF_PAD, PASS_PAD, INTERLEAVED, INVERSE, BLOCK_R)
    else:
        _rotate_block(k_ptr, k_out_ptr, pos_ptr, cos_ptr, sin_ptr, pid - q_blocks, k_rows, k_heads, k_stride_t,
                      k_stride_h, n_positions, HALF, D, HALF_PAD, PASS_PAD, INTERLEAVED, INVERSE, BLOCK_R)


def launch(q, k, cos, sin, position_ids, interleaved: bool, inverse: bool):
    """Rotates q [T, H, D] and k [T, Hk, D] (or None) by the angles of position_ids [T].

    q / k may have any token and head strides (a view into a fused qkv buffer); the last dim is
    contiguous. Returns contiguous (q_out, k_out); k_out is an empty tensor when k is None.
    """
    T, H, D = q.shape
    if not position_ids.is_contiguous():  # the kernel reads position ids densely
        position_ids = position_ids.contiguous()
    q_out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape if k is not None else (0,), dtype=q.dtype, device=q.device)
    q_rows = T * H
    k_rows = k.shape[0] * k.shape[1] if k is not None else 0
    if q_rows + k_rows == 0 or D == 0:
        return q_out, k_out
    key = (H, D, q.stride(), k.shape[1:] if k is not None else None, k.stride() if k is not None else None,
           cos.shape, q.dtype, q.device, interleaved, inverse)
    block, template = planned(_PLANS, key, _plan, q, k, cos, interleaved, inverse)
    q_blocks = cdiv(q_rows, block)
    kk = k if k is not None else q
    template((q_blocks + cdiv(k_rows, block),), q, kk, q_out, k_out if k is not None else q_out, position_ids, cos,
             sin, q_rows, k_rows, q_blocks)
    return q_out, k_out


_PLANS = configs.plan_store()  # launch's (rows per block, Template) per key (launch.planned)


def _plan(q, k, cos, interleaved: bool, inverse: bool):
    """(rows per block, Template) of the rotation for q's and k's heads, head dim and strides, the
    tables' shape, the dtype, device and flags. SLOTs: the tensors, the row counts and q's blocks."""
    H, D = q.shape[1], q.shape[2]
    half = cos.shape[1]
    cfg = configs.lookup("rope", arch_of(q.device), q.dtype, D)
    kk = k if k is not None else q
    return cfg.block_v, Template(
        _rope_kernel,
        (SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, SLOT, H, kk.shape[1], q.stride(0), q.stride(1),
         kk.stride(0), kk.stride(1), cos.shape[0], SLOT),
        dict(HALF=half, D=D, HALF_PAD=next_power_of_2(max(half, 1)),
             PASS_PAD=next_power_of_2(D - 2 * half) if D > 2 * half else 0,
             INTERLEAVED=interleaved, INVERSE=inverse, BLOCK_R=cfg.block_v,
             num_warps=cfg.num_warps, num_stages=cfg.num_stages))


# ---- torch.library custom ops: usable under torch.compile, autograd through register_autograd ----

@torch.library.custom_op("rlk_triton::rope_fwd", mutates_args=())
def rope_fwd(q: torch.Tensor, k: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
             position_ids: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(q, k, cos, sin, position_ids, interleaved, inverse=False)


@rope_fwd.register_fake
def _(q, k, cos, sin, position_ids, interleaved):
    return q.new_empty(q.shape), q.new_empty(k.shape if k is not None else (0,))


@torch.library.custom_op("rlk_triton::rope_bwd", mutates_args=())
def rope_bwd(grad_q: torch.Tensor, grad_k: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
             position_ids: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(grad_q, grad_k, cos, sin, position_ids, interleaved, inverse=True)


@rope_bwd.register_fake
def _(grad_q, grad_k, cos, sin, position_ids, interleaved):
    return grad_q.new_empty(grad_q.shape), grad_q.new_empty(grad_k.shape if grad_k is not None else (0,))


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, position_ids, interleaved = inputs
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.interleaved = interleaved
    ctx.q_shape = tuple(q.shape)
    ctx.k_shape = tuple(k.shape) if k is not None else None


def _last_dim_contiguous(g):
    return g if g.stride(-1) == 1 else g.contiguous()


def _backward(ctx, grad_q_out, grad_k_out):
    cos, sin, position_ids = ctx.saved_tensors
    has_k = ctx.k_shape is not None
    if grad_q_out is None and (not has_k or grad_k_out is None):
        return None, None, None, None, None, None
    # a missing upstream gradient is a zero one: rotating zeros gives zeros
    gq = grad_q_out if grad_q_out is not None else cos.new_zeros(ctx.q_shape, dtype=grad_k_out.dtype)
    gk = None
    if has_k:
        gk = grad_k_out if grad_k_out is not None else gq.new_zeros(ctx.k_shape)
        gk = _last_dim_contiguous(gk)
    dq, dk = call_rope_bwd(_last_dim_contiguous(gq), gk, cos, sin, position_ids, ctx.interleaved)
    return dq, (dk if has_k else None), None, None, None, None


call_rope_fwd = autograd_op(rope_fwd, _backward, _setup_context)
call_rope_bwd = direct(rope_bwd)


# ---- tables ----

def rope_inv_freq(rotary_dim: int, base: float = 10000.0, scaling: Optional[dict] = None) -> np.ndarray:
    """The rotation frequencies theta_i (radians per position), float64 [rotary_dim // 2].

    theta_i = base^(-2i / R), then the scaling:
      None                                           unscaled
      {"type": "linear", "factor": f}                theta_i / f  (positions divided by f)
      {"type": "ntk", "factor": a}                   static NTK-aware: base * a^(R / (R - 2))
      {"type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
       "original_max_position_embeddings"}          Llama 3.1's band-wise rule (as transformers)
    "rope_type" is accepted for "type". Length-dependent schemes (dynamic NTK, YaRN's attention
    factor) are not supported: a token's rotation would then depend on its batch.
    """
    R = _check_rotary_dim(rotary_dim)
    base = _check_positive("base", base)
    kind, params = _check_scaling(scaling)
    if kind == "ntk":
        base = base * params["factor"] ** (R / (R - 2)) if R > 2 else base
    inv = 1.0 / base ** (np.arange(0, R, 2, dtype=np.float64) / R)
    if kind == "linear":
        inv = inv / params["factor"]
    elif kind == "llama3":
        f, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        wavelen = 2.0 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = (1.0 - smooth) * inv / f + smooth * inv
        inv = np.where(wavelen > old / lo, inv / f, np.where(wavelen < old / hi, inv, medium))
    return inv


def rope_tables(max_positions: int, rotary_dim: int, *, base: float = 10000.0, scaling: Optional[dict] = None,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin): float32 [max_positions, rotary_dim // 2], row p = position p.

    Computed on the host in float64, angle_pi = p * theta_i (rope_inv_freq), cos / sin in float64,
    then rounded once to fp32 (round to nearest even) and copied to `device`. Every entry is the
    float64 value correctly rounded, up to the float64 rounding of the angle (about p * 1e-16 rad):
    the tables are the same bits on every machine and device.
    """
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 0:
        raise InputError("max_positions", f"must be an int >= 0, got {max_positions!r}")
    device = as_device(device) if device is not None else None
    inv = rope_inv_freq(rotary_dim, base, scaling)
    angle = np.arange(max_positions, dtype=np.float64)[:, None] * inv[None, :]
    cos = torch.from_numpy(np.cos(angle).astype(np.float32))
    sin = torch.from_numpy(np.sin(angle).astype(np.float32))
    return cos.to(device) if device is not None else cos, sin.to(device) if device is not None else sin


def rope_position_ids(cu_seqlens: torch.Tensor, offsets: Optional[torch.Tensor] = None, *,
                      num_tokens: Optional[int] = None, validate: bool = True) -> torch.Tensor:
    """Position ids int64 [num_tokens] of a packed batch: token j of sequence s is at offsets[s] + j.

    cu_seqlens: int [S + 1], 0 = cu_seqlens[0] <= ... <= cu_seqlens[S] = num_tokens (flash-attn's
    varlen convention). offsets: int [S], the position of each sequence's first token (its KV-cache
    length in a decode or chunked-prefill step); None = 0. num_tokens: cu_seqlens[-1], given to avoid
    the host sync that reading it costs. validate checks the convention (one host sync); with
    validate=False only the sizes are checked (num_tokens an int >= 0, cu_seqlens[-1] >= 0) and a
    broken cu_seqlens gives undefined positions, never an index outside cu_seqlens / offsets.
    cu_seqlens and offsets may be strided views.
    Prefill of one sequence: cu_seqlens [0, T]; a decode step of S sequences: cu_seqlens
    [0, 1, ..., S] with offsets = the cache lengths.
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ShapeError("cu_seqlens", "must be a 1-D tensor [num_sequences + 1]")
    if cu_seqlens.dtype not in INDEX_DTYPES:
        raise DTypeError("cu_seqlens", f"dtype {cu_seqlens.dtype} is not int32 or int64")
    S = cu_seqlens.numel() - 1
    dev = cu_seqlens.device
    cu = cu_seqlens.long().contiguous()
    if offsets is not None:
        if not isinstance(offsets, torch.Tensor) or tuple(offsets.shape) != (S,):
            raise ShapeError("offsets", f"must be a tensor of shape ({S},), one offset per sequence")
        if offsets.dtype not in INDEX_DTYPES:
            raise DTypeError("offsets", f"dtype {offsets.dtype} is not int32 or int64")
        if offsets.device != dev:
            raise DeviceError("offsets", f"on {offsets.device}, cu_seqlens on {dev}")
    if num_tokens is not None and (isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral)
                                   or num_tokens < 0):
        raise InputError("num_tokens", f"must be None or an int >= 0, got {num_tokens!r}")
    if validate and S >= 0:
        lengths = cu[1:] - cu[:-1]
        if int(cu[0]) != 0 or bool((lengths < 0).any()):
            raise ShapeError("cu_seqlens", "must start at 0 and be non-decreasing")
        if offsets is not None and bool((offsets < 0).any()):
            raise IdRangeError("offsets", "offsets must be >= 0")
        if num_tokens is not None and int(cu[-1]) != num_tokens:
            raise ShapeError("num_tokens", f"{num_tokens} != cu_seqlens[-1] = {int(cu[-1])}")
    n = int(cu[-1]) if num_tokens is None else int(num_tokens)
    if n < 0:  # only unvalidated: a negative cu_seqlens[-1] sizes nothing
        raise ShapeError("cu_seqlens", f"cu_seqlens[-1] = {n} is negative")
    tok = torch.arange(n, device=dev)
    if S == 0:
        return tok
    seq = torch.searchsorted(cu[1:], tok, right=True).clamp_max(S - 1)
    pos = tok - cu[seq]
    if offsets is not None:
        pos = pos + offsets.long()[seq]
    return pos


# ---- the public op ----

def apply_rope(q: torch.Tensor, k: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
               position_ids: torch.Tensor, *, interleaved: bool = False, validate: bool = True):
    """Rotates q and k by the angles of their tokens' positions. Returns (q_rot, k_rot).

    Args:
        q: [..., H, D] bf16 / fp16 / fp32, e.g. [T, H, D] (packed tokens) or [B, T, H, D]. Any
            strides on the leading and head dims (a view into a fused qkv buffer is read in place);
            the last dim must be contiguous.
        k: [..., Hk, D] with the same leading shape, D and dtype, or None (then k_rot is None).
        cos, sin: float32 [P, R / 2] from rope_tables (row p = position p); R <= D is the rotary dim.
        position_ids: int32 / int64 with shape q.shape[:-2]: each token's position, in [0, P).
            Build them for packed / decode batches with rope_position_ids.
        interleaved: False pairs dim i with i + R/2 (GPT-NeoX / Llama, "rotate_half"); True pairs
            2i with 2i + 1 (GPT-J).
        validate: check position ids on the host (one device sync); with validate=False an
            out-of-table position (negative, >= P, or any position of an empty table) gives NaN in
            that token's rotated dims and reads no table entry: never another position's rotation,
            never a read outside the tables. A strided position_ids gives its contiguous copy's bits.

    Returns:
        q_rot, k_rot: new contiguous tensors in the input dtype, shapes of q and k. fp32 arithmetic,
        one rounding to the input dtype at the store; dims past R copied unchanged.
        Differentiable w.r.t. q and k (the backward is the inverse rotation); the tables and
        position ids are not differentiated.
    """
    if _packed_and_valid(q, k, cos, sin, position_ids):  # the common case in one pass (host time)
        q3, k3, flat_pos = q, k, position_ids if position_ids.is_contiguous() else position_ids.contiguous()
    else:
        q3, k3, flat_pos = _checked(q, k, cos, sin, position_ids)
    bad = first_id_outside(flat_pos, 0, cos.shape[0]) if validate else None  # the one host sync of validation
    if bad is not None:
        raise IdRangeError("position_ids", f"position {bad[1]} at flat position {bad[0]} is outside "
                           f"the tables [0, {cos.shape[0]})")
    q_rot, k_rot = call_rope_fwd(q3, k3, cos.contiguous(), sin.contiguous(), flat_pos, bool(interleaved))
    return shaped(q_rot, q.shape), (shaped(k_rot, k.shape) if k is not None else None)


# ---- validation: typed errors that name the argument ----

def _packed_and_valid(q, k, cos, sin, position_ids) -> bool:
    """Packed tokens (q, k [T, heads, D], position_ids [T]) that pass every check of _checked: what a
    decode step passes, checked with fewer calls. False sends the call through _checked, which raises
    the typed error or passes (other layouts)."""
    return (isinstance(q, torch.Tensor) and q.dim() == 3 and q.dtype in SUPPORTED_DTYPES
            and (q.stride(2) == 1 or q.shape[2] <= 1) and (q.is_cuda or (q.is_cpu and _INTERPRETED))
            and (k is None or (isinstance(k, torch.Tensor) and k.dim() == 3 and k.dtype == q.dtype
                               and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2]
                               and (k.stride(2) == 1 or k.shape[2] <= 1) and k.device == q.device))
            and isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.dtype == torch.float32
            and sin.dtype == torch.float32 and cos.dim() == 2 and cos.shape == sin.shape
            and 2 * cos.shape[1] <= q.shape[2] and cos.device == q.device and sin.device == q.device
            and isinstance(position_ids, torch.Tensor) and position_ids.dtype in INDEX_DTYPES
            and position_ids.dim() == 1 and position_ids.shape[0] == q.shape[0] and position_ids.device == q.device)


def _checked(q, k, cos, sin, position_ids):
    """apply_rope's argument checks, each with its typed error naming the argument. Returns q and k
    as [tokens, heads, D] (views where the strides allow) and the position ids flat and dense."""
    q3, lead = _check_heads("q", q, None, None)
    k3 = None
    if k is not None:
        k3, _ = _check_heads("k", k, q, lead)
    half = _check_tables(cos, sin, q)
    if 2 * half > q.shape[-1]:
        raise ShapeError("cos", f"rotary dim {2 * half} (2 x cos.shape[1]) exceeds head_dim {q.shape[-1]}")
    if not isinstance(position_ids, torch.Tensor):
        raise DTypeError("position_ids", f"expected a torch.Tensor, got {type(position_ids).__name__}")
    if position_ids.dtype not in INDEX_DTYPES:
        raise DTypeError("position_ids", f"dtype {position_ids.dtype} is not int32 or int64")
    if tuple(position_ids.shape) != lead:
        raise ShapeError("position_ids", f"shape {tuple(position_ids.shape)} does not match the tokens {lead}"
                         f" (q {tuple(q.shape)})")
    if position_ids.device != q.device:
        raise DeviceError("position_ids", f"on {position_ids.device}, q on {q.device}")
    return q3, k3, position_ids.reshape(-1).contiguous()


def _check_heads(name, x, q, lead):
    """x as a 3-D [tokens, heads, D] tensor (a view when the strides allow), and its leading shape."""
    if not isinstance(x, torch.Tensor):
        raise DTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise DTypeError(name, f"dtype {x.dtype} is not one of bfloat16, float16, float32")
    if x.dim() < 3:
        raise ShapeError(name, f"needs shape [..., heads, head_dim] with at least one token dim, got {tuple(x.shape)}")
    if q is not None:
        if x.dtype != q.dtype:
            raise DTypeError(name, f"dtype {x.dtype} differs from q's {q.dtype}")
        if tuple(x.shape[:-2]) != lead or x.shape[-1] != q.shape[-1]:
            raise ShapeError(name, f"shape {tuple(x.shape)} must be [{', '.join(map(str, lead))}, heads, "
                             f"{q.shape[-1]}] to match q {tuple(q.shape)}")
        if x.device != q.device:
            raise DeviceError(name, f"on {x.device}, q on {q.device}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise LayoutError(name, f"the head_dim must be contiguous (stride {x.stride(-1)}); call .contiguous() first")
    if x.device.type == "cpu":
        if not _INTERPRETED:
            raise DeviceError(name, "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before "
                              "importing rlk_triton, or move to CUDA")
    elif x.device.type != "cuda":
        raise DeviceError(name, f"unsupported device {x.device}")
    head_lead = tuple(x.shape[:-2])
    if x.dim() == 3:
        return x, head_lead
    shape3 = (math.prod(head_lead), x.shape[-2], x.shape[-1])  # not -1: a 0-element x has no inferable dim
    try:
        x3 = x.view(shape3)
    except RuntimeError:
        x3 = x.reshape(shape3)
    return x3, head_lead


def _check_tables(cos, sin, q) -> int:
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise DTypeError(name, f"expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise DTypeError(name, f"dtype {t.dtype}: the tables are float32 (rope_tables)")
        if t.dim() != 2:
            raise ShapeError(name, f"must be [positions, rotary_dim / 2], got {tuple(t.shape)}")
        if t.device != q.device:
            raise DeviceError(name, f"on {t.device}, q on {q.device}")
    if cos.shape != sin.shape:
        raise ShapeError("sin", f"shape {tuple(sin.shape)} differs from cos {tuple(cos.shape)}")
    return cos.shape[1]


def _check_rotary_dim(rotary_dim) -> int:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2:
        raise InputError("rotary_dim", f"must be an even int >= 2, got {rotary_dim!r}")
    return rotary_dim


def _check_positive(name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InputError(name, f"must be a finite number > 0, got {v!r}")
    return float(v)


def _check_scaling(scaling):
    if scaling is None:
        return None, {}
    if not isinstance(scaling, dict):
        raise InputError("scaling", f"expected None or a dict, got {type(scaling).__name__}")
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind in (None, "default"):
        return None, {}
    if kind not in SCALING_TYPES:
        raise InputError("scaling", f"unsupported type {kind!r} (supported: {', '.join(SCALING_TYPES)}; "
                         "length-dependent schemes such as dynamic NTK would make a token's rotation depend on "
                         "its batch)")
    need = {"linear": ("factor",), "ntk": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}[kind]
    params = {}
    for key in need:
        if key not in scaling:
            raise InputError("scaling", f"{kind} scaling needs {key!r}")
        params[key] = _check_positive(f"scaling.{key}", scaling[key])
    if kind == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
        raise InputError("scaling", "llama3 scaling needs high_freq_factor > low_freq_factor")
    return kind, params
