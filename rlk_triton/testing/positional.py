"""Parity and invariance of RoPE and embedding, judged by contracts/rope.yaml and embedding.yaml.

Shared by the tests, scripts/measure_positional.py and `rlk-triton check` (rope_harness(),
embedding_harness()). Cases are seeded and self-describing; the judges return, per output, the
ratio of the worst error to what the contract allows (<= 1 passes).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from .invariance import RowOp

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ROPE_LAYOUTS = ("contiguous", "fused_qkv", "bthd")
SCALINGS = {
    "none": None,
    "linear4": {"type": "linear", "factor": 4.0},
    "ntk8": {"type": "ntk", "factor": 8.0},
    "llama3": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
}


# ---- RoPE ----

@dataclass(frozen=True)
class RopeCase:
    tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    interleaved: bool = False
    rotary_dim: Optional[int] = None  # None = head_dim
    max_positions: int = 4096
    base: float = 10000.0
    scaling: str = "none"  # a key of SCALINGS
    scale: float = 1.0  # q, k ~ N(0, scale^2)
    layout: str = "contiguous"
    seed: int = 0

    def label(self) -> str:
        dt = contracts.dtype_name(self.dtype)
        r = self.rotary_dim or self.head_dim
        kind = "interleaved" if self.interleaved else "half"
        return (f"T={self.tokens} H={self.heads}/{self.kv_heads} D={self.head_dim} R={r} {dt} {kind} "
                f"P={self.max_positions} base={self.base:g} {self.scaling} scale={self.scale:g} {self.layout}")


@functools.lru_cache(maxsize=8)
def _tables(max_positions, rotary_dim, base, scaling, device):
    """rope_tables, cached: the sweeps reuse a few large tables (never written to)."""
    from ..ops.rope import rope_tables

    return rope_tables(max_positions, rotary_dim, base=base, scaling=SCALINGS[scaling], device=device)


def table_rows(cos, sin, position_ids):
    """(cos, sin) rows of the tokens' positions, float64 numpy [T, R/2]: the references then take
    positions arange(T) (cheaper than upcasting a whole large table)."""
    pos = position_ids.reshape(-1).long()
    return cos[pos].double().cpu().numpy(), sin[pos].double().cpu().numpy()


def build_rope_case(case: RopeCase, device):
    """(q, k as the op sees them, cos, sin, position ids as the op sees them, q / k [T, H, D] dense)."""
    gen = torch.Generator().manual_seed(case.seed)
    T, H, Hk, D = case.tokens, case.heads, case.kv_heads, case.head_dim
    q = (torch.randn(T, H, D, generator=gen) * case.scale).to(device=device, dtype=case.dtype)
    k = (torch.randn(T, Hk, D, generator=gen) * case.scale).to(device=device, dtype=case.dtype)
    pos = torch.randint(0, case.max_positions, (T,), generator=gen)
    if T > 2:  # the table's ends
        pos[0], pos[1] = 0, case.max_positions - 1
    pos = pos.to(device)
    cos, sin = _tables(case.max_positions, case.rotary_dim or D, case.base, case.scaling, str(device))
    if case.layout == "contiguous":
        q_arg, k_arg, pos_arg = q, k, pos
    elif case.layout == "fused_qkv":  # views into one [T, (H + 2 Hk) D] projection output
        buf = torch.zeros(T, (H + 2 * Hk) * D, dtype=case.dtype, device=device)
        buf[:, :H * D] = q.reshape(T, H * D)
        buf[:, H * D:(H + Hk) * D] = k.reshape(T, Hk * D)
        q_arg = buf[:, :H * D].view(T, H, D)
        k_arg = buf[:, H * D:(H + Hk) * D].view(T, Hk, D)
        pos_arg = pos
    elif case.layout == "bthd":  # [B, T, H, D] with [B, T] position ids
        if T % 2:
            raise ValueError("bthd needs an even number of tokens")
        q_arg, k_arg, pos_arg = q.view(2, T // 2, H, D), k.view(2, T // 2, Hk, D), pos.view(2, T // 2)
    else:
        raise ValueError(f"unknown layout {case.layout!r}")
    return q_arg, k_arg, cos, sin, pos_arg, q, k


def judge_rope(case: RopeCase, device, with_grad=True, backend="triton") -> dict:
    """{output: ratio of the worst error to the contract bound}: q, k, grad_q, grad_k."""
    from ..ops.rope import apply_rope
    from ..reference.rope_embedding import rope_grad_reference, rope_reference, rope_scale

    if backend != "triton":
        raise ValueError(f"rope has no backend {backend!r}")
    arch = arch_of(torch.device(device))
    q_arg, k_arg, cos, sin, pos_arg, q, k = build_rope_case(case, device)
    ql = q_arg.detach().requires_grad_(with_grad)
    kl = k_arg.detach().requires_grad_(with_grad)
    q_rot, k_rot = apply_rope(ql, kl, cos, sin, pos_arg, interleaved=case.interleaved)
    c64, s64 = table_rows(cos, sin, pos_arg)
    T = case.tokens
    p64 = np.arange(T)
    fwd = contracts.judgment("rope", case.dtype, "forward_accuracy", arch)["outputs"]
    out = {}
    for name, x, y in (("q", q, q_rot), ("k", k, k_rot)):
        x64 = x.double().cpu().numpy()
        ref = rope_reference(x64, c64, s64, p64, case.interleaved)
        ours = y.detach().reshape(T, -1, case.head_dim).double().cpu().numpy()
        out[name] = contracts.scaled_abs_ratio(ours, ref, rope_scale(x64, c64, s64, p64, case.interleaved), fwd[name])
    if with_grad:
        gen = torch.Generator().manual_seed(case.seed + 1)
        gq = torch.randn(q_rot.shape, generator=gen).to(device=device, dtype=case.dtype)
        gk = torch.randn(k_rot.shape, generator=gen).to(device=device, dtype=case.dtype)
        ((q_rot * gq).sum() + (k_rot * gk).sum()).backward()
        bound = contracts.judgment("rope", case.dtype, "gradient_accuracy", arch)
        for name, g, leaf in (("grad_q", gq, ql), ("grad_k", gk, kl)):
            g64 = g.reshape(T, -1, case.head_dim).double().cpu().numpy()
            ref = rope_grad_reference(g64, c64, s64, p64, case.interleaved)
            sens = rope_scale(g64, c64, s64, p64, case.interleaved)
            ours = leaf.grad.reshape(T, -1, case.head_dim).double().cpu().numpy()
            out[name] = contracts.rounding_plus_sensitivity_ratio(ours, ref, sens, bound)
    return out


def rope_parity_cases(on_gpu: bool) -> list:
    T, P = (257, 131072) if on_gpu else (12, 4096)
    out = []
    for i, dtype in enumerate(DTYPES):
        for interleaved in (False, True):
            out.append(RopeCase(T, 4, 2, 64, dtype, interleaved, None, P, 10000.0, "none", 1.0, "contiguous",
                                seed=10 * i + interleaved))
        out.append(RopeCase(T, 4, 2, 64, dtype, False, 32, P, 500000.0, "llama3", 30.0, "fused_qkv", seed=10 * i + 2))
        out.append(RopeCase(T, 3, 1, 48, dtype, True, None, P, 10000.0, "linear4", 1.0, "bthd", seed=10 * i + 3))
    return out


def rope_row_op(heads, kv_heads, head_dim, dtype, device, interleaved=False, rotary_dim=None,
                max_positions=4096) -> RowOp:
    """apply_rope as a RowOp over tokens: inputs (q [n, H, D], k [n, Hk, D], positions [n])."""
    from ..ops.rope import apply_rope, rope_tables

    cos, sin = rope_tables(max_positions, rotary_dim or head_dim, base=10000.0, device=device)

    def make_rows(n, gen):
        q = torch.randn(n, heads, head_dim, generator=gen).to(device=device, dtype=dtype)
        k = torch.randn(n, kv_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
        return q, k, torch.randint(0, max_positions, (n,), generator=gen).to(device)

    def forward(q, k, pos):
        return apply_rope(q, k, cos, sin, pos, interleaved=interleaved)

    def padding(n, gen):  # what a padded batch holds: zeros at position 0
        return (torch.zeros(n, heads, head_dim, dtype=dtype, device=device),
                torch.zeros(n, kv_heads, head_dim, dtype=dtype, device=device),
                torch.zeros(n, dtype=torch.long, device=device))

    kind = "interleaved" if interleaved else "half"
    return RowOp(f"rope.triton[H={heads}/{kv_heads},D={head_dim},R={rotary_dim or head_dim},{kind},"
                 f"{contracts.dtype_name(dtype)}]", forward, make_rows, grad_inputs=(0, 1), make_padding=padding)


def probe_rope(backend, device):
    for dt in (torch.bfloat16, torch.float32):
        ratios = judge_rope(RopeCase(6, 2, 1, 32, dt, seed=1), device, backend=backend)
        if max(ratios.values()) > 1.0:
            raise AssertionError(f"probe result outside the contract: error / bound {ratios}")


# ---- embedding ----

@dataclass(frozen=True)
class EmbeddingCase:
    tokens: int
    V: int
    H: int
    dtype: torch.dtype
    padding_idx: Optional[int] = None
    duplicates: str = "uniform"  # "uniform" ids, or "heavy": most tokens share a few ids
    layout: str = "contiguous"  # or "row_stride": the weight is a column slice of a wider buffer
    scale: float = 1.0
    seed: int = 0

    def label(self) -> str:
        return (f"N={self.tokens} V={self.V} H={self.H} {contracts.dtype_name(self.dtype)} pad={self.padding_idx} "
                f"{self.duplicates} scale={self.scale:g} {self.layout}")


def make_ids(n, V, duplicates, gen):
    ids = torch.randint(0, V, (n,), generator=gen)
    if duplicates == "heavy" and n:  # three hot ids take ~80% of the tokens
        hot = torch.randint(0, V, (3,), generator=gen)
        pick = torch.rand(n, generator=gen) < 0.8
        ids = torch.where(pick, hot[torch.randint(0, 3, (n,), generator=gen)], ids)
    return ids


def build_embedding_case(case: EmbeddingCase, device):
    """(token_ids, weight as the op sees it, upstream gradient [N, H])."""
    gen = torch.Generator().manual_seed(case.seed)
    dense = (torch.randn(case.V, case.H, generator=gen) * case.scale).to(case.dtype)
    ids = make_ids(case.tokens, case.V, case.duplicates, gen)
    if case.padding_idx is not None and case.tokens > 2:
        ids[::5] = case.padding_idx % case.V
    grad = (torch.randn(case.tokens, case.H, generator=gen) * case.scale).to(case.dtype)
    if case.layout == "contiguous":
        weight = dense.to(device)
    elif case.layout == "row_stride":
        buf = torch.zeros(case.V, case.H + 24, dtype=case.dtype)
        buf[:, 8:8 + case.H] = dense
        weight = buf.to(device)[:, 8:8 + case.H]
    else:
        raise ValueError(f"unknown layout {case.layout!r}")
    return ids.to(device), weight, grad.to(device)


def judge_embedding(case: EmbeddingCase, device, with_grad=True, backend="triton") -> dict:
    """{output: ratio of the worst error to the contract bound}: out, grad_weight."""
    from ..ops.embedding import embedding
    from ..reference.rope_embedding import embedding_grad_reference, embedding_reference

    if backend != "triton":
        raise ValueError(f"embedding has no backend {backend!r}")
    arch = arch_of(torch.device(device))
    ids, weight, grad = build_embedding_case(case, device)
    leaf = weight.detach().requires_grad_(with_grad)
    out = embedding(ids, leaf, padding_idx=case.padding_idx)
    w64 = weight.double().cpu().numpy()
    ref = embedding_reference(ids.cpu().numpy(), w64)
    fwd = contracts.judgment("embedding", case.dtype, "forward_accuracy", arch)["outputs"]["out"]
    ratios = {"out": contracts.scaled_abs_ratio(out.detach().double().cpu().numpy(), ref, np.abs(ref), fwd)}
    if with_grad:
        out.backward(grad)
        g64 = grad.double().cpu().numpy()
        ref_dw, sens = embedding_grad_reference(g64, ids.cpu().numpy(), case.V, case.padding_idx)
        bound = contracts.judgment("embedding", case.dtype, "gradient_accuracy", arch)
        ratios["grad_weight"] = contracts.rounding_plus_sensitivity_ratio(
            leaf.grad.double().cpu().numpy(), ref_dw, sens, bound)
    return ratios


def embedding_parity_cases(on_gpu: bool) -> list:
    N, V, H = (4096, 151936, 1024) if on_gpu else (96, 50, 40)
    out = []
    for i, dtype in enumerate(DTYPES):
        out.append(EmbeddingCase(N, V, H, dtype, None, "uniform", "contiguous", 1.0, seed=10 * i))
        out.append(EmbeddingCase(N, V, H, dtype, 0, "heavy", "row_stride", 30.0, seed=10 * i + 1))
    return out


def embedding_row_op(V, H, dtype, device, padding_idx=None) -> RowOp:
    """embedding as a RowOp over tokens: input (token_ids [n]); the weight is shared, so dW (a sum
    over tokens) is not a row output: tests/test_embedding.py checks its order and independence."""
    from ..ops.embedding import embedding

    weight = torch.randn(V, H, generator=torch.Generator().manual_seed(V + H)).to(device=device, dtype=dtype)

    def make_rows(n, gen):
        return (torch.randint(0, V, (n,), generator=gen).to(device),)

    def padding(n, gen):
        return (torch.full((n,), 0 if padding_idx is None else padding_idx % V, dtype=torch.long, device=device),)

    def forward(ids):
        return (embedding(ids, weight, padding_idx=padding_idx),)

    return RowOp(f"embedding.triton[V={V},H={H},{contracts.dtype_name(dtype)},pad={padding_idx}]", forward, make_rows,
                 make_padding=padding)


def probe_embedding(backend, device):
    for dt in (torch.bfloat16, torch.float32):
        ratios = judge_embedding(EmbeddingCase(16, 11, 24, dt, 0, "heavy", seed=1), device, backend=backend)
        if max(ratios.values()) > 1.0:
            raise AssertionError(f"probe result outside the contract: error / bound {ratios}")


# ---- harness entries (rlk_triton/testing/harness.py) ----

def rope_harness():
    from .harness import Harness

    def row_ops(device, on_gpu):
        shapes = ((32, 8, 128), (4, 2, 64)) if on_gpu else ((4, 2, 32),)
        return [rope_row_op(h, hk, d, dt, device, interleaved=il, rotary_dim=r)
                for (h, hk, d) in shapes for dt in DTYPES for il, r in ((False, None), (True, d // 2))]

    return Harness("rope", rope_parity_cases, judge_rope, row_ops, probe_rope)


def embedding_harness():
    from .harness import Harness

    def row_ops(device, on_gpu):
        sizes = ((151936, 4096), (1000, 64)) if on_gpu else ((50, 40),)
        return [embedding_row_op(V, H, dt, device, padding_idx=p) for (V, H) in sizes for dt in DTYPES
                for p in (None, 0)]

    return Harness("embedding", embedding_parity_cases, judge_embedding, row_ops, probe_embedding)
