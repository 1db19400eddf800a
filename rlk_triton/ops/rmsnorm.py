"""RMSNorm with an optional fused residual add: kernels, launchers, custom ops, public function.

    from rlk_triton.ops.rmsnorm import rms_norm
    y = rms_norm(x, weight, eps=1e-6)                                   # Llama-style
    y = rms_norm(x, weight, eps=1e-6, weight_offset=1.0)                # Gemma's (1 + w)
    y, residual = rms_norm(x, weight, residual=residual)                # fused add (vLLM / Liger)

Semantics (fp32 inside, two documented downcast points; docs/rmsnorm.md):
  h = x                                    without residual
  h = dtype(fp32(x) + fp32(residual))      with residual: downcast 1, returned as the next residual
  rstd = 1 / sqrt(sum_j h_j^2 / H + eps)   fp32, IEEE-rounded div and sqrt, the sum in the order of
                                           reduction.py (lanes over tiles, then one fixed tree)
  y = dtype((h * rstd) * (w + weight_offset))   fp32 products, downcast 2 (one rounding)
The normalization reads the downcast h, so the fused op equals rms_norm(residual_out) bitwise.

Forward: configs "rmsnorm_fwd_rows" rows per program. 1: _fwd_kernel, one row per program (a loop
over tiles for rows wider than one tile). > 1: _fwd_rows_kernel, a [rows, H] tile per program, for
rows that fit one tile (locked at 2 for bf16 / fp16 with 1024 < H <= 8192, from an H200 sweep; an earlier
multi-row loop with the next row prefetched was slower). Both store rstd per row for the backward,
except on a call that records no graph (STORE_RSTD off: y's bits are the same).
Backward: one program per block of R rows (configs "rmsnorm_dw_rows"): per row, dx from the saved
rstd and a row dot product (no cross-row state), and the block's dW terms summed in row order into
an fp32 partial row; a second kernel reduces the partials in a fixed order (reduction.py). No
atomics: dx is batch-invariant per row, dW is run-to-run deterministic.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import configs, native
from .._runtime import arch_of, interpreter_active, shaped
from ..errors import BackendError, DeviceError, DTypeError, InputError, LayoutError, ShapeError
from .reduction import fold_products
from .dispatch import IMPL, autograd_op, direct, route, wants_grad
from .launch import SLOT, Template, cached, cdiv, next_power_of_2, planned

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INTERPRETED = interpreter_active()

__all__ = ["rms_norm"]


@triton.jit
def _rstd(sum_of_squares, h_count, eps):
    """1 / sqrt(mean + eps) with IEEE-rounded division and square root (GPU defaults are approximate)."""
    return tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(sum_of_squares, h_count) + eps))


@cached
@triton.jit(do_not_specialize=["h_count", "eps", "weight_offset"])
def _fwd_kernel(
    x_ptr, x_row_stride, res_ptr, res_row_stride, w_ptr,
    y_ptr, res_out_ptr, rstd_ptr,
    H, h_count, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, ONE_TILE: tl.constexpr, STORE_RSTD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    res_row = res_ptr + row * res_row_stride
    out_row = row * H  # y and residual_out are contiguous
    lanes = tl.arange(0, BLOCK_H)
    if ONE_TILE:  # the whole row stays in registers
        mask = lanes < H
        h = tl.load(x_row + lanes, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_row + lanes, mask=mask, other=0.0).to(tl.float32)
            h_low = (h + r).to(res_out_ptr.dtype.element_ty)  # downcast 1
            tl.store(res_out_ptr + out_row + lanes, h_low, mask=mask)
            h = h_low.to(tl.float32)
        rstd = _rstd(tl.sum(fold_products(tl.zeros((BLOCK_H,), tl.float32), h, h), 0), h_count, eps)
        w = tl.load(w_ptr + lanes, mask=mask, other=0.0).to(tl.float32) + weight_offset
        y = (h * rstd) * w
        tl.store(y_ptr + out_row + lanes, y.to(y_ptr.dtype.element_ty), mask=mask)  # downcast 2
    else:  # two passes over the tiles; the second re-reads h (the stored residual_out if fused)
        acc = tl.zeros((BLOCK_H,), tl.float32)
        for tile in range(0, tl.cdiv(H, BLOCK_H)):
            offs = tile * BLOCK_H + lanes
            mask = offs < H
            h = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(res_row + offs, mask=mask, other=0.0).to(tl.float32)
                h_low = (h + r).to(res_out_ptr.dtype.element_ty)
                tl.store(res_out_ptr + out_row + offs, h_low, mask=mask)
                h = h_low.to(tl.float32)
            acc = fold_products(acc, h, h)
        rstd = _rstd(tl.sum(acc, 0), h_count, eps)
        for tile in range(0, tl.cdiv(H, BLOCK_H)):
            offs = tile * BLOCK_H + lanes
            mask = offs < H
            if HAS_RESIDUAL:
                h = tl.load(res_out_ptr + out_row + offs, mask=mask, other=0.0).to(tl.float32)
            else:
                h = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + weight_offset
            y = (h * rstd) * w
            tl.store(y_ptr + out_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_RSTD:  # off for a call that records no graph: nothing will read it
        tl.store(rstd_ptr + row, rstd)


@cached
@triton.jit(do_not_specialize=["N", "h_count", "eps", "weight_offset"])
def _fwd_rows_kernel(
    x_ptr, x_row_stride, res_ptr, res_row_stride, w_ptr,
    y_ptr, res_out_ptr, rstd_ptr,
    N, H, h_count, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, STORE_RSTD: tl.constexpr,
):
    # _fwd_kernel's one-tile math on a [ROWS, BLOCK_H] tile of consecutive rows (configs
    # "rmsnorm_fwd_rows" > 1): the sum of squares of a row is the same lane fold, then a tl.sum tree
    # along the row; each row of the tile gets the same tree, so rows stay batch-invariant (whether
    # the tree equals the 1-row kernel's is the compiler's layout choice: not claimed).
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, BLOCK_H)
    row_ok = rows < N
    h_ok = lanes < H
    mask = row_ok[:, None] & h_ok[None, :]
    h = tl.load(x_ptr + rows[:, None] * x_row_stride + lanes[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows[:, None] * res_row_stride + lanes[None, :], mask=mask, other=0.0)
        h_low = (h + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)  # downcast 1
        tl.store(res_out_ptr + rows[:, None] * H + lanes[None, :], h_low, mask=mask)
        h = h_low.to(tl.float32)
    rstd = _rstd(tl.sum(fold_products(tl.zeros((ROWS, BLOCK_H), tl.float32), h, h), 1), h_count, eps)
    w = tl.load(w_ptr + lanes, mask=h_ok, other=0.0).to(tl.float32) + weight_offset
    y = (h * rstd[:, None]) * w[None, :]
    tl.store(y_ptr + rows[:, None] * H + lanes[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)  # downcast 2
    if STORE_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@cached
@triton.jit(do_not_specialize=["N", "h_count", "weight_offset"])
def _bwd_kernel(
    grad_y_ptr, grad_res_ptr, h_ptr, h_row_stride, w_ptr, rstd_ptr,
    dx_ptr, dres_ptr, partial_ptr,
    N, H, h_count, weight_offset,
    HAS_GRAD_RES: tl.constexpr, WITH_DW: tl.constexpr, WITH_DRES: tl.constexpr, ROWS_PER_BLOCK: tl.constexpr,
    BLOCK_H: tl.constexpr, ONE_TILE: tl.constexpr,
):
    # d h_j = rstd * (g_j w_j - xhat_j * c),  c = sum_k g_k w_k xhat_k / H,  xhat = h * rstd;
    # dx = d h (+ the residual_out gradient); dW = sum over rows of g * xhat.
    block = tl.program_id(0).to(tl.int64)
    row_start = block * ROWS_PER_BLOCK  # int64 bounds: the row loop's offsets never overflow
    row_end = tl.minimum(row_start + ROWS_PER_BLOCK, N)
    part_row = partial_ptr + block * H
    lanes = tl.arange(0, BLOCK_H)
    if ONE_TILE:
        mask = lanes < H
        w = tl.load(w_ptr + lanes, mask=mask, other=0.0).to(tl.float32) + weight_offset
        dw = tl.zeros((BLOCK_H,), tl.float32)
        h_next = tl.load(h_ptr + row_start * h_row_stride + lanes, mask=mask, other=0.0)
        g_next = tl.load(grad_y_ptr + row_start * H + lanes, mask=mask, other=0.0)
        gr_next = g_next
        if HAS_GRAD_RES:
            gr_next = tl.load(grad_res_ptr + row_start * H + lanes, mask=mask, other=0.0)
        for row in range(row_start, row_end):  # the block's rows in increasing order
            h = h_next.to(tl.float32)
            g = g_next.to(tl.float32)
            gr = gr_next
            # issue the next row's loads before this row's reduction (the last one re-reads a row)
            nxt = tl.minimum(row + 1, row_end - 1)
            h_next = tl.load(h_ptr + nxt * h_row_stride + lanes, mask=mask, other=0.0)
            g_next = tl.load(grad_y_ptr + nxt * H + lanes, mask=mask, other=0.0)
            if HAS_GRAD_RES:
                gr_next = tl.load(grad_res_ptr + nxt * H + lanes, mask=mask, other=0.0)
            rstd = tl.load(rstd_ptr + row)
            xhat = h * rstd
            gw = g * w
            c = tl.div_rn(tl.sum(fold_products(tl.zeros((BLOCK_H,), tl.float32), gw, xhat), 0), h_count)
            dh = (gw - xhat * c) * rstd
            if HAS_GRAD_RES:
                dh = dh + gr.to(tl.float32)
            tl.store(dx_ptr + row * H + lanes, dh.to(dx_ptr.dtype.element_ty), mask=mask)
            if WITH_DRES:
                tl.store(dres_ptr + row * H + lanes, dh.to(dx_ptr.dtype.element_ty), mask=mask)
            if WITH_DW:
                dw = fold_products(dw, g, xhat)
        if WITH_DW:
            tl.store(part_row + lanes, dw, mask=mask)
    else:  # the partial row (zeroed by the launcher) accumulates in memory, owned by this program
        for row in range(row_start, row_end):
            rstd = tl.load(rstd_ptr + row)
            acc = tl.zeros((BLOCK_H,), tl.float32)
            for tile in range(0, tl.cdiv(H, BLOCK_H)):
                offs = tile * BLOCK_H + lanes
                mask = offs < H
                h = tl.load(h_ptr + row * h_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(grad_y_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + weight_offset
                acc = fold_products(acc, g * w, h * rstd)
            c = tl.div_rn(tl.sum(acc, 0), h_count)
            for tile in range(0, tl.cdiv(H, BLOCK_H)):
                offs = tile * BLOCK_H + lanes
                mask = offs < H
                h = tl.load(h_ptr + row * h_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(grad_y_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + weight_offset
                xhat = h * rstd
                dh = (g * w - xhat * c) * rstd
                if HAS_GRAD_RES:
                    dh = dh + tl.load(grad_res_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + row * H + offs, dh.to(dx_ptr.dtype.element_ty), mask=mask)
                if WITH_DRES:
                    tl.store(dres_ptr + row * H + offs, dh.to(dx_ptr.dtype.element_ty), mask=mask)
                if WITH_DW:
                    p = tl.load(part_row + offs, mask=mask, other=0.0)
                    tl.store(part_row + offs, fold_products(p, g, xhat), mask=mask)


@cached
@triton.jit
def _dw_reduce_kernel(partial_ptr, dw_ptr, n_blocks, H, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < H
    lanes = tl.arange(0, BLOCK_B)
    acc = tl.zeros((BLOCK_B, BLOCK_C), tl.float32)
    for group in range(0, tl.cdiv(n_blocks, BLOCK_B)):  # lane b: blocks b, b + BLOCK_B, ... ascending
        blocks = group * BLOCK_B + lanes
        mask = (blocks < n_blocks)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + blocks.to(tl.int64)[:, None] * H + cols[None, :], mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc, 0).to(dw_ptr.dtype.element_ty), mask=col_mask)


# ---- launchers ----

def _cfg(kernel: str, x: torch.Tensor, H: int) -> configs.LaunchConfig:
    return configs.lookup(kernel, arch_of(x.device), x.dtype, H)


def hidden_tile(cfg: configs.LaunchConfig, H: int) -> int:
    """The tile over the hidden dim: a function of H and the locked config only (at least 16 lanes:
    masked lanes add exact zeros, and tiny tiles are avoided on the GPU)."""
    return min(max(next_power_of_2(H), 16), cfg.block_v)


def launch_forward(x, weight, residual, eps, weight_offset, cfg=None, rows_per_program=None, with_rstd=True):
    """x, residual: [N, H] with unit stride along H. Returns (y, residual_out or [0], rstd fp32 [N]).
    with_rstd=False (a call that records no graph): rstd is neither allocated nor stored, and None
    is returned in its place and, without the residual, in residual_out's; y and residual_out are the
    same bits (only the store is compiled out: test_rmsnorm's no-grad test). cfg / rows_per_program
    override the locked table (benchmark sweeps only)."""
    N, H = x.shape
    has_res = residual is not None
    y = torch.empty((N, H), dtype=x.dtype, device=x.device)
    if has_res:
        res_out = torch.empty((N, H), dtype=x.dtype, device=x.device)
    else:
        res_out = torch.empty((0,), dtype=x.dtype, device=x.device) if with_rstd else None
    rstd = torch.empty(N, dtype=torch.float32, device=x.device) if with_rstd else None
    if N == 0:
        return y, res_out, rstd
    key = (H, x.stride(0), residual.stride(0) if has_res else None, x.dtype, x.device, cfg, rows_per_program,
           with_rstd)
    rows, template = planned(_FORWARD_PLANS, key, _forward_plan, x, residual, cfg, rows_per_program, with_rstd)
    # without rstd (or the residual) the kernel stores nothing there: y stands in for the pointer
    tensors = (x, residual if has_res else x, weight, y, res_out if has_res else y, rstd if with_rstd else y)
    if rows:  # the rows kernel takes N after the tensors
        template((cdiv(N, rows),), *tensors, N, float(eps), float(weight_offset))
    else:
        template((N,), *tensors, float(eps), float(weight_offset))
    return y, res_out, rstd


_FORWARD_PLANS = configs.plan_store()  # launch_forward's (rows per program or 0, Template) per key (launch.planned)


def _forward_plan(x, residual, cfg, rows_per_program, with_rstd):
    """(rows per program, Template) of the forward for x's H, row strides, dtype and device: the rows
    kernel when it is used (rows > 1 and one tile covers H), else (0, the one-row kernel). SLOTs: the
    tensors, eps and weight_offset, and the rows kernel's N."""
    H = x.shape[1]
    cfg = cfg or _cfg("rmsnorm_fwd", x, H)
    block = hidden_tile(cfg, H)
    has_res = residual is not None
    rows = rows_per_program or _cfg("rmsnorm_fwd_rows", x, H).block_v
    strides = (x.stride(0), SLOT, residual.stride(0) if has_res else 0, SLOT, SLOT, SLOT, SLOT)
    if rows > 1 and block >= H:
        return rows, Template(_fwd_rows_kernel, (SLOT,) + strides + (SLOT, H, float(H), SLOT, SLOT),
                              dict(HAS_RESIDUAL=has_res, BLOCK_H=block, ROWS=rows, STORE_RSTD=with_rstd,
                                   num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return 0, Template(_fwd_kernel, (SLOT,) + strides + (H, float(H), SLOT, SLOT),
                       dict(HAS_RESIDUAL=has_res, BLOCK_H=block, ONE_TILE=block >= H, STORE_RSTD=with_rstd,
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def launch_backward(grad_y, grad_res, h, weight, rstd, weight_offset, with_dw, with_dres,
                    cfg=None, rows_per_block=None, reduce_block=None):
    """grad_y, grad_res: contiguous [N, H]; h: [N, H] (unit stride along H).
    Returns (dx, dw or [0], d residual or [0]): d residual is a second copy of dx, written by the
    kernel when both need it (one tensor returned twice lets autograd's leaves alias their .grad).
    cfg / rows_per_block / reduce_block override the locked table (benchmark sweeps only)."""
    N, H = h.shape
    dx = torch.empty((N, H), dtype=h.dtype, device=h.device)
    dres = torch.empty((N, H) if with_dres else (0,), dtype=h.dtype, device=h.device)
    if not with_dw:
        dw = torch.empty(0, dtype=weight.dtype, device=h.device)
    elif N == 0:
        dw = torch.zeros_like(weight)
    if N == 0:
        return dx, dw, dres
    key = (H, h.stride(0), grad_res is not None, with_dw, with_dres, h.dtype, h.device, cfg, rows_per_block,
           reduce_block)
    R, one_tile, rows, dw_reduce = planned(_BACKWARD_PLANS, key, _backward_plan, h, grad_res is not None, with_dw,
                                           with_dres, cfg, rows_per_block, reduce_block)
    n_blocks = cdiv(N, R)
    if with_dw:
        alloc = torch.empty if one_tile else torch.zeros
        partial = alloc((n_blocks, H), dtype=torch.float32, device=h.device)
    else:
        partial = rstd  # any pointer: not written
    rows((n_blocks,), grad_y, grad_res if grad_res is not None else grad_y, h, weight, rstd,
         dx, dres if with_dres else dx, partial, N, float(weight_offset))
    if with_dw:
        dw = torch.empty_like(weight)
        grid, dw_reduce = dw_reduce
        dw_reduce(grid, partial, dw, n_blocks)
    return dx, dw, dres


_BACKWARD_PLANS = configs.plan_store()  # launch_backward's plans per key (launch.planned)


def _backward_plan(h, has_grad_res, with_dw, with_dres, cfg, rows_per_block, reduce_block):
    """(rows per program, whether one tile covers H, the rows' Template, (grid, the dw reduction's
    Template) or None) of the backward for h's H, row stride, dtype and device and the gradients
    asked for. SLOTs: the tensors, N, weight_offset and the reduction's block count."""
    H = h.shape[1]
    cfg = cfg or _cfg("rmsnorm_bwd", h, H)
    R = rows_per_block or _cfg("rmsnorm_dw_rows", h, H).block_v
    block = hidden_tile(cfg, H)
    one_tile = block >= H
    rows = Template(_bwd_kernel, (SLOT, SLOT, SLOT, h.stride(0)) + (SLOT,) * 6 + (H, float(H), SLOT),
                    dict(HAS_GRAD_RES=has_grad_res, WITH_DW=with_dw, WITH_DRES=with_dres, ROWS_PER_BLOCK=R,
                         BLOCK_H=block, ONE_TILE=one_tile, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    dw_reduce = None
    if with_dw:
        red = _cfg("rmsnorm_dw_reduce", h, H)
        lanes = reduce_block or red.block_v
        # columns per program: elementwise across columns, so it never changes a result
        cols = min(next_power_of_2(H), max(16, 2048 // lanes))
        dw_reduce = ((cdiv(H, cols),), Template(_dw_reduce_kernel, (SLOT, SLOT, SLOT, H),
                                                dict(BLOCK_B=lanes, BLOCK_C=cols, num_warps=red.num_warps,
                                                     num_stages=red.num_stages)))
    return R, one_tile, rows, dw_reduce


# ---- torch.library custom ops: usable under torch.compile, autograd through register_autograd ----

@torch.library.custom_op("rlk_triton::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor], eps: float, weight_offset: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(x, weight, residual, eps, weight_offset)


@rms_norm_fwd.register_fake
def _(x, weight, residual, eps, weight_offset):
    N, H = x.shape
    return (x.new_empty((N, H)), x.new_empty((N, H) if residual is not None else (0,)),
            x.new_empty(N, dtype=torch.float32))


@torch.library.custom_op("rlk_triton::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    grad_y: torch.Tensor, grad_residual: Optional[torch.Tensor], h: torch.Tensor, weight: torch.Tensor,
    rstd: torch.Tensor, weight_offset: float, with_dw: bool, with_dres: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_backward(grad_y, grad_residual, h, weight, rstd, weight_offset, with_dw, with_dres)


@rms_norm_bwd.register_fake
def _(grad_y, grad_residual, h, weight, rstd, weight_offset, with_dw, with_dres):
    return (h.new_empty(h.shape), weight.new_empty(weight.shape if with_dw else (0,)),
            h.new_empty(h.shape if with_dres else (0,)))


def _setup_context(ctx, inputs, output):
    x, weight, residual, eps, weight_offset = inputs
    _, res_out, rstd = output
    h = res_out if residual is not None else x  # what the normalization read
    ctx.save_for_backward(h, weight, rstd)
    ctx.has_residual = residual is not None
    ctx.weight_offset = weight_offset
    ctx.set_materialize_grads(False)  # an unused h output arrives as None, not as an [N, H] of zeros


def _grads(ctx, grad_y, grad_res_out, launch):
    """The backward on the saved tensors with `launch` (launch_backward's arguments and outputs)."""
    h, weight, rstd = ctx.saved_tensors
    if grad_y is None:
        grad_y = torch.zeros_like(h)
    if grad_res_out is not None and grad_res_out.numel() == 0:
        grad_res_out = None
    need_x, with_dw, need_res = (bool(n) for n in ctx.needs_input_grad[:3])
    with_dres = need_x and need_res
    dx, dw, dres = launch(grad_y.contiguous(), None if grad_res_out is None else grad_res_out.contiguous(),
                          h, weight, rstd, ctx.weight_offset, with_dw, with_dres)
    # x and residual enter as x + residual: both receive d h (the downcast is straight-through)
    return (dx if need_x else None, dw if with_dw else None,
            (dres if with_dres else dx) if need_res else None, None, None)


def _backward(ctx, grad_y, grad_res_out, _grad_rstd):
    return _grads(ctx, grad_y, grad_res_out, call_rms_norm_bwd)


call_rms_norm_fwd = autograd_op(rms_norm_fwd, _backward, _setup_context)
call_rms_norm_bwd = direct(rms_norm_bwd)


# ---- the public function ----

def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = 1e-6,
    residual: Optional[torch.Tensor] = None,
    weight_offset: float = 0.0,
    backend: str = "triton",
):
    """RMSNorm over the last dim, optionally after a fused residual add.

    Args:
        x: [..., H] bf16 / fp16 / fp32; any leading shape and strides, the last dim contiguous
            (LayoutError otherwise). Leading dims that cannot be viewed as one are copied.
        weight: [H], x's dtype or float32, contiguous. Its gradient comes back in its dtype.
        eps: a finite float > 0, added to the mean square (a runtime value: never recompiles).
        residual: optional, x's shape, dtype and device. Then h = dtype(x + residual) in fp32
            arithmetic is normalized and also returned (the residual stream of the next layer).
        weight_offset: the scale is (weight + weight_offset) in fp32; 1.0 for Gemma's (1 + w).
        backend: "triton" (default), or "cuda_native": the native kernels (docs/native.md), only where
            `rlk-triton native admit` recorded it bitwise equal to the Triton kernel under this
            process's fingerprint (BackendError saying why otherwise); eager only. Its backward is
            native too (the gate admits forward and backward together).

    Returns:
        y with x's shape and dtype (contiguous), or (y, residual_out) when residual is given.
        Differentiable w.r.t. x, weight and residual (x and residual get the same gradient).
    """
    H = _check(x, weight, residual, eps, weight_offset)
    if backend != "triton":
        return _rms_norm_native(x, weight, residual, float(eps), float(weight_offset), backend, H)
    x2d = x.reshape(-1, H)
    r2d = residual.reshape(-1, H) if residual is not None else None
    if route((x2d, weight, r2d)) is IMPL:  # a rollout: no graph to record, so no rstd to save
        y, res_out, _ = launch_forward(x2d, weight, r2d, float(eps), float(weight_offset), with_rstd=False)
    else:
        y, res_out, _ = call_rms_norm_fwd(x2d, weight, r2d, float(eps), float(weight_offset))
    if residual is None:
        return shaped(y, x.shape)
    return shaped(y, x.shape), shaped(res_out, x.shape)


class _NativeForward(torch.autograd.Function):
    """The admitted native forward and backward: the custom op's setup_context on the same saved
    tensors (the native rstd and residual_out are the Triton kernel's bits), the native backward
    kernels in place of the Triton ones (the same gate admits both)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, weight_offset, layout):
        out = _native_outputs(x, weight, residual, eps, weight_offset, layout)
        _setup_context(ctx, (x, weight, residual, eps, weight_offset), out)
        return out

    @staticmethod
    def backward(ctx, grad_y, grad_res_out, _grad_rstd):
        return _grads(ctx, grad_y, grad_res_out, native.rms_norm_bwd) + (None,)


def _native_outputs(x, weight, residual, eps, weight_offset, layout):
    """(y, residual_out, rstd) of the native forward, as launch_forward returns them (residual_out
    empty without the residual); layout: native._rmsnorm_config's, looked up once per call."""
    if residual is None:
        y, rstd = native.rms_norm_fwd(x, weight, eps, weight_offset, layout=layout)
        return y, x.new_empty(0), rstd
    return native.rms_norm_fwd(x, weight, eps, weight_offset, residual, layout=layout)


def _rms_norm_native(x, weight, residual, eps, weight_offset, backend, H):
    if backend != "cuda_native":
        raise BackendError("backend", f"unknown backend {backend!r} (have: triton, cuda_native)")
    if weight.dtype != x.dtype:
        raise BackendError("backend", f"cuda_native needs the weight in x's dtype {x.dtype}, got {weight.dtype}")
    if torch.compiler.is_compiling():
        raise BackendError("backend", "cuda_native runs in eager only: use backend='triton' under torch.compile")
    ok, why = native.usable("rmsnorm", str(x.device))
    if not ok:
        raise BackendError("backend", f"rmsnorm.cuda_native is not usable here: {why}")
    rows = x.reshape(-1, H)
    res_rows = residual.reshape(-1, H) if residual is not None else None
    layout = native._rmsnorm_config(rows, residual=res_rows)
    block, warps, vec, _ = layout
    if block < H or block % (32 * warps):  # what the native kernel has and the gate covered
        raise BackendError("backend", f"cuda_native covers rows of one tile with a lane per thread (H <= {block}"
                           f" and H > {16 * warps} here), got H = {H}: use backend='triton'")
    if vec is None:
        raise BackendError("backend", "cuda_native has no layout for the fused add with H not a multiple of 16 and "
                           "a row stride that is one (docs/native.md): use backend='triton'")
    if any(t.data_ptr() % 16 for t in (rows, weight, res_rows) if t is not None):
        # the native layout is the Triton kernel's for 16-byte aligned inputs only (docs/native.md)
        raise BackendError("backend", "cuda_native needs x, the residual and the weight 16-byte aligned: "
                           "use backend='triton'")
    if wants_grad((x, weight, residual)):
        y, res_out, _ = _NativeForward.apply(rows, weight, res_rows, eps, weight_offset, layout)
    else:  # a rollout: no graph to record, so not the autograd.Function's host time either
        out = native.rms_norm_fwd(rows, weight, eps, weight_offset, res_rows, layout=layout)
        y, res_out = out[0], out[1] if residual is not None else None
    if residual is None:
        return shaped(y, x.shape)
    return shaped(y, x.shape), shaped(res_out, x.shape)


def _check(x, weight, residual, eps, weight_offset) -> int:
    if not isinstance(x, torch.Tensor):
        raise DTypeError("x", f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise DTypeError("x", f"dtype {x.dtype} is not one of bfloat16, float16, float32")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ShapeError("x", f"needs a non-empty hidden dim: shape [..., H], got {tuple(x.shape)}")
    H = x.shape[-1]
    if H > 1 and x.stride(-1) != 1:
        raise LayoutError("x", f"the hidden dim must be contiguous (stride {x.stride(-1)}); call .contiguous()")
    check_device("x", x)
    if not isinstance(weight, torch.Tensor):
        raise DTypeError("weight", f"expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in (x.dtype, torch.float32):
        raise DTypeError("weight", f"dtype {weight.dtype} is neither x's {x.dtype} nor float32")
    if tuple(weight.shape) != (H,):
        raise ShapeError("weight", f"shape {tuple(weight.shape)} is not [H] = [{H}]")
    if weight.device != x.device:
        raise DeviceError("weight", f"on {weight.device}, x on {x.device}")
    if H > 1 and weight.stride(0) != 1:
        raise LayoutError("weight", "must be contiguous; call .contiguous()")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise DTypeError("residual", f"expected a torch.Tensor, got {type(residual).__name__}")
        if residual.dtype != x.dtype:
            raise DTypeError("residual", f"dtype {residual.dtype} differs from x's {x.dtype}")
        if residual.shape != x.shape:
            raise ShapeError("residual", f"shape {tuple(residual.shape)} does not match x's {tuple(x.shape)}")
        if residual.device != x.device:
            raise DeviceError("residual", f"on {residual.device}, x on {x.device}")
        if H > 1 and residual.stride(-1) != 1:
            raise LayoutError("residual", f"the hidden dim must be contiguous (stride {residual.stride(-1)})")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise InputError("eps", f"must be a finite float > 0, got {eps!r}")
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, (int, float)) \
            or not math.isfinite(weight_offset):
        raise InputError("weight_offset", f"must be a finite float, got {weight_offset!r}")
    return H


def check_device(name, t):
    if t.device.type == "cpu":
        if not _INTERPRETED:
            raise DeviceError(name, "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 "
                              "before importing rlk_triton, or move to CUDA")
    elif t.device.type != "cuda":
        raise DeviceError(name, f"unsupported device {t.device}")
