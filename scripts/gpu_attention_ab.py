"""The attention kernels of an earlier commit (A) against the current ones (B) on the GPU: same run,
same inputs, bits compared, each A timed twice so that the run-to-run spread sits beside the difference.
Also: chunked prefill against the training forward per token, the forward against SDPA's default and
flash backends, and the forward at other members of its bit class (bits compared with the locked one).

    python scripts/gpu_attention_ab.py --out ab.json --commit <B's commit> --before-commit <A's commit>

Needs A's kernels as rlk_triton/ops/_attention_before.py, a copy made for the run and never part of
the package: `git show A:rlk_triton/ops/attention.py`, cut before its torch.library section.
Reports: docs/reports/h200-clamp-cost-2026-12-04.json (A = the kernels before the bad-input clamps),
docs/reports/h200-attention-split-2026-12-04.json (A = one masked KV loop, B = whole blocks unmasked).
"""
import argparse
import json
from functools import partial

import torch
import torch.nn.functional as F
import triton

from rlk_triton import bench, configs
from rlk_triton._runtime import default_arch
from rlk_triton.ops import _attention_before as before
from rlk_triton.ops import attention as after

DT = torch.bfloat16
D = 128


# the suite's CUDA-graph clock (rlk_triton/bench/timing.py), 5 calls per graph unless told
graph_ms = partial(bench.graph_ms, reps=5)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _rand(g, *shape):
    return torch.randn(*shape, device="cuda", generator=g).to(DT)


