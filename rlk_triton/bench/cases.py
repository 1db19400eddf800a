"""The benchmark cases, defined once per operator family: `rlk-triton bench`, the asv classes
(asv_bench/benchmarks/suite.py) and the device script (scripts/gpu_run.sh) all run these.

A case is one call of the library (forward, or forward + backward) at one shape and dtype, with what
a user would run instead, measured in the same process:
  eager    the plain torch code (log_softmax + gather, the textbook RMSNorm, the GAE loop, ...)
  compile  torch.compile of that code (not with --quick: its compile time would dominate the run)
  default  what a user gets by default from the vendor: cuBLAS (torch.matmul), SDPA's default backend
  liger / cce  Liger-Kernel / Cut Cross-Entropy, when importable (else the report lists them skipped)
and the physical ceiling of the run: the bytes the op must move at the device copy rate
(memory-bound ops) or its GEMM work at torch.matmul's rate (compute-bound ops).

Sizes: "full" the GPU shapes of docs/reports, "quick" one smaller GPU shape per case, "tiny" the
Triton interpreter's shapes (a CPU run: its figures say nothing about a GPU).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

SIZES = ("full", "quick", "tiny")
BASELINE_KINDS = ("eager", "compile", "default", "liger", "cce", "ceiling")
CEILINGS = {"copy": "copy bandwidth ceiling (bytes moved / device copy rate)",
            "matmul": "matmul rate ceiling (GEMM flops / torch.matmul rate)"}
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Baseline:
    label: str
    kind: str  # one of BASELINE_KINDS
    fn: Callable[[], object]


@dataclass
class Bound:
    """A case built on a device: the library's call and the baselines', ready to time."""
    rlk: Callable[[], object]
    ceiling: str  # a key of CEILINGS
    work: float  # what the ceiling divides: bytes the op must move, or its GEMM flops
    dtype: torch.dtype  # the operands' (the matmul ceiling's rate is per dtype)
    baselines: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # (baseline label, why not measured)


@dataclass(frozen=True)
class Case:
    op: str  # the operator family, as the registry names it
    case: str  # fwd | fwd+bwd | decode
    shape: str
    dtype: str
    build: Callable[[str, bool], Bound]  # (device, quick) -> Bound

    @property
    def name(self) -> str:
        return f"{self.case} {self.shape} {self.dtype}"


class _Baselines:
    """Collects a case's baselines; the ones that cannot run here go to `skipped` with the reason."""

    def __init__(self, quick: bool, main_shape: bool = True):
        self.quick, self.main_shape, self.items, self.skipped = quick, main_shape, [], []

    def add(self, label, kind, fn):
        self.items.append(Baseline(label, kind, fn))

    def compiled(self, label, make):
        if self.quick:
            self.skipped.append((label, "--quick: torch.compile's compile time would dominate the run"))
        elif not self.main_shape:  # each shape compiles anew: once per family and pass keeps the run short
            self.skipped.append((label, "torch.compile is measured at the family's main shape only"))
        else:
            self.add(label, "compile", make())

    def optional(self, label, kind, make):
        """make() imports the competitor and returns the call; an absent package is a skip, not an error."""
        try:
            self.add(label, kind, make())
        except ImportError as ex:
            self.skipped.append((label, f"not importable here: {ex}"))

    def bound(self, rlk, ceiling, work, dtype) -> Bound:
        return Bound(rlk, ceiling, work, dtype, self.items, self.skipped)


def _gen(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(g, device, *shape, dtype=torch.float32, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device, generator=g) * scale).to(dtype)


