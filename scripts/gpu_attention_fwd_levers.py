"""Hopper levers for the attention forward, measured one at a time against the locked kernel (issue 18).

Each variant is the training forward of rlk_triton/ops/attention.py (no context-parallel state) with
one or more of:
  flat   one query tile per program (the grid covers the longest sequence; no grid-stride loop);
  rev    query tiles in reverse order inside a sequence, so the heaviest causal tiles start first;
  tma    K and V read through host TMA descriptors over [N, Hkv * D] (needs a unit head stride of D);
         in the masked loop the V rows past the sequence's end are zeroed (they are another
         sequence's tokens, which the pointer loads never read);
  ws     warp specialization of the unmasked KV loop (tl.range(..., warp_specialize=True));
  fma    scores scaled inside the exp2's argument (one FMA: qk * scale - m) and the row max taken
         on the unscaled scores: ANOTHER ROUNDING, so another bit class (speed and size of the change
         only);
  bn128  block_n 128: another reduction order (speed only).
Variants without fma / bn128 must give the locked kernel's bits: the script checks torch.equal on
out and lse for every one and reports it.

    python scripts/gpu_attention_fwd_levers.py --out levers.json --commit <sha> [--time-box 400]
    python scripts/gpu_attention_fwd_levers.py --smoke   # CPU interpreter, tiny shapes: the plumbing
"""
import argparse
import json
import os
import sys
import time

if "--smoke" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from rlk_triton import configs  # noqa: E402
from rlk_triton.ops import attention as ops  # noqa: E402
from rlk_triton.ops.attention import (_load_rows, _lowp, _qk, _span, attn_block_update,  # noqa: E402
                                      attn_finalize)
from rlk_triton.ops.matmul import mma, operand_flags  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None


@triton.jit
def _update_fma(q, k, v, m, l, acc, qk_scale, valid, DT: tl.constexpr, UPCAST: tl.constexpr,
                IEEE: tl.constexpr, MASKED: tl.constexpr):
    qk = _qk(q, k, IEEE)
    if MASKED:
        qk = tl.where(valid, qk, float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, 1) * qk_scale)  # rounding is monotonic: = max of the scaled scores
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk * qk_scale - shift[:, None])
    alpha = tl.exp2(m - shift)
    l = l * alpha + tl.sum(p, 1)
    acc = mma(_lowp(p, DT, UPCAST), v, acc * alpha[:, None], IEEE)
    return m_new, l, acc