def paged(k, v, B, L, page, g):
    """k / v [B * L, Hkv, D] as a paged cache on shuffled pages, and its block table."""
    per = L // page
    bt = torch.randperm(B * per, device="cuda", generator=g).reshape(B, per).to(torch.int32)
    kc = torch.empty(B * per, page, *k.shape[1:], device="cuda", dtype=k.dtype)
    vc = torch.empty_like(kc)
    kc[bt.reshape(-1).long()] = k.reshape(B * per, page, *k.shape[1:])
    vc[bt.reshape(-1).long()] = v.reshape(B * per, page, *v.shape[1:])
    return kc, vc, bt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--before-commit", default="unknown")
    ap.add_argument("--what", default="attention kernels before / after (same run)")
    args = ap.parse_args()
    rows, extra = [], []
    g = torch.Generator(device="cuda").manual_seed(0)
    arch = default_arch()

    def row(kernel, shape, fb, fa, reps=5):
        ob, oa = fb(), fa()
        ms_b, ms_a = graph_ms(fb, reps), graph_ms(fa, reps)
        ms_b2 = graph_ms(fb, reps)  # again: the run-to-run spread beside the difference
        rows.append({"kernel": kernel, "shape": shape, "before_ms": ms_b, "before_again_ms": ms_b2, "after_ms": ms_a,
                     "cost": ms_a / ms_b - 1, "spread": abs(ms_b2 / ms_b - 1), "bitwise": _same(ob, oa)})
        print(rows[-1], flush=True)
        return ms_a

    # training forward (and backward: its kernels may be unchanged, the row says so by its cost)
    for S, L, Hq, Hkv in ((4, 8192, 32, 8), (64, 1024, 32, 8)):
        N = S * L
        q, k, v = _rand(g, N, Hq, D), _rand(g, N, Hkv, D), _rand(g, N, Hkv, D)
        cu = torch.arange(0, N + 1, L, device="cuda", dtype=torch.int32)
        sc = D**-0.5
        shape = f"{S} x {L}, {Hq}/{Hkv} heads, D={D}, causal, bf16"
        fwd_ms = row("attention forward", shape, lambda: before.launch_forward(q, k, v, cu, L, sc, True),
                     lambda: after.launch_forward(q, k, v, cu, L, sc, True))
        out, lse = after.launch_forward(q, k, v, cu, L, sc, True)
        do = torch.randn_like(out)
        row("attention backward", shape, lambda: before.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True),
            lambda: after.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True), reps=2)
        qs, ks, vs = (x.reshape(S, L, -1, D).transpose(1, 2) for x in (q, k, v))
        sdpa = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)  # noqa: E731
        from torch.nn.attention import SDPBackend, sdpa_kernel
        default_ms = graph_ms(sdpa)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash_ms = graph_ms(sdpa)
        extra.append({"what": "forward vs SDPA", "shape": shape, "rlk_ms": fwd_ms, "sdpa_default_ms": default_ms,
                      "sdpa_flash_ms": flash_ms, "ratio_default": default_ms / fwd_ms, "ratio_flash": flash_ms / fwd_ms})
        print(extra[-1], flush=True)
        locked = configs.lookup_attention("attention_fwd", arch, DT, D)
        for m, w, st in ((128, 8, 3), (128, 8, 4), (128, 4, 3), (128, 4, 4), (64, 4, 3), (64, 4, 4), (64, 4, 5)):
            c = configs.MatmulConfig(m, locked.block_n, 0, 1, w, st)
            try:
                o2 = after.launch_forward(q, k, v, cu, L, sc, True, cfg=c)
                ms = graph_ms(lambda: after.launch_forward(q, k, v, cu, L, sc, True, cfg=c))
                extra.append({"what": "forward config", "shape": shape, "block_m": m, "num_warps": w, "num_stages": st,
                              "ms": ms, "vs_locked": fwd_ms / ms, "bitwise_vs_locked": _same(o2, (out, lse))})
            except Exception as ex:  # noqa: BLE001 - reported
                extra.append({"what": "forward config", "shape": shape, "block_m": m, "num_warps": w, "num_stages": st,
                              "error": f"{type(ex).__name__}: {str(ex)[:300]}"})
            print(extra[-1], flush=True)
        del q, k, v, out, lse, do, qs, ks, vs

    # decode steps
    Hq, Hkv, page = 16, 8, 256
    for B, L in ((64, 4096), (256, 1024), (8, 32768)):
        pages = B * L // page
        kc, vc = _rand(g, pages, page, Hkv, D), _rand(g, pages, page, Hkv, D)
        bt = torch.randperm(pages, device="cuda", generator=g).reshape(B, L // page).to(torch.int32)
        sl = torch.full((B,), L, device="cuda", dtype=torch.int32)
        q = _rand(g, B, Hq, D)
        cuq = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        cfg = configs.lookup_decode(arch, DT, D, B * Hkv, Hq // Hkv)
        row("attention_decode", f"{B} x {L} cached, {Hq}/{Hkv} heads, D={D}, bf16",
            lambda: before.launch_decode(q, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=cfg),
            lambda: after.launch_decode(q, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=cfg), reps=10)
        del kc, vc

    # chunked prefill against the training forward, whole sequences: one chunk, and chunks of 4096
    B, L = 8, 32768
    N = B * L
    q, k, v = _rand(g, N, Hq, D), _rand(g, N, Hkv, D), _rand(g, N, Hkv, D)
    cu = torch.arange(0, N + 1, L, device="cuda", dtype=torch.int32)
    kc, vc, bt = paged(k, v, B, L, page, g)
    sc = D**-0.5
    out_t, lse_t = after.launch_forward(q, k, v, cu, L, sc, True)
    fwd_ms = graph_ms(lambda: after.launch_forward(q, k, v, cu, L, sc, True), reps=2)
    sl = torch.full((B,), L, device="cuda", dtype=torch.int32)
    one_cfg = configs.lookup_decode(arch, DT, D, B * Hkv, L * Hq // Hkv)
    one_ms = row("attention_decode (prefill)", f"{B} x {L} new tokens in one chunk, {Hq}/{Hkv} heads",
                 lambda: before.launch_decode(q, kc, vc, bt, sl, cu, L, sc, cfg=one_cfg),
                 lambda: after.launch_decode(q, kc, vc, bt, sl, cu, L, sc, cfg=one_cfg), reps=2)
    o1, l1 = after.launch_decode(q, kc, vc, bt, sl, cu, L, sc, cfg=one_cfg)
    C = 4096
    tok = torch.arange(N, device="cuda").reshape(B, L)
    chunks = []
    for c0 in range(0, L, C):
        idx = tok[:, c0:c0 + C].reshape(-1)
        chunks.append((idx, q[idx].contiguous(), torch.full((B,), c0 + C, device="cuda", dtype=torch.int32),
                       torch.arange(0, B * C + 1, C, device="cuda", dtype=torch.int32)))
    ccfg = configs.lookup_decode(arch, DT, D, B * Hkv, C * Hq // Hkv)

    def chunked():
        return [after.launch_decode(qc, kc, vc, bt, slc, cuc, C, sc, cfg=ccfg) for _, qc, slc, cuc in chunks]

    res = chunked()
    chunk_bits = all(torch.equal(o, out_t[idx]) and torch.equal(lz, lse_t[:, idx]) for (idx, *_), (o, lz) in zip(chunks, res))
    chunk_ms = graph_ms(chunked, reps=2)
    extra.append({"what": "chunked prefill vs training forward", "shape": f"{B} x {L}, {Hq}/{Hkv} heads, D={D}, bf16",
                  "forward_ms": fwd_ms, "one_chunk_ms": one_ms, "one_chunk_ratio": fwd_ms / one_ms,
                  "one_chunk_bitwise": torch.equal(o1, out_t) and torch.equal(l1, lse_t),
                  "chunks_of_4096_ms": chunk_ms, "chunks_ratio": fwd_ms / chunk_ms, "chunks_bitwise": chunk_bits})
    print(extra[-1], flush=True)
    report = {"what": args.what, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "commit": args.commit, "before_commit": args.before_commit,
              "rows": rows, "extra": extra}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