def _call(mode, fn, args, wrt=(), grads=None):
    """The timed call: fn(*args), or for fwd+bwd the forward and the gradients of args[wrt] by
    torch.autograd.grad (no .grad accumulates between calls). grads: the upstream gradients of fn's
    outputs in order; None for a scalar loss."""
    if mode == "fwd":
        return lambda: fn(*args)
    args = [a.detach().requires_grad_(True) if i in wrt else a for i, a in enumerate(args)]
    leaves = [args[i] for i in wrt]

    def step():
        out = fn(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return torch.autograd.grad(outs[:len(grads)] if grads else outs[0], leaves, grads)

    return step


def autograd_floor(device) -> Callable[[], object]:
    """torch's cheapest forward + backward, autograd.grad of x * 2 over 16 fp32 elements: on a GPU its
    wall time is nearly all host (autograd's engine, and the hand-off of a CUDA backward to the
    device's worker thread and back), the floor under any lone fwd+bwd call, ours or torch's."""
    x = torch.randn(16, device=device, requires_grad=True)
    up = torch.ones(16, device=device)
    return lambda: torch.autograd.grad(x * 2, x, up)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- selected_logp ----

def _selected_logp(rows, V, mode, main, dtype, device, quick) -> Bound:
    from ..logp import selected_logp

    g = _gen(device, rows)
    x = _randn(g, device, rows, V, dtype=dtype, scale=2.0)
    t = torch.randint(0, V, (rows,), device=device, generator=g)
    dy = torch.randn(rows, device=device, generator=g)
    grads = (dy,)

    def eager(x, t):
        return torch.log_softmax(x.float(), -1).gather(-1, t[:, None]).squeeze(-1)

    def lse(x, t):
        f = x.float()
        return f.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(f, -1)

    def liger():
        from liger_kernel.ops.grpo_loss import fused_selective_log_softmax

        # Liger takes [B, L + 1, V] logits and scores rows 0..L-1 against ids [B, L]
        xl, ids = torch.cat([x, x[:1]]).view(1, rows + 1, V), t.view(1, rows)
        return lambda: fused_selective_log_softmax(xl, ids, temperature=1.0)

    b = _Baselines(quick, main)
    b.add("torch eager log_softmax + gather", "eager", _call(mode, eager, (x, t), (0,), grads))
    b.compiled("torch.compile gather - logsumexp", lambda: _call(mode, torch.compile(lse), (x, t), (0,), grads))
    if mode == "fwd":  # Liger's selective log-softmax has no standalone backward to time
        b.optional("Liger fused_selective_log_softmax", "liger", liger)
    passes = 1 if mode == "fwd" else 3  # the forward reads the logits; the backward reads them and writes d logits
    ours = partial(selected_logp, validate=False)
    return b.bound(_call(mode, ours, (x, t), (0,), grads), "copy", passes * _nbytes(x), dtype)


def _selected_logp_cases(size):
    V = 257 if size == "tiny" else 151936
    rows = {"full": (16384, 1, 64, 1024), "quick": (4096,), "tiny": (4,)}[size]
    out = [("fwd", rows[0]), ("fwd+bwd", rows[0])] + [("fwd", r) for r in rows[1:]]  # then decode-sized batches
    return [Case("selected_logp", mode, f"[{r} x {V}]", "bfloat16",
                 partial(_selected_logp, r, V, mode, r == rows[0], BF16)) for mode, r in out]


# ---- linear_logp ----

def eager_linear_logp(h, w, t):
    """The baseline a user writes: the logits, then log_softmax and gather in fp32."""
    return torch.log_softmax((h @ w.T).float(), -1).gather(-1, t[:, None]).squeeze(-1)


def linear_logp_gemms(h, w, d_logits, n):
    """The cuBLAS bound of an exact fwd+bwd: n GEMMs of linear_logp's shapes and no softmax work. 4: the
    logits, the logits again (recomputed), d hidden and d weight; 3 when the forward kept the logits."""
    return [h @ w.T for _ in range(n - 2)] + [d_logits @ w, d_logits.T @ h]


def _linear_logp(N, H, V, mode, main, dtype, device, quick, saved="recompute") -> Bound:
    from ..logp import linear_logp

    g = _gen(device, N)
    h = _randn(g, device, N, H, dtype=dtype, scale=0.5)
    w = _randn(g, device, V, H, dtype=dtype, scale=0.02)
    t = torch.randint(0, V, (N,), device=device, generator=g)
    grads = (torch.randn(N, device=device, generator=g),)
    args, wrt = (h, w, t), (0, 1)
    eager = eager_linear_logp

    def liger():
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        flce = LigerFusedLinearCrossEntropyLoss(reduction="none")
        return _call(mode, lambda h, w, t: -flce(w, h, t), args, wrt, grads)

    def cce():
        from cut_cross_entropy import linear_cross_entropy

        return _call(mode, lambda h, w, t: -linear_cross_entropy(h, w, t, reduction="none"), args, wrt, grads)

    b = _Baselines(quick, main)
    b.add("torch eager matmul + log_softmax + gather", "eager", _call(mode, eager, args, wrt, grads))
    b.compiled("torch.compile matmul + log_softmax + gather",
               lambda: _call(mode, torch.compile(eager), args, wrt, grads))
    if mode == "fwd+bwd":  # Liger's FLCE computes its gradients in the forward: only fwd+bwd compares
        b.optional("Liger LigerFusedLinearCrossEntropyLoss", "liger", liger)
    b.optional("Cut Cross-Entropy linear_cross_entropy", "cce", cce)
    gemms = 1 if mode == "fwd" else 3  # logits; + d hidden and d weight
    ours = partial(linear_logp, validate=False, saved=saved)
    return b.bound(_call(mode, ours, args, wrt, grads), "matmul", gemms * 2 * N * H * V, dtype)


def _linear_logp_cases(size):
    H, V = (32, 100) if size == "tiny" else (4096, 151936)
    out = {"full": (("fwd", 8192), ("fwd+bwd", 8192), ("fwd+bwd", 2048)),
           "quick": (("fwd", 1024), ("fwd+bwd", 1024)), "tiny": (("fwd", 8), ("fwd+bwd", 8))}[size]
    cases = [Case("linear_logp", mode, f"N={N} H={H} V={V}", "bfloat16",
                  partial(_linear_logp, N, H, V, mode, N == out[0][1], BF16)) for mode, N in out]
    # saved="logits": the backward reads the forward's logits instead of recomputing them
    return cases + [Case("linear_logp", "fwd+bwd", f"N={N} H={H} V={V} saved=logits", "bfloat16",
                         partial(_linear_logp, N, H, V, "fwd+bwd", False, BF16, saved="logits"))
                    for mode, N in out if mode == "fwd+bwd"]


# ---- matmul ----

def _matmul(M, N, K, weight, dtype, device, quick) -> Bound:
    from ..ops.matmul import matmul

    g = _gen(device, M + N + K)
    a = _randn(g, device, M, K, dtype=dtype)
    # a linear layer's weight.t() (the decode GEMM) or a row-major [K, N]
    b_mat = _randn(g, device, N, K, dtype=dtype, scale=K**-0.5).t() if weight else _randn(g, device, K, N, dtype=dtype)
    b = _Baselines(quick)
    b.add("cuBLAS (torch.matmul)", "default", lambda: torch.matmul(a, b_mat))
    if M <= 256:  # a few rows: the weight read bounds it, not the tensor cores
        return b.bound(lambda: matmul(a, b_mat), "copy", _nbytes(a, b_mat) + M * N * a.element_size(), dtype)
    return b.bound(lambda: matmul(a, b_mat), "matmul", 2 * M * N * K, dtype)


def _matmul_cases(size):
    if size == "tiny":
        big, small = ((32, 48, 40),), ((1, 48, 40),)
    elif size == "quick":
        big, small = ((4096, 4096, 4096),), ((8, 4096, 4096),)
    else:
        big = ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 14336, 4096), (8192, 151936, 4096))
        small = tuple((M, N, K) for N, K in ((4096, 4096), (14336, 4096)) for M in (1, 8, 64, 256))
    return ([Case("matmul", "fwd", f"M={M} N={N} K={K} (b [K, N])", "bfloat16", partial(_matmul, M, N, K, False, BF16))
             for M, N, K in big]
            + [Case("matmul", "fwd", f"M={M} N={N} K={K} (a @ w.t())", "bfloat16", partial(_matmul, M, N, K, True, BF16))
               for M, N, K in small])


