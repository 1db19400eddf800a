"""Vocab-parallel linear_logp across processes: bitwise against one shard, timing and memory per rank.

On a multi-GPU machine (one process per GPU, NCCL; NVLink multicast stays off):
    python3 scripts/multi_gpu_linear_logp.py --out $OUT/multi_gpu.json
It runs TP=1 on GPU 0, then TP=k for every k in --world-sizes that fits the GPUs, and per k:
  - aligned shards (every start a multiple of the canonical chunk_v): logp, entropy and d hidden must
    be torch.equal to TP=1, and each rank's d weight rows torch.equal to TP=1's rows;
  - unaligned shards (a smaller shape, starts off the chunk grid): every output and gradient judged
    against float64 by contracts/linear_logp.yaml;
  - fwd+bwd time (median of device events) and peak extra memory, per rank, next to TP=1's;
  - attention context parallelism across the same ranks: each rank owns a block_n-aligned range of
    KV positions; chained (rank r continues rank r-1's online-softmax state, sent point to point) the
    last rank's out / LSE must be torch.equal to unsplit attention; independent partials gathered and
    merged in rank order (merge_attention_partials) must be within contracts/attention.yaml.
Without GPUs (--smoke, gloo, the Triton interpreter, tiny shapes) the same code runs on CPU processes:
that is how the script itself is tested (tests/test_multi_gpu_script.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Keep NVLink multicast off in every process this script starts (the device machines require it).
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v

import torch  # noqa: E402

SMOKE = {"N": 13, "H": 40, "V": 3 * 128 + 29, "small": (11, 32, 2 * 128 + 7), "dtype": "float32",
         "attention": {"lens": [45, 20, 3], "heads": (4, 2), "D": 16, "judged_lens": [45, 20]}}
FULL = {"N": 8192, "H": 4096, "V": 151936, "small": (64, 1024, 32000), "dtype": "bfloat16",
        "attention": {"lens": [4096, 3000, 1093], "heads": (32, 8), "D": 128, "judged_lens": [700, 300]}}


def _setup(smoke):
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"


def _inputs(N, H, V, dtype, device, seed=0):
    from rlk_triton.testing.linear_parity import LinearCase, build_linear_case

    hidden, weight, bias, targets = build_linear_case(LinearCase(N, H, V, dtype, bias=True, seed=seed), "cpu")
    gen = torch.Generator().manual_seed(seed + 7)
    g, ge = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    return [x.to(device) for x in (hidden, weight, bias, targets, g, ge)]


def _step(hidden, weight, bias, targets, g, ge, **kw):
    from rlk_triton.logp import linear_logp

    h, w, b = (x.detach().clone().requires_grad_() for x in (hidden, weight, bias))
    logp, ent = linear_logp(h, w, targets, bias=b, temperature=0.9, return_entropy=True, **kw)
    ((logp * g).sum() + (ent * ge).sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(), "d_hidden": h.grad, "d_weight": w.grad, "d_bias": b.grad}


def _time(fn, device, reps):
    """(median ms, peak extra GiB) of fn; CPU: wall clock, no memory figure."""
    fn()
    if device.type != "cuda":
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts), None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts), (torch.cuda.max_memory_allocated() - base) / 2**30


def aligned_bounds(V, k, chunk):
    """k contiguous shards, every start a multiple of chunk, sizes as even as the grid allows."""
    n_chunks = -(-V // chunk)
    starts = [min(V, (n_chunks * r // k) * chunk) for r in range(k)]
    return starts + [V]


def _attention_inputs(lens, heads, D, dtype, device, seed=11):
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    q, kk, v = (torch.randn(n, h, D, generator=gen).to(device, dtype) for h in (heads[0], heads[1], heads[1]))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    return q, kk, v, cu


def _attention_cp(rank, k, dist, device, dtype, acfg):
    """This rank's part of the context-parallel checks; rank k-1 reports the chained result, rank 0
    the merged one."""
    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    from rlk_triton.attention import attention, attention_partial, merge_attention_partials

    D = acfg["D"]
    bn = configs.lookup_attention("attention_fwd", arch_of(device), dtype, D).block_n
    res = {}
    # chained states: bitwise
    q, kk, v, cu = _attention_inputs(acfg["lens"], acfg["heads"], D, dtype, device)
    b = aligned_bounds(max(acfg["lens"]), k, bn)
    lo, hi = b[rank], (b[rank + 1] if rank < k - 1 else None)
    state = None
    if rank > 0:
        n, hq = q.shape[0], q.shape[1]
        state = (torch.empty(hq, n, device=device), torch.empty(hq, n, device=device),
                 torch.empty(n, hq, D, device=device))
        for t in state:
            dist.recv(t, src=rank - 1)
    out, lse, state = attention_partial(q, kk, v, cu, kv_start=lo, kv_end=hi, state=state)
    if rank < k - 1:
        for t in state:
            dist.send(t.contiguous(), dst=rank + 1)
    else:
        ref_out, ref_lse = attention(q, kk, v, cu)
        res["chained_kv_ranges"] = b[:-1] + ["end"]
        res["chained_bitwise"] = bool(torch.equal(out, ref_out) and torch.equal(lse, ref_lse))
    # independent partials merged in rank order: within the contract
    q, kk, v, cu = _attention_inputs(acfg["judged_lens"], acfg["heads"], D, dtype, device, seed=12)
    b = aligned_bounds(max(acfg["judged_lens"]), k, bn)
    lo, hi = b[rank], (b[rank + 1] if rank < k - 1 else None)
    out, lse, _ = attention_partial(q, kk, v, cu, kv_start=lo, kv_end=hi)
    outs = [torch.empty_like(out) for _ in range(k)]
    lses = [torch.empty_like(lse) for _ in range(k)]
    dist.all_gather(outs, out.contiguous())
    dist.all_gather(lses, lse.contiguous())
    if rank == 0:
        import numpy as np

        from rlk_triton.reference.attention import attention_reference
        from rlk_triton.testing.attention_parity import _scales, judge_errors

        m_out, m_lse = merge_attention_partials(outs, lses)
        q64, k64, v64 = (x.double().cpu().numpy() for x in (q, kk, v))
        cu64 = cu.cpu().numpy().astype(np.int64)
        scale = 1.0 / D ** 0.5
        ref_o, ref_l = attention_reference(q64, k64, v64, cu64, scale, True)
        so, sl, *_ = _scales(q64, k64, v64, None, None, cu64, scale, True, ref_o, dtype)
        ratios = judge_errors({"out": (m_out.double().cpu().numpy(), ref_o, so),
                               "lse": (m_lse.double().cpu().numpy(), ref_l, sl)}, dtype, arch_of(device))
        res["merged_kv_ranges"] = b[:-1] + ["end"]
        res["merged_ratios"] = ratios
        res["merged_within_contract"] = max(ratios.values()) <= 1.0
    return res


def _rank(rank, k, init, cfg, ref_dir, out_dir, smoke):
    _setup(smoke)
    import torch.distributed as dist

    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    from rlk_triton.testing.linear_parity import compare_to_reference, judge_errors

    cuda = torch.cuda.is_available() and not smoke
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=k)
    try:
        dtype = getattr(torch, cfg["dtype"])
        chunk = configs.lookup_matmul("linear_logp_dlogits", arch_of(device), dtype).chunk_v
        hidden, weight, bias, targets, g, ge = _inputs(cfg["N"], cfg["H"], cfg["V"], dtype, device)
        bounds = aligned_bounds(cfg["V"], k, chunk)
        lo, hi = bounds[rank], bounds[rank + 1]
        kw = dict(tp_group=dist.group.WORLD, vocab_start_index=lo, global_vocab_size=cfg["V"])
        got = _step(hidden, weight[lo:hi], bias[lo:hi], targets, g, ge, **kw)
        ref = torch.load(Path(ref_dir, "tp1.pt"), map_location=device)
        result = {"rank": rank, "shard": [lo, hi], "chunk_v": chunk,
                  "bitwise": {n: bool(torch.equal(got[n], ref[n])) for n in ("logp", "entropy", "d_hidden")}}
        result["bitwise"]["d_weight_rows"] = bool(torch.equal(got["d_weight"], ref["d_weight"][lo:hi]))
        result["bitwise"]["d_bias_rows"] = bool(torch.equal(got["d_bias"], ref["d_bias"][lo:hi]))
        ms, gib = _time(lambda: _step(hidden, weight[lo:hi], bias[lo:hi], targets, g, ge, validate=False, **kw),
                        device, 3 if smoke else 10)
        result.update(fwd_bwd_ms=ms, peak_extra_gib=gib)
        # unaligned shards: within the contract
        n, h, v = cfg["small"]
        sh, sw, sb, st, sg, sge = _inputs(n, h, v, dtype, device, seed=1)
        ub = [0] + [min(v, (v * r) // k + 17) for r in range(1, k)] + [v]
        ulo, uhi = ub[rank], ub[rank + 1]
        part = _step(sh, sw[ulo:uhi], sb[ulo:uhi], st, sg, sge, tp_group=dist.group.WORLD,
                     vocab_start_index=ulo, global_vocab_size=v)
        gathered_w = [None] * k  # shards differ in size: gathered as objects, in rank order
        gathered_b = [None] * k
        dist.all_gather_object(gathered_w, part["d_weight"].cpu())
        dist.all_gather_object(gathered_b, part["d_bias"].cpu())
        if rank == 0:
            full = dict(part)
            full["d_weight"] = torch.cat(gathered_w).to(device)
            full["d_bias"] = torch.cat(gathered_b).to(device)
            ratios = judge_errors(compare_to_reference(full, sh, sw, sb, st, 0.9, sg.double().cpu(),
                                                       sge.double().cpu()), dtype, arch_of(device))
            result["unaligned"] = {"shards": ub, "ratios": ratios, "within_contract": max(ratios.values()) <= 1.0}
        result["attention_cp"] = _attention_cp(rank, k, dist, device, dtype, cfg["attention"])
        Path(out_dir, f"k{k}_rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--smoke", action="store_true", help="CPU processes, gloo, tiny shapes (tests the script)")
    args = ap.parse_args(argv)
    _setup(args.smoke)
    import torch.multiprocessing as mp

    cfg = SMOKE if args.smoke else FULL
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = getattr(torch, cfg["dtype"])
    report = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (Triton interpreter)",
              "gpus": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__,
              "shape": {k: cfg[k] for k in ("N", "H", "V", "dtype")}, "date": time.strftime("%Y-%m-%d"),
              "runs": {}, "skipped": []}
    with tempfile.TemporaryDirectory() as tmp:
        hidden, weight, bias, targets, g, ge = _inputs(cfg["N"], cfg["H"], cfg["V"], dtype, device)
        ref = _step(hidden, weight, bias, targets, g, ge)
        torch.save({n: t.cpu() for n, t in ref.items()}, Path(tmp, "tp1.pt"))
        ms, gib = _time(lambda: _step(hidden, weight, bias, targets, g, ge, validate=False), device,
                        3 if args.smoke else 10)
        report["tp1"] = {"fwd_bwd_ms": ms, "peak_extra_gib": gib}
        del hidden, weight, bias, ref
        if cuda:
            torch.cuda.empty_cache()
        for k in args.world_sizes:
            if cuda and k > torch.cuda.device_count():
                report["skipped"].append(f"TP={k}: only {torch.cuda.device_count()} GPUs")
                continue
            mp.spawn(_rank, args=(k, f"file://{tmp}/store{k}", cfg, tmp, tmp, args.smoke), nprocs=k, join=True)
            ranks = [json.loads(Path(tmp, f"k{k}_rank{r}.json").read_text()) for r in range(k)]
            report["runs"][str(k)] = {
                "ranks": ranks,
                "bitwise_all": all(all(r["bitwise"].values()) for r in ranks),
                "unaligned_within_contract": ranks[0]["unaligned"]["within_contract"],
                "attention_cp_chained_bitwise": ranks[-1]["attention_cp"]["chained_bitwise"],
                "attention_cp_merged_within_contract": ranks[0]["attention_cp"]["merged_within_contract"],
            }
    report["passed"] = bool(report["runs"]) and all(
        r["bitwise_all"] and r["unaligned_within_contract"] and r["attention_cp_chained_bitwise"]
        and r["attention_cp_merged_within_contract"] for r in report["runs"].values())
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: (v["bitwise_all"], v["unaligned_within_contract"], v["attention_cp_chained_bitwise"],
                          v["attention_cp_merged_within_contract"]) for k, v in report["runs"].items()}),
          "passed" if report["passed"] else "FAILED", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
