"""SwiGLU, silu(gate) * up: kernels, launchers, custom ops, public function.

    from rlk_triton.ops.swiglu import swiglu
    y = swiglu(gate, up)                                   # separate projections (HF Llama)
    y = swiglu(gate_up[..., :I], gate_up[..., I:])         # halves of a fused projection, read in place

Semantics (docs/swiglu.md): g, u upcast to fp32; s = 1 / (1 + exp(-g)); y = dtype((g * s) * u), the
one downcast. Backward, fp32 inside, each gradient downcast once:
  d up   = dy * (g * s)
  d gate = (dy * u) * (s * (1 + g * (1 - s)))
Elementwise: one program per (row, tile of BLOCK_I columns); no reduction, so every element is
computed by the same instructions whatever the batch: batch-invariant by construction.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import configs
from .._runtime import arch_of, shaped
from ..errors import DeviceError, DTypeError, LayoutError, ShapeError
from .rmsnorm import SUPPORTED_DTYPES, check_device
from .dispatch import autograd_op, direct
from .launch import cached, cdiv, next_power_of_2

__all__ = ["swiglu"]


@triton.jit
def _sigmoid(g):
    # exp(-g) overflows to inf for g < -88: s = 0 and silu = g * 0 = -0, the right limit
    return 1.0 / (1.0 + tl.exp(-g))


@cached
@triton.jit
def _fwd_kernel(gate_ptr, gate_row_stride, up_ptr, up_row_stride, y_ptr, I, BLOCK_I: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    g = tl.load(gate_ptr + row * gate_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * up_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    y = (g * _sigmoid(g)) * u
    tl.store(y_ptr + row * I + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@cached
@triton.jit
def _bwd_kernel(grad_y_ptr, gate_ptr, gate_row_stride, up_ptr, up_row_stride, dgate_ptr, dup_ptr, I,
                BLOCK_I: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    dy = tl.load(grad_y_ptr + row * I + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + row * gate_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * up_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    s = _sigmoid(g)
    dup = dy * (g * s)
    dgate = (dy * u) * (s * (1.0 + g * (1.0 - s)))
    tl.store(dgate_ptr + row * I + offs, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + row * I + offs, dup.to(dup_ptr.dtype.element_ty), mask=mask)


def _grid_block(kernel: str, t: torch.Tensor, N: int, I: int, cfg=None):
    cfg = cfg or configs.lookup(kernel, arch_of(t.device), t.dtype, I)
    block = min(max(next_power_of_2(I), 16), cfg.block_v)
    return (N, cdiv(I, block)), block, cfg


def launch_forward(gate, up, cfg=None):
    """gate, up: [N, I] with unit stride along I (any row strides). Returns y [N, I] contiguous."""
    N, I = gate.shape
    y = torch.empty((N, I), dtype=gate.dtype, device=gate.device)
    if N == 0 or I == 0:
        return y
    grid, block, cfg = _grid_block("swiglu_fwd", gate, N, I, cfg)
    _fwd_kernel[grid](gate, gate.stride(0), up, up.stride(0), y, I, BLOCK_I=block,
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y


def launch_backward(grad_y, gate, up, cfg=None):
    """grad_y: contiguous [N, I]. Returns (d gate, d up), contiguous [N, I]."""
    N, I = gate.shape
    dgate = torch.empty((N, I), dtype=gate.dtype, device=gate.device)
    dup = torch.empty((N, I), dtype=gate.dtype, device=gate.device)
    if N == 0 or I == 0:
        return dgate, dup
    grid, block, cfg = _grid_block("swiglu_bwd", gate, N, I, cfg)
    _bwd_kernel[grid](grad_y, gate, gate.stride(0), up, up.stride(0), dgate, dup, I, BLOCK_I=block,
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return dgate, dup


# ---- torch.library custom ops: usable under torch.compile, autograd through register_autograd ----

@torch.library.custom_op("rlk_triton::swiglu_fwd", mutates_args=())
def swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return launch_forward(gate, up)


@swiglu_fwd.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("rlk_triton::swiglu_bwd", mutates_args=())
def swiglu_bwd(grad_y: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_backward(grad_y, gate, up)


@swiglu_bwd.register_fake
def _(grad_y, gate, up):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _setup_context(ctx, inputs, output):
    gate, up = inputs
    ctx.save_for_backward(gate, up)


def _backward(ctx, grad_y):
    gate, up = ctx.saved_tensors
    dgate, dup = call_swiglu_bwd(grad_y.contiguous(), gate, up)
    return dgate, dup


call_swiglu_fwd = autograd_op(swiglu_fwd, _backward, _setup_context)
call_swiglu_bwd = direct(swiglu_bwd)


# ---- the public function ----

def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, fused, in fp32 with one downcast to the inputs' dtype.

    Args:
        gate, up: [..., I] of one shape, dtype (bf16 / fp16 / fp32) and device; any leading strides,
            the last dim contiguous (LayoutError otherwise). The two halves of a fused [..., 2I]
            projection are read in place: swiglu(gu[..., :I], gu[..., I:]).

    Returns:
        y [..., I], contiguous, in the inputs' dtype. Differentiable w.r.t. gate and up; the gradients
        come back as separate contiguous tensors in that dtype. Empty shapes (no rows, or I = 0) give
        empty outputs and gradients without a launch. Elementwise: a NaN / inf stays in its element.
    """
    _check(gate, up)
    I = gate.shape[-1]
    N = math.prod(gate.shape[:-1])  # not reshape(-1, I): with I = 0 the -1 could be anything
    g2d, u2d = gate.reshape(N, I), up.reshape(N, I)
    return shaped(call_swiglu_fwd(g2d, u2d), gate.shape)


def _check(gate, up):
    for name, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor):
            raise DTypeError(name, f"expected a torch.Tensor, got {type(t).__name__}")
    if gate.dtype not in SUPPORTED_DTYPES:
        raise DTypeError("gate", f"dtype {gate.dtype} is not one of bfloat16, float16, float32")
    if up.dtype != gate.dtype:
        raise DTypeError("up", f"dtype {up.dtype} differs from gate's {gate.dtype}")
    if gate.dim() < 1:
        raise ShapeError("gate", "needs a feature dim: shape [..., I]")
    if up.shape != gate.shape:
        raise ShapeError("up", f"shape {tuple(up.shape)} does not match gate's {tuple(gate.shape)}")
    if up.device != gate.device:
        raise DeviceError("up", f"on {up.device}, gate on {gate.device}")
    check_device("gate", gate)
    for name, t in (("gate", gate), ("up", up)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise LayoutError(name, f"the last dim must be contiguous (stride {t.stride(-1)}); call .contiguous()")