# ---- rmsnorm / swiglu ----

def _eager_rmsnorm(x, w, residual=None, eps=1e-6):
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    y = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    return y if residual is None else (y, residual)


def _rmsnorm(N, H, residual, mode, main, dtype, device, quick) -> Bound:
    from ..ops.rmsnorm import rms_norm

    g = _gen(device, H)
    x, r, dy, dres = (_randn(g, device, N, H, dtype=dtype) for _ in range(4))
    w = (1 + 0.1 * torch.randn(H, device=device, generator=g)).to(dtype)
    args = (x, w, r) if residual else (x, w)
    wrt, grads = tuple(range(len(args))), ((dy, dres) if residual else (dy,))

    def ours(*a):
        return rms_norm(a[0], a[1], residual=a[2] if residual else None)

    def liger():
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        return _call(mode, lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6), args, wrt, grads)

    b = _Baselines(quick, main)
    b.add("torch eager RMSNorm (fp32 math)", "eager", _call(mode, _eager_rmsnorm, args, wrt, grads))
    b.compiled("torch.compile RMSNorm", lambda: _call(mode, torch.compile(_eager_rmsnorm), args, wrt, grads))
    if not residual:  # Liger's RMSNorm has no fused residual add
        b.optional("Liger LigerRMSNormFunction", "liger", liger)
    # passes of [N, H]: fwd reads x (+ residual), writes y (+ the sum); bwd reads h, dy (+ d sum),
    # writes dx (+ d residual). The weight, rstd and dW partials are < 2% and not counted.
    passes = {("fwd", False): 2, ("fwd", True): 4, ("fwd+bwd", False): 5, ("fwd+bwd", True): 9}[mode, residual]
    return b.bound(_call(mode, ours, args, wrt, grads), "copy", passes * _nbytes(x), dtype)


