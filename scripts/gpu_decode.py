"""Rollout-shaped speed on the GPU (issue: small-M matmul, decode attention, small-batch logp), with
the bits checked in the same run. Writes docs/reports/h200-decode-<date>.json's rows:
{op, shape, rlk_ms, baseline, baseline_ms, ratio, time: "device" | "wall", ...}.

    python scripts/gpu_decode.py --out report.json [--commit SHA] [--sweep matmul,decode,logp]

Device times are CUDA-graph replays of `REPS` calls divided by REPS (the GPU work alone); wall times
are host loops with a sync at the end (what an eager caller pays per call). Baselines are what a user
gets by default: cuBLAS through `a @ w.t()`, SDPA's default backend on contiguous caches, torch eager;
the copy rate of the same run is the memory ceiling. With --sweep, candidate configs of the row
buckets are timed too, each with its bits against the class reference (a candidate that differs
cannot be locked), and selected_logp's vocab chunk widths.
"""
import argparse
import dataclasses
import datetime
import json
import platform
import traceback
from functools import partial

import torch
import triton

from rlk_triton import bench, configs
from rlk_triton._runtime import default_arch
from rlk_triton.attention import attention, attention_decode
from rlk_triton.bench import wall_ms
from rlk_triton.ops import attention as attn_ops
from rlk_triton.ops.matmul import matmul, matmul_into

REPS = 20
DT = torch.bfloat16


# the suite's CUDA-graph clock (rlk_triton/bench/timing.py), REPS calls per graph unless told
graph_ms = partial(bench.graph_ms, reps=REPS)


# ---- matmul ----

MM_SHAPES = [(N, K) for N, K in ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096))]
MM_M = (1, 8, 16, 64, 256)
# Candidates per M (the second sweep: the buckets still under 0.8x cuBLAS after the first, at
# docs/reports/h200-decode-sweep-2026-12-04.json): M = 8's weight read and M = 256 at N > 4096. M = 1
# and 8 also on pointers: the same bits, about 22-45 us less host time an eager call, device time
# mixed on an H100 (docs/matmul.md, docs/reports/h100-small-m-paths-2026-12-06.json); each candidate's
# eager wall time is recorded beside its device time.
_SMALL_TILES = ((16, 32, 512, 1, 4, 3), (16, 64, 256, 1, 4, 4), (16, 32, 256, 1, 4, 4), (16, 64, 128, 1, 4, 5))
SWEEP_MM = {
    1: [configs.MatmulConfig(*t, persistent_tma=p) for p in (True, False) for t in _SMALL_TILES],
    8: [configs.MatmulConfig(*t, persistent_tma=p) for p in (True, False) for t in _SMALL_TILES] +
       [configs.MatmulConfig(*t, persistent_tma=True) for t in (
        (16, 32, 256, 1, 4, 4), (16, 32, 256, 1, 4, 5), (16, 32, 128, 1, 4, 6), (16, 32, 128, 1, 4, 8),
        (16, 16, 256, 1, 4, 4), (16, 16, 256, 1, 4, 6), (16, 32, 512, 1, 4, 3), (16, 32, 256, 1, 2, 4),
        (16, 64, 128, 1, 4, 5), (16, 64, 256, 1, 4, 4))],
    256: [configs.MatmulConfig(*t, persistent_tma=p) for p in (True, False) for t in (
        (128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 5), (128, 128, 128, 8, 8, 3),
        (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (64, 256, 64, 8, 4, 4), (128, 64, 128, 8, 8, 4),
        (128, 128, 64, 1, 8, 4), (64, 128, 128, 8, 4, 4), (128, 256, 64, 1, 8, 3), (64, 64, 128, 1, 4, 5))],
}


def matmul_rows(report, sweep):
    g = torch.Generator(device="cuda").manual_seed(0)
    for N, K in MM_SHAPES:
        w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).to(DT)
        big = torch.randn(4096, K, device="cuda", generator=g).to(DT)
        ref = matmul(big, w.t())  # M = 4096: the class reference's bucket
        for M in MM_M:
            for off in (0, 1000):  # the rows at the top and in the middle of the M = 4096 batch
                a = big[off:off + M]
                if not torch.equal(matmul(a, w.t()), ref[off:off + M]):
                    report["failures"].append(f"matmul rows [{off}, {off + M}) of M=4096 differ at M={M}, N={N}, K={K}")
            a = big[:M].contiguous()
            out = torch.empty(M, N, device="cuda", dtype=DT)
            cublas = graph_ms(lambda: torch.matmul(a, w.t(), out=out))
            ours = graph_ms(lambda: matmul(a, w.t()))
            cfg = configs.lookup_matmul("matmul", default_arch(), DT, rows=M, cols=N)
            report["rows"].append({
                "op": "matmul", "shape": f"M={M} N={N} K={K} bf16 (a @ w.t())", "rlk_ms": ours,
                "baseline": "cuBLAS (torch.matmul)", "baseline_ms": cublas, "ratio": cublas / ours, "time": "device",
                "weight_read_gbps": N * K * 2 / ours / 1e6, "bucket": configs.m_bucket(M, N), "config": dataclasses.asdict(cfg),
                "rlk_wall_ms": wall_ms(lambda: matmul(a, w.t())), "baseline_wall_ms": wall_ms(lambda: a @ w.t())})
            print(report["rows"][-1]["shape"], round(ours * 1e3, 1), "us", round(cublas / ours, 3), flush=True)
            if not sweep:
                continue
            for c in SWEEP_MM.get(M, ()):
                try:
                    got = matmul_into(a, w.t(), torch.empty(M, N, device="cuda", dtype=DT), cfg=c)
                    ms = graph_ms(lambda: matmul_into(a, w.t(), out, cfg=c))
                    report["sweep"].append({"op": "matmul", "M": M, "N": N, "K": K, "config": dataclasses.asdict(c),
                                            "ms": ms, "ratio": cublas / ms, "bitwise": torch.equal(got, ref[:M]),
                                            "wall_ms": wall_ms(lambda: matmul_into(a, w.t(), out, cfg=c))})
                except Exception as ex:  # noqa: BLE001 - reported
                    report["sweep"].append({"op": "matmul", "M": M, "N": N, "K": K, "config": dataclasses.asdict(c),
                                            "error": f"{type(ex).__name__}: {str(ex)[:300]}"})


