"""attention against the float64 reference, judged by contracts/attention.yaml.

Error model behind the judgments (docs/attention.md). With S_ij = scale * sum_d |q_id k_jd| (the size
of score s_ij's fp32 dot product, hence of its rounding error) and p the float64 probabilities:
- lse: an fp32 log-sum-exp of scores of size S; row_scale_lse[h, i] = max_j S_ij + log(n_i), n_i the
  visible keys (as selected_logp's row_scale for logits).
- out: p is rounded to the operands' dtype before p @ v (relative u_dtype per term), out rounded once
  at the store, and the score errors (~u_fp32 S_ij) move p by a relative S_ij u_fp32; so
  row_scale_out[i, h, d] = (1 + max_j S_ij) * sum_j p_ij |v_jd| bounds every error term, and
  rtol is a small multiple of the dtype's unit roundoff.
- gradients (rounding_plus_sensitivity): ds = p (dp - delta) is built from dp = dO . v (fp32 dot,
  error ~ u A_ij, A_ij = sum_d |dO_id v_jd|), delta = rowsum(dO * O) - dlse from the stored, rounded
  O (error ~ u_dtype B_i, B_i = sum_d |dO_id O_id|), and p (relative error ~ u S_ij); p and ds are
  rounded to the operands' dtype before the dots. Per term
      T_ij = p_ij (A_ij + B_i + |dlse_i| + (1 + S_ij) |dp_ij - delta_i|),
  sensitivity dq_i = scale sum_j T_ij |k_j|, dk_j = scale sum_{h in group, i} T_ij |q_i|,
  dv_j = sum_{h in group, i} p_ij (1 + S_ij) |dO_i|; row_rtol is then a small multiple of u_dtype.
- p and T count at least ROUNDING_FLOOR / u_dtype (visible pairs only): a p below fp16's normal
  range rounds with an absolute error of half the smallest subnormal, not a relative u.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import contracts
from .._runtime import arch_of
from .invariance import RowOp
from .linear_parity import ROUNDING_FLOOR, UNIT_ROUNDOFF


@dataclass(frozen=True)
class AttentionCase:
    seqlens: tuple
    Hq: int
    Hkv: int
    D: int
    dtype: torch.dtype
    causal: bool = True
    sigma: float = 1.0  # q, k, v ~ N(0, sigma^2): sigma 3 gives peaked softmax rows
    with_dlse: bool = True
    seed: int = 0

    def label(self) -> str:
        return (f"seqlens={list(self.seqlens)} Hq={self.Hq} Hkv={self.Hkv} D={self.D} "
                f"{contracts.dtype_name(self.dtype)} causal={self.causal} sigma={self.sigma}")


def cu_of(seqlens, device):
    return torch.tensor([0] + list(np.cumsum(seqlens)), dtype=torch.int32, device=device)


def build_attention_case(case: AttentionCase, device):
    gen = torch.Generator().manual_seed(case.seed)
    N = int(sum(case.seqlens))
    q = torch.randn(N, case.Hq, case.D, generator=gen) * case.sigma
    k = torch.randn(N, case.Hkv, case.D, generator=gen) * case.sigma
    v = torch.randn(N, case.Hkv, case.D, generator=gen)
    dout = torch.randn(N, case.Hq, case.D, generator=gen)
    dlse = torch.randn(case.Hq, N, generator=gen) if case.with_dlse else None
    return tuple(x.to(device, case.dtype) for x in (q, k, v)) + (cu_of(case.seqlens, device), dout, dlse)


def _scales(q, k, v, dout, dlse, cu, scale, causal, out64, dtype):
    """(row_scale_out, row_scale_lse, sens dq, sens dk, sens dv) per the module docstring. p and ds
    terms count at least floor / u (ROUNDING_FLOOR): rounding a tiny p to fp16 costs an absolute
    2^-25, not a relative u."""
    from ..reference.attention import _softmax, sequence_scores

    N, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    dt = contracts.dtype_name(dtype)
    fl = ROUNDING_FLOOR[dt] / UNIT_ROUNDOFF[dt]
    so, sl = np.zeros((N, Hq, D)), np.zeros((Hq, N))
    sq, sk, sv = np.zeros((N, Hq, D)), np.zeros((N, Hkv, D)), np.zeros((N, Hkv, D))
    for a, b in zip(cu[:-1], cu[1:]):
        if b == a:
            continue
        L = b - a
        s, vis = sequence_scores(q[a:b], k[a:b], scale, causal)
        p, _ = _softmax(s)
        pf = np.where(vis[None], np.maximum(p, fl), 0.0)  # p with the rounding floor
        kk, vv = np.repeat(np.abs(k[a:b]), G, 1), np.repeat(np.abs(v[a:b]), G, 1)
        S = np.where(vis[None], scale * np.einsum("ihd,jhd->hij", np.abs(q[a:b]), kk), 0.0)
        Smax = S.max(-1)  # [Hq, L]
        pv = np.einsum("hij,jhd->ihd", pf, vv)
        so[a:b] = (1 + Smax.T[:, :, None]) * pv
        sl[:, a:b] = Smax + np.log(vis.sum(-1))[None, :]
        if dout is None:
            continue
        do = dout[a:b]
        A = np.einsum("ihd,jhd->hij", np.abs(do), vv)
        B = np.einsum("ihd,ihd->hi", np.abs(do), np.abs(out64[a:b])) + np.abs(dlse[:, a:b])
        dp = np.einsum("ihd,jhd->hij", do, np.repeat(v[a:b], G, 1))
        delta = np.einsum("ihd,ihd->hi", do, out64[a:b]) - dlse[:, a:b]
        T = np.where(vis[None], np.maximum(p * (A + B[:, :, None] + (1 + S) * np.abs(dp - delta[:, :, None])), fl),
                     0.0)
        sq[a:b] = scale * np.einsum("hij,jhd->ihd", T, kk)
        sk[a:b] = (scale * np.einsum("hij,ihd->jhd", T, np.abs(q[a:b]))).reshape(L, Hkv, G, D).sum(2)
        sv[a:b] = np.einsum("hij,ihd->jhd", pf * (1 + S), np.abs(do)).reshape(L, Hkv, G, D).sum(2)
    return so, sl, sq, sk, sv


def attention_errors(case: AttentionCase, device, with_grad=True) -> dict:
    """{name: (ours, ref64, scale or sensitivity)} for out, lse and (with_grad) dq, dk, dv."""
    from ..attention import attention
    from ..reference.attention import attention_grad_reference, attention_reference

    q, k, v, cu, dout, dlse = build_attention_case(case, device)
    leaves = [x.detach().clone().requires_grad_(with_grad) for x in (q, k, v)]
    out, lse = attention(*leaves, cu, causal=case.causal)
    scale = 1.0 / case.D ** 0.5
    res = {"out": out.detach(), "lse": lse.detach()}
    if with_grad:
        total = (out.float() * dout.float().to(device)).sum()
        if dlse is not None:
            total = total + (lse * dlse.float().to(device)).sum()
        total.backward()
        res.update({"dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad})
    q64, k64, v64 = (x.double().cpu().numpy() for x in (q, k, v))
    cu64 = cu.cpu().numpy().astype(np.int64)
    do64 = dout.double().cpu().numpy()
    dl64 = dlse.double().cpu().numpy() if dlse is not None else np.zeros((case.Hq, q.shape[0]))
    out64, lse64 = attention_reference(q64, k64, v64, cu64, scale, case.causal)
    so, sl, sq, sk, sv = _scales(q64, k64, v64, do64 if with_grad else None, dl64, cu64, scale, case.causal, out64,
                                 case.dtype)
    errors = {"out": (res["out"].double().cpu().numpy(), out64, so),
              "lse": (res["lse"].double().cpu().numpy(), lse64, sl)}
    if with_grad:
        refs = attention_grad_reference(q64, k64, v64, cu64, scale, case.causal, do64,
                                        dl64 if dlse is not None else None)
        for name, ref, sens in zip(("dq", "dk", "dv"), refs, (sq, sk, sv)):
            errors[name] = (res[name].double().cpu().numpy(), ref, sens)
    return errors


def judge_errors(errors: dict, dtype, arch) -> dict:
    fwd = contracts.judgment("attention", dtype, "forward_accuracy", arch)["outputs"]
    bound = contracts.judgment("attention", dtype, "gradient_accuracy", arch)
    out = {}
    for name, (ours, ref, scale) in errors.items():
        if name in fwd:
            out[name] = contracts.scaled_abs_ratio(ours, ref, scale, fwd[name])
        else:
            out[name] = contracts.rounding_plus_sensitivity_ratio(ours, ref, scale, bound)
    return out


def judge_attention(case: AttentionCase, device, with_grad=True) -> dict:
    """{out / lse / dq / dk / dv: worst error / contract bound} (<= 1 passes)."""
    return judge_errors(attention_errors(case, device, with_grad), case.dtype, arch_of(torch.device(device)))


def measured_ratio(name, ours, ref, scale, dtype) -> float:
    """What the contract numbers are set from: forward worst |err| / scale; gradients worst
    (|err| - u_dtype |ref|) / sensitivity (scripts/measure_attention.py)."""
    err = np.abs(ours - ref)
    err = np.where(ours == ref, 0.0, err)  # equal infinities (-inf lse of empty rows)
    if name in ("out", "lse"):
        return float(np.max(np.where(err == 0, 0.0, err / np.where(scale > 0, scale, 1.0)), initial=0.0))
    u = UNIT_ROUNDOFF[contracts.dtype_name(dtype)]
    return float(np.max(np.maximum(err - u * np.abs(ref), 0) / np.where(scale > 0, scale, 1.0), initial=0.0))


def attention_row_op(L, Hq, Hkv, D, dtype, device, causal=True) -> RowOp:
    """attention as a RowOp whose rows are whole sequences of L tokens: inputs q [n, L, Hq, D],
    k / v [n, L, Hkv, D] are packed (cu_seqlens = L * arange) and the outputs unpacked: out
    [n, L, Hq, D], lse [n, L, Hq]. Padding rows are all-zero sequences."""
    from ..attention import attention

    def make_rows(n, gen):
        return (torch.randn(n, L, Hq, D, generator=gen).to(device, dtype),
                torch.randn(n, L, Hkv, D, generator=gen).to(device, dtype),
                torch.randn(n, L, Hkv, D, generator=gen).to(device, dtype))

    def forward(q, k, v):
        n = q.shape[0]
        cu = torch.arange(n + 1, dtype=torch.int32, device=q.device) * L
        out, lse = attention(q.reshape(n * L, Hq, D), k.reshape(n * L, Hkv, D), v.reshape(n * L, Hkv, D), cu,
                             max_seqlen=L, causal=causal)
        return out.reshape(n, L, Hq, D), lse.t().reshape(n, L, Hq)

    return RowOp(f"attention[L={L},Hq={Hq},Hkv={Hkv},D={D},{contracts.dtype_name(dtype)}]", forward, make_rows,
                 grad_inputs=(0, 1, 2))


def attention_harness():
    """How `rlk-triton check` checks attention's claims (rlk_triton/operators.py)."""
    from .harness import Harness

    def cases(on_gpu):
        shapes = [((1000, 37, 2048), 32, 8, 128), ((513, 64), 16, 16, 64)] if on_gpu else \
            [((37, 13), 4, 2, 16)]
        return [AttentionCase(sl, hq, hkv, d, dt, causal, sigma, seed=i)
                for sl, hq, hkv, d in shapes
                for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32))
                for causal, sigma in ((True, 1.0), (False, 2.0))]

    def judge(case, device, backend="triton"):
        if backend != "triton":
            raise ValueError(f"attention has no backend {backend!r}")
        return judge_attention(case, device)

    def row_ops(device, on_gpu):
        L, Hq, Hkv, D = (300, 8, 2, 128) if on_gpu else (19, 2, 1, 16)
        return [attention_row_op(L, Hq, Hkv, D, dt, device) for dt in (torch.bfloat16, torch.float32)]

    def probe(backend, device):
        ratios = judge(AttentionCase((9, 4), 2, 1, 16, torch.float32, seed=1), device, backend)
        if max(ratios.values()) > 1.0:
            raise AssertionError(f"probe result outside the contract: error / bound {ratios}")

    return Harness("attention", cases, judge, row_ops, probe)