def _rmsnorm_cases(size):
    N, Hs = {"full": (16384, (4096, 8192)), "quick": (4096, (4096,)), "tiny": (4, (64,))}[size]
    return [Case("rmsnorm", mode, f"[{N} x {H}]{' +residual' if res else ''}", "bfloat16",
                 partial(_rmsnorm, N, H, res, mode, H == Hs[0], BF16))
            for H in Hs for res in (False, True) for mode in ("fwd", "fwd+bwd")]


def _eager_swiglu(gate, up):
    return F.silu(gate.float()).mul(up.float()).to(gate.dtype)


def _swiglu(N, I, mode, dtype, device, quick) -> Bound:
    from ..ops.swiglu import swiglu

    g = _gen(device, I)
    gate = _randn(g, device, N, I, dtype=dtype, scale=2.0)
    up, dy = (_randn(g, device, N, I, dtype=dtype) for _ in range(2))
    args, wrt, grads = (gate, up), (0, 1), (dy,)

    def liger():
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return _call(mode, LigerSiLUMulFunction.apply, args, wrt, grads)

    b = _Baselines(quick)
    b.add("torch eager silu(gate) * up (fp32 math)", "eager", _call(mode, _eager_swiglu, args, wrt, grads))
    b.compiled("torch.compile silu(gate) * up", lambda: _call(mode, torch.compile(_eager_swiglu), args, wrt, grads))
    b.optional("Liger LigerSiLUMulFunction", "liger", liger)
    passes = 3 if mode == "fwd" else 8  # fwd: gate, up, y; bwd: dy, gate, up, d gate, d up
    return b.bound(_call(mode, swiglu, args, wrt, grads), "copy", passes * _nbytes(gate), dtype)