# ---- decode attention ----

def paged_cache(k, v, B, L, page):
    """k / v [B * L, Hkv, D] as a paged cache on shuffled pages and its block table."""
    per = L // page
    perm = torch.randperm(B * per, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    bt = perm.reshape(B, per).to(torch.int32)
    kc = torch.empty(B * per, page, *k.shape[1:], device="cuda", dtype=k.dtype)
    vc = torch.empty_like(kc)
    kc[bt.reshape(-1).long()] = k.reshape(B * per, page, *k.shape[1:])
    vc[bt.reshape(-1).long()] = v.reshape(B * per, page, *v.shape[1:])
    return kc, vc, bt


SWEEP_DEC = [configs.MatmulConfig(64, 64, 0, 1, w, s) for w, s in ((4, 3), (4, 4), (4, 5), (8, 4))]
SWEEP_PREFILL = [configs.MatmulConfig(m, 64, 0, 1, w, s, q_heads=qh) for qh in (0, 1)
                 for m, w, s in ((128, 8, 2), (128, 8, 3), (128, 8, 4), (128, 4, 4))]


def decode_rows(report, gbps, sweep):
    import torch.nn.functional as F
    from torch.nn.attention import _cur_sdpa_kernel_backends

    Hq, Hkv, D = 16, 8, 128
    for B, L in ((64, 4096), (256, 1024), (8, 32768)):
        g = torch.Generator(device="cuda").manual_seed(B)
        q_all = torch.randn(B * L, Hq, D, device="cuda", generator=g).to(DT)
        k = torch.randn(B * L, Hkv, D, device="cuda", generator=g).to(DT)
        v = torch.randn(B * L, Hkv, D, device="cuda", generator=g).to(DT)
        cu = torch.arange(0, B * L + 1, L, device="cuda", dtype=torch.int32)
        out_t, lse_t = attention(q_all, k, v, cu, max_seqlen=L, validate=False)
        last = cu[1:].long() - 1
        q = q_all[last].contiguous()
        kc, vc, bt = paged_cache(k, v, B, L, 256)
        sl = torch.full((B,), L, device="cuda", dtype=torch.int32)
        o, lse = attention_decode(q, kc, vc, bt, sl, validate=False)
        bitwise = torch.equal(o, out_t[last]) and torch.equal(lse, lse_t[:, last])
        if not bitwise:
            report["failures"].append(f"decode {B} x {L}: out / lse differ from the training forward")
        qs = q.reshape(B, 1, Hq, D).transpose(1, 2)
        ks = k.reshape(B, L, Hkv, D).transpose(1, 2).contiguous()
        vs = v.reshape(B, L, Hkv, D).transpose(1, 2).contiguous()
        sdpa = graph_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True), reps=5)
        ours = graph_ms(lambda: attention_decode(q, kc, vc, bt, sl, validate=False), reps=5)
        kv_bytes = 2 * k.numel() * 2
        cfg = configs.lookup_decode(default_arch(), DT, D, B * Hkv, Hq // Hkv)
        report["rows"].append({
            "op": "attention_decode", "shape": f"{B} seqs x {L} cached, {Hq} q / {Hkv} kv heads, D={D}, bf16",
            "rlk_ms": ours, "baseline": "SDPA default backend, contiguous caches (enable_gqa)", "baseline_ms": sdpa,
            "ratio": sdpa / ours, "time": "device", "copy_fraction": kv_bytes / ours / 1e6 / gbps,
            "bitwise_vs_training": bitwise, "bucket": configs.pair_bucket(B * Hkv, Hq // Hkv), "config": dataclasses.asdict(cfg),
            "rlk_wall_ms": wall_ms(lambda: attention_decode(q, kc, vc, bt, sl, validate=False), n=50)})
        print(report["rows"][-1]["shape"], round(ours, 4), round(sdpa / ours, 3), bitwise, flush=True)
        if sweep:
            for c in SWEEP_DEC:
                try:
                    o2, l2 = attn_ops.launch_decode(q, kc, vc, bt, sl, torch.arange(B + 1, device="cuda", dtype=torch.int32),
                                                    1, D**-0.5, cfg=c)
                    cuq = torch.arange(B + 1, device="cuda", dtype=torch.int32)
                    ms = graph_ms(lambda: attn_ops.launch_decode(q, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=c), reps=5)
                    report["sweep"].append({"op": "attention_decode", "B": B, "L": L, "config": dataclasses.asdict(c),
                                            "ms": ms, "ratio": sdpa / ms,
                                            "bitwise": torch.equal(o2, out_t[last]) and torch.equal(l2, lse_t[:, last])})
                except Exception as ex:  # noqa: BLE001
                    report["sweep"].append({"op": "attention_decode", "B": B, "L": L, "config": dataclasses.asdict(c),
                                            "error": f"{type(ex).__name__}: {str(ex)[:300]}"})
        if B == 8:  # chunked prefill: the whole sequences through the decode kernel, and in 512-token chunks
            fwd = graph_ms(lambda: attention(q_all, k, v, cu, max_seqlen=L, validate=False), reps=2)
            cuq = cu
            one = graph_ms(lambda: attention_decode(q_all, kc, vc, bt, sl, cuq, max_seqlen_q=L, validate=False), reps=2)
            o3, l3 = attention_decode(q_all, kc, vc, bt, sl, cuq, max_seqlen_q=L, validate=False)
            if sweep:
                for c in SWEEP_PREFILL:
                    try:
                        o4, l4 = attn_ops.launch_decode(q_all, kc, vc, bt, sl, cuq, L, D**-0.5, cfg=c)
                        ms = graph_ms(lambda: attn_ops.launch_decode(q_all, kc, vc, bt, sl, cuq, L, D**-0.5, cfg=c), reps=2)
                        report["sweep"].append({"op": "attention_decode (prefill)", "B": B, "L": L,
                                                "config": dataclasses.asdict(c), "ms": ms, "ratio": fwd / ms,
                                                "bitwise": torch.equal(o4, out_t) and torch.equal(l4, lse_t)})
                        del o4, l4
                    except Exception as ex:  # noqa: BLE001
                        report["sweep"].append({"op": "attention_decode (prefill)", "B": B, "L": L,
                                                "config": dataclasses.asdict(c), "error": f"{type(ex).__name__}: {str(ex)[:300]}"})
            report["rows"].append({
                "op": "attention_decode (prefill)", "shape": f"{B} seqs x {L} new tokens in one chunk, {Hq}/{Hkv} heads",
                "rlk_ms": one, "baseline": "rlk attention() training forward, same tokens", "baseline_ms": fwd,
                "ratio": fwd / one, "time": "device",
                "bitwise_vs_training": torch.equal(o3, out_t) and torch.equal(l3, lse_t)})
            print(report["rows"][-1]["shape"], round(one, 3), round(fwd / one, 3), flush=True)
        del q_all, k, v, kc, vc, out_t, lse_t
        torch.cuda.empty_cache()


# ---- selected_logp ----

CHUNKS = (2048, 4096, 8192, 16384)


def logp_rows(report, gbps, sweep):
    from rlk_triton.logp import selected_logp

    V = 151936
    if sweep:  # the vocab chunk width (one width for every row count: the reduction order)
        key = ("selected_logp_chunk", configs.table_arch(default_arch(), "selected_logp_chunk"), "bfloat16", "v>8192")
        locked = configs.LOCKED_CONFIGS[key]
        for chunk in CHUNKS:
            configs.LOCKED_CONFIGS[key] = dataclasses.replace(locked, block_v=chunk)
            for rows in (1, 64, 1024, 16384):
                logits = torch.randn(rows, V, device="cuda").to(DT)
                tg = torch.randint(0, V, (rows,), device="cuda")
                ms = graph_ms(lambda: selected_logp(logits, tg, validate=False))
                report["sweep"].append({"op": "selected_logp fwd", "M": rows, "N": V, "config": {"chunk_v": chunk},
                                        "ms": ms, "copy_fraction": rows * V * 2 / ms / 1e6 / gbps})
        configs.LOCKED_CONFIGS[key] = locked
    for rows in (1, 64, 1024, 16384):
        g = torch.Generator(device="cuda").manual_seed(rows)
        logits = (torch.randn(rows, V, device="cuda", generator=g) * 2).to(DT)
        tg = torch.randint(0, V, (rows,), device="cuda", generator=g)
        ours = graph_ms(lambda: selected_logp(logits, tg, validate=False))
        eager = graph_ms(lambda: torch.log_softmax(logits.float(), -1).gather(-1, tg[:, None]))
        report["rows"].append({
            "op": "selected_logp fwd", "shape": f"{rows} x {V} bf16", "rlk_ms": ours,
            "baseline": "torch eager log_softmax + gather", "baseline_ms": eager, "ratio": eager / ours,
            "time": "device", "copy_fraction": rows * V * 2 / ours / 1e6 / gbps,
            "rlk_wall_ms": wall_ms(lambda: selected_logp(logits, tg, validate=False))})
        print(report["rows"][-1]["shape"], round(ours * 1e3, 1), "us", round(report["rows"][-1]["copy_fraction"], 3), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--sweep", default="", help="comma list of parts whose candidate configs to time too")
    ap.add_argument("--only", default="matmul,decode,logp")
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "cuda": torch.version.cuda, "python": platform.python_version(), "commit": args.commit,
              "date": datetime.date.today().isoformat(), "fingerprint": configs.fingerprint(),
              "rows": [], "sweep": [], "failures": [], "errors": []}
    gbps = bench.copy_rate_gbps()  # the memory ceiling: a 2 GiB copy, bytes read + written per second
    report["copy_gbps"] = gbps
    print("copy GB/s", round(gbps), flush=True)
    sweep = set(args.sweep.split(","))
    parts = {"matmul": lambda: matmul_rows(report, "matmul" in sweep),
             "decode": lambda: decode_rows(report, gbps, "decode" in sweep),
             "logp": lambda: logp_rows(report, gbps, "logp" in sweep)}
    for name in args.only.split(","):
        try:
            parts[name]()
        except Exception:  # noqa: BLE001 - the report keeps the other parts
            report["errors"].append(f"{name}: {traceback.format_exc()[-2000:]}")
            print(report["errors"][-1], flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print("failures:", report["failures"])


if __name__ == "__main__":
    main()
