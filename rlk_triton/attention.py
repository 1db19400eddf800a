"""Batch-invariant attention with exported LSE (docs/attention.md).

    out, lse = attention(q, k, v, cu_seqlens)                       # training: varlen, causal
    out, lse = attention_decode(q, k_cache, v_cache, block_table, cache_seqlens, cu_seqlens_q)
    out, lse = merge_attention_partials(outs, lses)                 # context parallelism

A token's out and LSE are bitwise the same from the training path and the paged decode path, and
independent of the other sequences of a pack (their number, lengths, order, padding).
"""
from __future__ import annotations

import math
import sys
import types
from typing import Optional, Sequence

import torch

from . import configs
from ._runtime import arch_of, interpreter_active
from .errors import DeviceError, DTypeError, InputError, LayoutError, ShapeError

__all__ = ["attention", "attention_partial", "attention_decode", "merge_attention_partials"]

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_INTS = (torch.int32,)


def _check_float(name, x, like=None, dim=3):
    if not isinstance(x, torch.Tensor):
        raise DTypeError(name, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise DTypeError(name, f"dtype {x.dtype} is not one of bfloat16, float16, float32")
    if like is not None and x.dtype != like.dtype:
        raise DTypeError(name, f"dtype {x.dtype} differs from q's {like.dtype}")
    if like is not None and x.device != like.device:
        raise DeviceError(name, f"on {x.device}, q on {like.device}")
    if x.dim() != dim:
        raise ShapeError(name, f"must be {dim}-D, got shape {tuple(x.shape)}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise LayoutError(name, "the head dim must be contiguous (stride 1)")


def _check_device(q):
    if q.device.type == "cpu" and not interpreter_active():
        raise DeviceError("q", "CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
    if q.device.type not in ("cpu", "cuda"):
        raise DeviceError("q", f"unsupported device {q.device}")


def _check_heads(q, k_heads, k_name):
    D = q.shape[-1]
    if D < 16 or D > 256 or D & (D - 1):
        raise ShapeError("q", f"head dim {D} must be a power of two in [16, 256]")
    if k_heads == 0 or q.shape[1] % k_heads:
        raise ShapeError(k_name, f"{k_heads} kv heads do not divide q's {q.shape[1]} heads")


def _check_index(name, x, q, dim=1):
    """The index tensor, contiguous: kernels read offsets, lengths and page ids by position."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _INTS:
        raise DTypeError(name, "must be an int32 tensor")
    if x.dim() != dim:
        raise ShapeError(name, f"must be {dim}-D, got shape {tuple(x.shape)}")
    if x.device != q.device:
        raise DeviceError(name, f"on {x.device}, q on {q.device}")
    return x.contiguous()


def _int_arg(name, x, minimum=0):
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise InputError(name, f"must be an int >= {minimum}, got {x!r}")
    return x


def _scale(scale, D):
    if scale is None:
        return 1.0 / math.sqrt(D)
    try:
        s = float(scale)
    except (TypeError, ValueError, RuntimeError):
        raise InputError("scale", f"must be a finite number > 0, got {scale!r}") from None
    if not math.isfinite(s) or s <= 0:
        raise InputError("scale", f"must be a finite number > 0, got {scale!r}")
    return s


def _check_cu(cu_seqlens, N, max_seqlen, validate, name="cu_seqlens", arg_max="max_seqlen"):
    """The (validated) max_seqlen. validate=True syncs once and checks the offsets."""
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)
                                   or max_seqlen < 0):
        raise InputError(arg_max, f"must be an int >= 0, got {max_seqlen!r}")
    if cu_seqlens.numel() < 1:
        raise ShapeError(name, "must hold at least one offset [S + 1]")
    if validate or max_seqlen is None:
        cu = cu_seqlens.long().cpu()
        lengths = cu[1:] - cu[:-1]
        longest = int(lengths.max()) if lengths.numel() else 0
        if validate:
            if int(cu[0]) != 0 or int(cu[-1]) != N or bool((lengths < 0).any()):
                raise InputError(name, f"must start at 0, not decrease and end at {N} (the token count)")
            if max_seqlen is not None and longest > max_seqlen:
                raise InputError(arg_max, f"{max_seqlen} is shorter than the longest sequence ({longest})")
        if max_seqlen is None:
            max_seqlen = longest
    return max_seqlen


def _cu_or_one(cu_seqlens, q):
    if cu_seqlens is None:
        return torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    return _check_index("cu_seqlens", cu_seqlens, q)


def _check_training(q, k, v, cu_seqlens, max_seqlen, scale, validate):
    _check_float("q", q)
    _check_float("k", k, q)
    _check_float("v", v, q)
    _check_device(q)
    if k.shape != v.shape:
        raise ShapeError("v", f"shape {tuple(v.shape)} differs from k's {tuple(k.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ShapeError("k", f"shape {tuple(k.shape)} does not fit q's {tuple(q.shape)} ([N, Hkv, D])")
    _check_heads(q, k.shape[1], "k")
    cu = _cu_or_one(cu_seqlens, q)
    return cu, _check_cu(cu, q.shape[0], max_seqlen, validate), _scale(scale, q.shape[-1])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
              *, max_seqlen: Optional[int] = None, causal: bool = True, scale: Optional[float] = None,
              validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen (packed) multi-head attention; differentiable in q, k, v (and through the LSE).

    Args:
        q: [N, Hq, D]; k, v: [N, Hkv, D] with Hkv dividing Hq (GQA); one dtype (bf16, fp16, fp32),
            head dim a power of two in [16, 256], last dim contiguous.
        cu_seqlens: int32 [S + 1] sequence offsets into the N packed tokens (None: one sequence).
        max_seqlen: the longest sequence (sizes the launch grid; None: read from cu_seqlens).
        causal: key j is visible to query i of the same sequence iff j <= i.
        scale: the score scale, default 1 / sqrt(D).
        validate: check cu_seqlens and max_seqlen on the host (one device sync). With validate=False,
            invalid offsets give undefined values (each sequence is clamped into [0, N); outputs
            and gradients of tokens outside every sequence are not written), never a read or write
            outside a tensor; a max_seqlen shorter than the longest sequence only costs time.
    Returns:
        out [N, Hq, D] in q's dtype (fp32 acc / l, rounded once at the store) and lse float32
        [Hq, N], lse[h, t] = log sum_j exp(scale * q[t, h] . k[j, h // (Hq / Hkv)]) over visible j.
    """
    from .ops.attention import call_attention_fwd

    cu, max_seqlen, scale = _check_training(q, k, v, cu_seqlens, max_seqlen, scale, validate)
    return call_attention_fwd(q, k, v, cu, max_seqlen, scale, bool(causal))


def attention_partial(q, k, v, cu_seqlens=None, *, kv_start: int = 0, kv_end: Optional[int] = None,
                      state=None, max_seqlen=None, causal=True, scale=None, validate=True):
    """Attention over the keys at positions [kv_start, kv_end) of each sequence only, continuing
    from `state` (the state after the keys before kv_start) or from the empty state.

    Returns (out, lse, state): out / lse normalized over the keys folded so far (the kernel's own
    epilogue), and state = (m [Hq, N] fp32 running max in log2 units, l [Hq, N] fp32, acc [N, Hq, D]
    fp32), the unnormalized online-softmax state. kv_start must be a multiple of the locked block_n.
    Chaining ranges in ascending order, each continuing from the previous state, performs the same
    block updates in the same order as attention(): the last call's out / lse are bitwise
    attention()'s. Independent ranges' (out, lse) combine with merge_attention_partials (within
    contract, not bitwise). Not differentiable.
    """
    from .ops.attention import INT32_MAX, launch_forward

    cu, max_seqlen, scale = _check_training(q, k, v, cu_seqlens, max_seqlen, scale, validate)
    bn = configs.lookup_attention("attention_fwd", arch_of(q.device), q.dtype, q.shape[-1]).block_n
    if _int_arg("kv_start", kv_start) % bn:
        raise InputError("kv_start", f"must be a multiple of block_n = {bn}, got {kv_start}")
    end = INT32_MAX if kv_end is None else min(_int_arg("kv_end", kv_end), INT32_MAX)
    if end < kv_start:
        raise InputError("kv_end", f"{kv_end} is before kv_start {kv_start}")
    if state is not None:
        N, Hq, D = q.shape
        if not isinstance(state, (tuple, list)) or len(state) != 3:
            raise ShapeError("state", "must be the (m, l, acc) triple a previous attention_partial returned")
        for i, (x, shape) in enumerate(zip(state, ((Hq, N), (Hq, N), (N, Hq, D)))):
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or tuple(x.shape) != shape \
                    or not x.is_contiguous() or x.device != q.device:
                raise ShapeError(f"state[{i}]", f"must be a contiguous float32 tensor of shape {shape} on q's device")
    with torch.no_grad():
        return launch_forward(q, k, v, cu, max_seqlen, scale, bool(causal), kv_range=(kv_start, end),
                              state_in=state, state_out=True)


def merge_attention_partials(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor], *, validate: bool = True):
    """Combine normalized partials (out_i [N, H, D], lse_i [H, N]) over disjoint KV ranges, folded in
    the given order (pass them in ascending KV order): lse = log sum_i exp(lse_i), out = sum_i
    exp(lse_i - lse) out_i, in fp32, out rounded once to outs[0]'s dtype.

    Within the attention contract for any split; NOT bitwise equal to the unsplit kernel, because
    the partial outs were already normalized and rounded (floating-point merges are not associative).
    For bitwise context parallelism chain attention_partial states instead (docs/attention.md).

    outs and lses are sequences (or iterables) of tensors. validate: check on the host (one sync)
    that no lse is NaN or +inf (an lse is -inf for a row that saw no key, finite otherwise); with
    validate=False such values give NaN rows.
    """
    outs, lses = _tensor_list("outs", outs), _tensor_list("lses", lses)
    if not outs:
        raise ShapeError("outs", "need at least one partial")
    if len(lses) != len(outs):
        raise ShapeError("lses", f"{len(lses)} lses for {len(outs)} outs: need one per out")
    for i, (o, s) in enumerate(zip(outs, lses)):
        _check_float(f"outs[{i}]", o, outs[0])
        if o.shape != outs[0].shape:
            raise ShapeError(f"outs[{i}]", f"shape {tuple(o.shape)} differs from outs[0]'s {tuple(outs[0].shape)}")
        if s.dtype != torch.float32:
            raise DTypeError(f"lses[{i}]", "must be a float32 tensor")
        if s.device != o.device:
            raise DeviceError(f"lses[{i}]", f"on {s.device}, outs[{i}] on {o.device}")
        if tuple(s.shape) != (o.shape[1], o.shape[0]):
            raise ShapeError(f"lses[{i}]", f"shape {tuple(s.shape)} must be [H, N] of outs[0] {tuple(outs[0].shape)}")
        if validate and bool((s.isnan() | (s == float("inf"))).any()):
            raise InputError(f"lses[{i}]", "holds NaN or +inf (an lse is finite, or -inf for a row with no key)")
    m = lses[0].clone()
    l = torch.ones_like(m)
    l = torch.where(m == float("-inf"), torch.zeros_like(l), l)
    acc = outs[0].float() * l.t()[:, :, None]
    for o, s in zip(outs[1:], lses[1:]):  # reduction.merge_softmax_states' arithmetic, natural log
        m_new = torch.maximum(m, s)
        shift = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha, beta = torch.exp(m - shift), torch.exp(s - shift)
        l = l * alpha + beta
        acc = acc * alpha.t()[:, :, None] + o.float() * beta.t()[:, :, None]
        m = m_new
    empty = l == 0
    l_safe = torch.where(empty, torch.ones_like(l), l)
    out = (acc / l_safe.t()[:, :, None]).to(outs[0].dtype)
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(l_safe))
    return out, lse


def _tensor_list(name, xs):
    if isinstance(xs, torch.Tensor) or xs is None or isinstance(xs, (str, bytes)):
        raise DTypeError(name, f"must be a sequence of tensors, got {type(xs).__name__}")
    try:
        xs = list(xs)
    except TypeError:
        raise DTypeError(name, f"must be a sequence of tensors, got {type(xs).__name__}") from None
    for i, x in enumerate(xs):
        if not isinstance(x, torch.Tensor):
            raise DTypeError(f"{name}[{i}]", f"expected a torch.Tensor, got {type(x).__name__}")
    return xs


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     cache_seqlens: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor] = None, *,
                     max_seqlen_q: Optional[int] = None, scale: Optional[float] = None,
                     validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of new tokens against a paged KV cache (decode and chunked prefill).

    Args:
        q: [N_new, Hq, D], the new tokens of B sequences packed (cu_seqlens_q int32 [B + 1]; None:
            one token per sequence, N_new = B).
        k_cache, v_cache: [num_pages, page_size, Hkv, D], already holding every token's k / v, the new
            ones included. page_size must be a multiple of the locked block_n (LayoutError).
        block_table: int32 [B, max_pages]: page of logical page i of sequence b.
        cache_seqlens: int32 [B]: each sequence's length INCLUDING its new tokens; sequence b's new
            tokens sit at positions [cache_seqlens[b] - n_b, cache_seqlens[b]).
        validate: check the offsets, lengths and page ids on the host (one sync). With
            validate=False, invalid ones give undefined values, never a read or write outside a
            tensor: lengths are clamped to the block table's capacity, page ids to the cache, new
            tokens' offsets to q.
    Returns out [N_new, Hq, D] (q's dtype) and lse float32 [Hq, N_new]: for each token bitwise what
    attention(causal=True) gives it over the same sequence.
    """
    from .ops.attention import launch_decode

    _check_float("q", q)
    _check_float("k_cache", k_cache, q, dim=4)
    _check_float("v_cache", v_cache, q, dim=4)
    _check_device(q)
    if k_cache.shape != v_cache.shape:
        raise ShapeError("v_cache", f"shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}")
    if k_cache.shape[3] != q.shape[2]:
        raise ShapeError("k_cache", f"head dim {k_cache.shape[3]} differs from q's {q.shape[2]}")
    _check_heads(q, k_cache.shape[2], "k_cache")
    bn = configs.lookup_decode(arch_of(q.device), q.dtype, q.shape[-1]).block_n
    page_size = k_cache.shape[1]
    if page_size == 0 or page_size % bn:
        raise LayoutError("k_cache", f"page_size {page_size} must be a multiple of block_n = {bn} (a KV "
                          "block must lie inside one page)")
    block_table = _check_index("block_table", block_table, q, dim=2)
    cache_seqlens = _check_index("cache_seqlens", cache_seqlens, q)
    B = cache_seqlens.numel()
    if block_table.shape[0] != B:
        raise ShapeError("block_table", f"has {block_table.shape[0]} rows, cache_seqlens {B}")
    if max_seqlen_q is not None:
        _int_arg("max_seqlen_q", max_seqlen_q)
    if cu_seqlens_q is None:
        if q.shape[0] != B:
            raise ShapeError("q", f"{q.shape[0]} tokens but {B} sequences (pass cu_seqlens_q for chunks)")
        cu_q = None  # one new token per sequence: the kernel takes token b for sequence b (no offsets tensor)
        max_seqlen_q = 1
    else:
        cu_q = _check_index("cu_seqlens_q", cu_seqlens_q, q)
        if cu_q.numel() != B + 1:
            raise ShapeError("cu_seqlens_q", f"must be [B + 1] = [{B + 1}], got {cu_q.numel()}")
        max_seqlen_q = _check_cu(cu_q, q.shape[0], max_seqlen_q, validate, "cu_seqlens_q", "max_seqlen_q")
    if validate:  # one transfer to the host: the lengths, the chunks' offsets, the page ids' range
        parts = [cache_seqlens.long()] + ([cu_q.long()] if cu_seqlens_q is not None else [])
        if B and block_table.numel():
            parts.append(torch.stack(torch.aminmax(block_table)).long())
        host = torch.cat(parts).tolist()
        lens = host[:B]
        offsets = host[B:2 * B + 1] if cu_seqlens_q is not None else range(B + 1)  # decode: one token each
        cap = block_table.shape[1] * page_size
        if any(n < b - a or n > cap for n, a, b in zip(lens, offsets, offsets[1:])):
            raise InputError("cache_seqlens", "each length must be >= its new tokens and fit the block table's "
                             f"{block_table.shape[1]} pages of {page_size}")
        if B and block_table.numel() and (host[-2] < 0 or host[-1] >= k_cache.shape[0]):
            raise InputError("block_table", f"page ids must lie in [0, {k_cache.shape[0]})")
    return launch_decode(q, k_cache, v_cache, block_table, cache_seqlens, cu_q, max_seqlen_q,
                         _scale(scale, q.shape[-1]))


class _CallableModule(types.ModuleType):
    """`rlk_triton.attention(q, k, v, cu_seqlens, ...)` is attention(): the module is also the
    function, so the package-level spelling and `from rlk_triton.attention import attention` agree."""

    def __call__(self, *args, **kwargs):
        return attention(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