def _swiglu_cases(size):
    N, I = {"full": (16384, 14336), "quick": (4096, 14336), "tiny": (4, 64)}[size]
    return [Case("swiglu", mode, f"[{N} x {I}]", "bfloat16", partial(_swiglu, N, I, mode, BF16))
            for mode in ("fwd", "fwd+bwd")]


# ---- rope / embedding ----

def _rope(T, H, HK, D, mode, dtype, device, quick) -> Bound:
    from ..ops.rope import apply_rope, rope_tables

    P = 8 * T
    g = _gen(device, T)
    q, k = _randn(g, device, T, H, D, dtype=dtype), _randn(g, device, T, HK, D, dtype=dtype)
    grads = (torch.randn_like(q), torch.randn_like(k))
    pos = torch.randint(0, P, (T,), device=device, generator=g)
    cos, sin = rope_tables(P, D, base=500000.0, device=device)
    cos_full, sin_full = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # transformers' [P, D] tables

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1)

    def eager(q, k):  # transformers' apply_rotary_pos_emb, cos / sin gathered per call
        c, s = cos_full[pos].to(q.dtype)[:, None], sin_full[pos].to(q.dtype)[:, None]
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    b = _Baselines(quick)
    b.add("torch eager rotate_half (transformers)", "eager", _call(mode, eager, (q, k), (0, 1), grads))
    b.compiled("torch.compile rotate_half", lambda: _call(mode, torch.compile(eager), (q, k), (0, 1), grads))
    ours = partial(apply_rope, cos=cos, sin=sin, position_ids=pos, validate=False)
    passes = 1 if mode == "fwd" else 2  # read + write q and k, once per direction
    return b.bound(_call(mode, ours, (q, k), (0, 1), grads), "copy", passes * 2 * _nbytes(q, k), dtype)


def _rope_cases(size):
    T, H, HK, D = {"full": (16384, 32, 8, 128), "quick": (4096, 32, 8, 128), "tiny": (8, 2, 1, 16)}[size]
    return [Case("rope", mode, f"[{T} tokens x {H}+{HK} heads x {D}]", "bfloat16",
                 partial(_rope, T, H, HK, D, mode, BF16)) for mode in ("fwd", "fwd+bwd")]


def _embedding(N, V, H, mode, dtype, device, quick) -> Bound:
    from ..ops.embedding import embedding

    g = _gen(device, N)
    w = _randn(g, device, V, H, dtype=dtype)
    ids = torch.randint(0, V, (N,), device=device, generator=g)
    grads = (_randn(g, device, N, H, dtype=dtype),)
    b = _Baselines(quick)
    b.add("torch F.embedding", "eager", _call(mode, F.embedding, (ids, w), (1,), grads))
    rows = N * H * w.element_size()
    # fwd reads the rows and writes the output; bwd reads d out and writes all of dW
    work = 2 * rows if mode == "fwd" else 3 * rows + _nbytes(w)
    ours = partial(embedding, validate=False)
    return b.bound(_call(mode, ours, (ids, w), (1,), grads), "copy", work, dtype)


def _embedding_cases(size):
    N, V, H = {"full": (16384, 151936, 4096), "quick": (4096, 151936, 4096), "tiny": (8, 50, 16)}[size]
    return [Case("embedding", mode, f"{N} tokens of [{V} x {H}]", "bfloat16", partial(_embedding, N, V, H, mode, BF16))
            for mode in ("fwd", "fwd+bwd")]


# ---- attention ----