@triton.jit
def _kv(k_head, v_head, kd, vd, start, n0, hk, hi, sk_t, sv_t, rd, MASKED: tl.constexpr,
        TMA: tl.constexpr, UPCAST: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    rn = n0 + tl.arange(0, BLOCK_N)
    col_ok = rn < hi
    if TMA:
        k = kd.load([start + n0, hk * HEAD_DIM])
        v = vd.load([start + n0, hk * HEAD_DIM])
        if MASKED:  # rows past the sequence: another sequence's tokens (the pointer loads read 0)
            k = tl.where(col_ok[:, None], k, 0.0)
            v = tl.where(col_ok[:, None], v, 0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
    else:
        k = _load_rows(k_head, start + rn, col_ok, sk_t, rd, UPCAST)
        v = _load_rows(v_head, start + rn, col_ok, sv_t, rd, UPCAST)
    return k, v


@triton.jit
def _fwd_var(q_ptr, k_ptr, v_ptr, kd, vd, out_ptr, lse_ptr, cu_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t,
             so_h, slse_h, qk_scale, N, n_mb,
             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, REV: tl.constexpr, TMA: tl.constexpr,
             WS: tl.constexpr, FMA: tl.constexpr):
    seq = tl.program_id(1)
    h = tl.program_id(2)
    start, seq_len = _span(cu_ptr, seq, N)
    mb = tl.program_id(0)
    if REV:  # the longest sequence's last tile first: causal tiles grow with mb
        mb = n_mb - 1 - mb
    if mb * BLOCK_M < seq_len:
        hk = h // GROUP
        rm = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rd = tl.arange(0, HEAD_DIM)
        row_ok = rm < seq_len
        tok = start + rm
        q = _load_rows(q_ptr + h * sq_h, tok, row_ok, sq_t, rd, UPCAST)
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
        hi = tl.minimum((mb + 1) * BLOCK_M, seq_len)
        k_head = k_ptr + hk * sk_h
        v_head = v_ptr + hk * sv_h
        whole = tl.minimum(hi, mb * BLOCK_M + 1) // BLOCK_N * BLOCK_N
        DT = v_ptr.dtype.element_ty
        for n0 in tl.range(0, whole, BLOCK_N, warp_specialize=WS):
            k, v = _kv(k_head, v_head, kd, vd, start, n0, hk, hi, sk_t, sv_t, rd, False, TMA, UPCAST,
                       HEAD_DIM, BLOCK_N)
            if FMA:
                m, l, acc = _update_fma(q, k, v, m, l, acc, qk_scale, None, DT, UPCAST, IEEE, False)
            else:
                m, l, acc = attn_block_update(q, k, v, m, l, acc, qk_scale, None, DT, UPCAST, IEEE, False)
        for n0 in range(whole, hi, BLOCK_N):
            k, v = _kv(k_head, v_head, kd, vd, start, n0, hk, hi, sk_t, sv_t, rd, True, TMA, UPCAST,
                       HEAD_DIM, BLOCK_N)
            rn = n0 + tl.arange(0, BLOCK_N)
            valid = (rn[None, :] < hi) & (rn[None, :] <= rm[:, None])
            if FMA:
                m, l, acc = _update_fma(q, k, v, m, l, acc, qk_scale, valid, DT, UPCAST, IEEE, True)
            else:
                m, l, acc = attn_block_update(q, k, v, m, l, acc, qk_scale, valid, DT, UPCAST, IEEE, True)
        out, lse = attn_finalize(m, l, acc)
        tl.store(out_ptr + tok.to(tl.int64)[:, None] * so_t + h * so_h + rd[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.store(lse_ptr + h * slse_h + tok, lse, mask=row_ok)


def launch_var(q, k, v, cu, max_seqlen, scale, cfg, rev=False, tma=False, ws=False, fma=False):
    """The causal training forward with the given levers (see the module doc)."""
    N, Hq, D = q.shape
    Hkv = k.shape[1]
    S = cu.numel() - 1
    out = torch.empty_like(q)
    lse = torch.empty((Hq, N), dtype=torch.float32, device=q.device)
    upcast, ieee = operand_flags(q.dtype)
    n_mb = triton.cdiv(max_seqlen, cfg.block_m)
    if tma:
        assert k.stride(1) == D and v.stride(1) == D and k.stride(2) == 1
        kd = TensorDescriptor(k, [N, Hkv * D], [k.stride(0), 1], [cfg.block_n, D])
        vd = TensorDescriptor(v, [N, Hkv * D], [v.stride(0), 1], [cfg.block_n, D])
    else:
        kd = vd = k  # unused
    _fwd_var[(n_mb, S, Hq)](
        q, k, v, kd, vd, out, lse, cu, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), out.stride(1), lse.stride(0), scale * ops.LOG2E, N, n_mb,
        GROUP=Hq // Hkv, HEAD_DIM=D, UPCAST=upcast, IEEE=ieee, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        REV=rev, TMA=tma, WS=ws, FMA=fma, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse


VARIANTS = {  # name: (levers, config override (block_m, block_n, warps, stages) or None)
    "flat": (dict(), None),
    "flat rev": (dict(rev=True), None),
    "tma rev": (dict(rev=True, tma=True), None),
    "tma rev s2": (dict(rev=True, tma=True), "s2"),
    "tma rev s4": (dict(rev=True, tma=True), "s4"),
    "ws rev": (dict(rev=True, ws=True), None),
    "tma ws rev": (dict(rev=True, tma=True, ws=True), None),
    "fma rev": (dict(rev=True, fma=True), None),
    "tma fma rev": (dict(rev=True, tma=True, fma=True), None),
    "tma ws fma rev": (dict(rev=True, tma=True, ws=True, fma=True), None),
    "tma rev bn128": (dict(rev=True, tma=True), "bn128"),
    "tma fma rev bn128": (dict(rev=True, tma=True, fma=True), "bn128"),
}
SAME_BITS = {n for n, (lv, c) in VARIANTS.items() if not lv.get("fma") and c != "bn128"}


def _cfg(locked, tag):
    import dataclasses

    if tag is None:
        return locked
    if tag == "bn128":
        return dataclasses.replace(locked, block_n=128, num_stages=2)
    return dataclasses.replace(locked, num_stages=int(tag[1:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="levers.json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--time-box", type=float, default=1e9)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    dev = "cpu" if args.smoke else "cuda"
    if args.smoke:
        from rlk_triton.bench.timing import cpu_ms as timer

        shapes = [("2 x 40", [40, 24], 4, 2, 32)]
    else:
        from functools import partial

        from rlk_triton.bench.timing import graph_ms

        timer = partial(graph_ms, reps=3)
        shapes = [("4 x 8192", [8192] * 4, 32, 8, 128), ("16 x 2048", [2048] * 16, 32, 8, 128),
                  ("4 x 8192 D=64", [8192] * 4, 32, 8, 64), ("2 x 8192 D=256", [8192] * 2, 16, 8, 256),
                  ("64 mixed 64..4096", [int(x) for x in torch.randint(
                      64, 4097, (64,), generator=torch.Generator().manual_seed(1))], 32, 8, 128)]
    dt = torch.bfloat16
    report = {"what": "attention forward levers against the locked kernel (scripts/gpu_attention_fwd_levers.py)",
              "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "triton": triton.__version__, "commit": args.commit,
              "date": time.strftime("%Y-%m-%d"), "rows": []}
    g = torch.Generator(device=dev).manual_seed(0)
    for label, lens, hq, hkv, d in shapes:
        N, L = sum(lens), max(lens)
        cu = torch.tensor([0] + lens, device=dev).cumsum(0).to(torch.int32)
        q, k, v = (torch.randn(N, h, d, device=dev, generator=g).to(dt) for h in (hq, hkv, hkv))
        sc = d ** -0.5
        locked = ops._cfg("attention_fwd", q)
        ref = ops.launch_forward(q, k, v, cu, L, sc, True)
        base_ms = timer(lambda: ops.launch_forward(q, k, v, cu, L, sc, True))
        shape = f"{label}, {hq}/{hkv} heads, D={d}, causal, bf16"
        flops = sum(2 * 2 * n * (n + 1) / 2 * d * hq for n in lens)
        row0 = {"shape": shape, "variant": "locked", "config": [locked.block_m, locked.block_n, locked.num_warps, locked.num_stages],
                "ms": base_ms, "tflops": flops / base_ms / 1e9}
        report["rows"].append(row0)
        print(row0, flush=True)
        for name in args.variants:
            if time.time() - t0 > args.time_box:
                report.setdefault("not_run", []).append(f"{shape}: {name}")
                continue
            levers, tag = VARIANTS[name]
            if d != 128 and not args.smoke and name not in ("tma rev", "tma ws rev", "tma fma rev", "flat rev"):
                continue
            cfg = _cfg(locked, tag)
            row = {"shape": shape, "variant": name,
                   "config": [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages]}
            try:
                o, s = launch_var(q, k, v, cu, L, sc, cfg, **levers)
                ms = timer(lambda: launch_var(q, k, v, cu, L, sc, cfg, **levers))
                row |= {"ms": ms, "vs_locked": base_ms / ms, "tflops": flops / ms / 1e9,
                        "bitwise_vs_locked": bool(torch.equal(o, ref[0]) and torch.equal(s, ref[1])),
                        "must_be_bitwise": name in SAME_BITS,
                        "max_abs_out_diff": float((o.float() - ref[0].float()).abs().max()),
                        "max_abs_lse_diff": float((s - ref[1]).abs().max())}
            except Exception as ex:  # noqa: BLE001 - reported
                row["error"] = repr(ex)[:400]
            report["rows"].append(row)
            print(row, flush=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        del q, k, v, ref
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    bad = [r for r in report["rows"] if r.get("must_be_bitwise") and not r.get("bitwise_vs_locked")]
    print("bit mismatches where none may be:", len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