def _attention(B, T, H, HKV, D, mode, dtype, device, quick) -> Bound:
    from ..attention import attention

    g = _gen(device, T)
    q, k, v = (_randn(g, device, B * T, h, D, dtype=dtype) for h in (H, HKV, HKV))
    dy = _randn(g, device, B * T, H, D, dtype=dtype)
    cu = torch.arange(B + 1, device=device, dtype=torch.int32) * T

    def ours(q, k, v):
        return attention(q, k, v, cu, max_seqlen=T, validate=False)

    def sdpa(q, k, v):  # [B, H, T, D] views of the packed tensors
        qs, ks, vs = (x.view(B, T, -1, D).transpose(1, 2) for x in (q, k, v))
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=HKV != H)

    b = _Baselines(quick)
    b.add("SDPA default backend (causal)", "default",
          _call(mode, sdpa, (q, k, v), (0, 1, 2), (dy.view(B, T, H, D).transpose(1, 2),)))
    flops = 2 * 2 * B * H * T * T * D / 2  # two GEMMs over half the score matrix (causal)
    return b.bound(_call(mode, ours, (q, k, v), (0, 1, 2), (dy,)), "matmul",
                   flops if mode == "fwd" else 3.5 * flops, dtype)  # the backward: 2.5x the forward's GEMMs


def _paged(k, v, B, L, page, g):
    """k / v [B * L, Hkv, D] as a paged cache on shuffled pages (the last one zero-padded) and its
    block table."""
    per = -(-L // page)
    pad = per * page - L

    def pages(x):
        x = x.view(B, L, *x.shape[1:])
        x = torch.cat([x, x.new_zeros(B, pad, *x.shape[2:])], 1) if pad else x
        return x.reshape(B * per, page, *x.shape[2:])

    bt = torch.randperm(B * per, device=k.device, generator=g).view(B, per).to(torch.int32)
    kc, vc = torch.empty_like(pages(k)), torch.empty_like(pages(v))
    kc[bt.view(-1).long()], vc[bt.view(-1).long()] = pages(k), pages(v)
    return kc, vc, bt


def _decode(B, L, Hq, Hkv, D, page_tokens, dtype, device, quick) -> Bound:
    from .. import configs
    from .._runtime import arch_of
    from ..attention import attention_decode

    bn = configs.lookup_decode(arch_of(torch.device(device)), dtype, D).block_n
    page = bn * max(1, page_tokens // bn)  # page_size must be a multiple of the locked block_n
    g = _gen(device, B)
    k, v = (_randn(g, device, B * L, Hkv, D, dtype=dtype) for _ in range(2))
    q = _randn(g, device, B, Hq, D, dtype=dtype)
    kc, vc, bt = _paged(k, v, B, L, page, g)
    lens = torch.full((B,), L, device=device, dtype=torch.int32)
    # the same keys as contiguous [B, Hkv, L, D] caches: what SDPA reads
    ks, vs = (x.view(B, L, Hkv, D).transpose(1, 2).contiguous() for x in (k, v))
    qs = q[:, :, None]
    b = _Baselines(quick)
    b.add("SDPA default backend, contiguous caches (enable_gqa)", "default",
          lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=Hq != Hkv))
    return b.bound(lambda: attention_decode(q, kc, vc, bt, lens, validate=False), "copy", _nbytes(k, v), dtype)


def _attention_cases(size):
    if size == "tiny":
        train, dec, D, dec_heads, page = ((2, 16, 2, 1),), ((2, 40),), 16, (2, 1), 1
    elif size == "quick":
        train, dec, D, dec_heads, page = ((2, 2048, 32, 8),), ((64, 1024),), 128, (16, 8), 256
    else:
        train = ((4, 8192, 32, 32), (4, 8192, 32, 8))
        dec, D, dec_heads, page = ((64, 4096), (256, 1024), (8, 32768)), 128, (16, 8), 256
    out = [Case("attention", mode, f"causal {B} x {T}, {H} q / {HKV} kv heads, D={D}", "bfloat16",
                partial(_attention, B, T, H, HKV, D, mode, BF16))
           for B, T, H, HKV in train for mode in ("fwd", "fwd+bwd")]
    Hq, Hkv = dec_heads
    return out + [Case("attention", "decode", f"{B} seqs x {L} cached, {Hq} q / {Hkv} kv heads, D={D}", "bfloat16",
                       partial(_decode, B, L, Hq, Hkv, D, page, BF16)) for B, L in dec]


# ---- RL: advantages and losses (fp32) ----

def _eager_gae(r, v, m, gamma, lam):
    """The usual framework loop (verl-style), masked tokens transparent as the library's."""
    adv = torch.zeros_like(r)
    a_next = torch.zeros(r.shape[0], device=r.device)
    v_next = torch.zeros(r.shape[0], device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        act = m[:, t]
        a = r[:, t] + gamma * v_next - v[:, t] + gamma * lam * a_next
        adv[:, t] = torch.where(act, a, 0.0)
        a_next = torch.where(act, a, a_next)
        v_next = torch.where(act, v[:, t], v_next)
    return adv, adv + v


def _gae(B, T, dtype, device, quick) -> Bound:
    from ..advantages import gae

    g = _gen(device, T)
    r, v = (torch.randn(B, T, device=device, generator=g) for _ in range(2))
    m = torch.rand(B, T, device=device, generator=g) < 0.9
    b = _Baselines(quick)
    b.add("torch eager GAE loop over T", "eager", lambda: _eager_gae(r, v, m, 0.99, 0.95))
    # reads rewards, values and the mask, writes advantages and returns
    return b.bound(lambda: gae(r, v, m, gamma=0.99, lam=0.95), "copy", _nbytes(r, v, m) + 2 * _nbytes(r), dtype)


def _eager_group(s, gid, ok, G, eps=1e-6):
    w = ok.float()
    n = torch.zeros(G, device=s.device).index_add_(0, gid, w)
    mean = torch.zeros(G, device=s.device).index_add_(0, gid, s * w) / n.clamp_min(1)
    dev = (s - mean[gid]) * w
    var = torch.zeros(G, device=s.device).index_add_(0, gid, dev * dev) / (n - 1).clamp_min(1)
    out = (s - mean[gid]) / (var.sqrt()[gid] + eps)
    return torch.where(ok & (n[gid] > 1), out, 0.0)


def _group_advantages(S, G, dtype, device, quick) -> Bound:
    from ..advantages import group_advantages

    g = _gen(device, S)
    s = torch.randn(S, device=device, generator=g)
    gid = torch.randint(0, G, (S,), device=device, generator=g)
    ok = torch.rand(S, device=device, generator=g) > 0.05
    b = _Baselines(quick)
    b.add("torch eager index_add mean / std", "eager", lambda: _eager_group(s, gid, ok, G))
    ours = partial(group_advantages, s, gid, num_groups=G, mode="mean_std", valid=ok, validate=False)
    return b.bound(ours, "copy", _nbytes(s, gid, ok) + _nbytes(s), dtype)


def _eager_ppo(logp, old, ref, adv, mask, rollout, eps=0.2, c=3.0, kl_coef=0.01, cap=2.0):
    r = torch.exp(logp - old)
    pg = torch.maximum(-adv * r, -adv * torch.clamp(r, 1 - eps, 1 + eps))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * c), pg)
    d = ref - logp
    kl = torch.exp(d) - d - 1
    w = torch.clamp(torch.exp(old - rollout), max=cap)
    return (w * (pg + kl_coef * kl) * mask).sum() / mask.sum()


def _rl_inputs(B, T, device):
    g = _gen(device, T)
    old = -torch.rand(B, T, device=device, generator=g) * 3
    logp = old + 0.05 * torch.randn(B, T, device=device, generator=g)
    ref = old + 0.05 * torch.randn(B, T, device=device, generator=g)
    rollout = old + 0.01 * torch.randn(B, T, device=device, generator=g)
    adv = torch.randn(B, T, device=device, generator=g)
    mask = torch.rand(B, T, device=device, generator=g) < 0.9
    return g, logp, old, ref, rollout, adv, mask


def _policy_loss(B, T, dtype, device, quick) -> Bound:
    from ..losses import policy_loss

    _, logp, old, ref, rollout, adv, mask = _rl_inputs(B, T, device)

    def ours(logp):  # PPO with dual clip, a k3 KL penalty and truncated importance sampling
        return policy_loss(logp, old, adv, mask=mask, dual_clip_c=3.0, ref_logp=ref, kl_coef=0.01,
                           rollout_logp=rollout, tis_cap=2.0)[0]

    fmask = mask.float()

    def eager(fn):
        return _call("fwd+bwd", lambda lp: fn(lp, old, ref, adv, fmask, rollout), (logp,), (0,))

    b = _Baselines(quick)
    b.add("torch eager PPO + KL + TIS", "eager", eager(_eager_ppo))
    b.compiled("torch.compile PPO + KL + TIS", lambda: eager(torch.compile(_eager_ppo)))
    # reads logp, old, ref, rollout, advantages and the mask, writes d logp
    return b.bound(_call("fwd+bwd", ours, (logp,), (0,)), "copy", _nbytes(logp, old, ref, rollout, adv, mask, logp),
                   dtype)


def _eager_gspo(logp, old, adv_seq, mask, eps_low=3e-4, eps_high=4e-4):
    n = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / n.clamp(min=1))
    pg = torch.maximum(-adv_seq * s, -adv_seq * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    has = n > 0
    return (pg * has).sum() / has.sum().clamp(min=1)


def _gspo_loss(B, T, dtype, device, quick) -> Bound:
    from ..losses import gspo_loss

    g, logp, old, _, _, _, mask = _rl_inputs(B, T, device)
    adv_seq = torch.randn(B, device=device, generator=g)
    fmask = mask.float()
    b = _Baselines(quick)
    b.add("torch eager GSPO", "eager", _call("fwd+bwd", lambda lp: _eager_gspo(lp, old, adv_seq, fmask), (logp,), (0,)))
    ours = _call("fwd+bwd", lambda lp: gspo_loss(lp, old, adv_seq, mask=mask)[0], (logp,), (0,))
    return b.bound(ours, "copy", _nbytes(logp, old, mask, logp), dtype)  # reads logp, old, mask; writes d logp


def _rl_cases(size):
    B, T = {"full": (64, 8192), "quick": (64, 1024), "tiny": (2, 16)}[size]
    S, G = (16, 4) if size == "tiny" else (4096, 512)
    shape = f"[{B} x {T}]"
    return {"gae": [Case("gae", "fwd", shape, "float32", partial(_gae, B, T, torch.float32))],
            "group_advantages": [Case("group_advantages", "fwd", f"{S} seqs in {G} groups", "float32",
                                      partial(_group_advantages, S, G, torch.float32))],
            "policy_loss": [Case("policy_loss", "fwd+bwd", shape + " PPO dual-clip + k3 KL + TIS", "float32",
                                 partial(_policy_loss, B, T, torch.float32))],
            "gspo_loss": [Case("gspo_loss", "fwd+bwd", shape, "float32", partial(_gspo_loss, B, T, torch.float32))]}


FAMILIES: dict[str, Callable[[str], list]] = {
    "selected_logp": _selected_logp_cases,
    "linear_logp": _linear_logp_cases,
    "matmul": _matmul_cases,
    "rmsnorm": _rmsnorm_cases,
    "swiglu": _swiglu_cases,
    "rope": _rope_cases,
    "embedding": _embedding_cases,
    "attention": _attention_cases,
    **{op: (lambda size, op=op: _rl_cases(size)[op]) for op in ("gae", "group_advantages", "policy_loss", "gspo_loss")},
}


def select(ops=None, size: str = "full") -> list[Case]:
    """The cases of the families `ops` (None: all, in FAMILIES order) at `size`."""
    from ..errors import InputError

    if size not in SIZES:
        raise InputError("size", f"must be one of {SIZES}, got {size!r}")
    ops = list(FAMILIES) if ops is None else list(ops)
    unknown = [op for op in ops if op not in FAMILIES]
    if unknown:
        raise InputError("op", f"no benchmark family {', '.join(map(repr, unknown))} (have: {', '.join(FAMILIES)})")
    return [c for op in dict.fromkeys(ops) for c in FAMILIES[op](size)]

