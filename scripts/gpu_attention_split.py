"""The attention backward's per-sequence whole-block rule (configs split_min_len) on the GPU: for each
threshold, the backward's device time and its bits against the rule off (0), same run, same inputs.
Beside it, forward and forward + backward against SDPA's default backend choice (and which backend
that is) and its flash backend, the issue's report rows; and against torch's own packed-varlen call,
torch.nn.attention.varlen.varlen_attn, at every shape: the stock baseline of a packed batch of mixed
lengths, which SDPA cannot take causally (nested tensors refuse is_causal).

    python scripts/gpu_attention_split.py --out split.json --commit <sha> [--min-lens 0 1024 2048 4096]

Sets the thresholds by replacing the locked backward rows of this device in configs.LOCKED_CONFIGS,
as tests/test_attention.py does; nothing is written to the table.
"""
import argparse
import dataclasses
import inspect
import json
import time
from functools import partial

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlk_triton import attention, bench, configs
from rlk_triton._runtime import default_arch
from rlk_triton.bench.report import device_ms
from rlk_triton.ops import attention as ops

graph_ms = partial(bench.graph_ms, reps=3)


def set_split(min_len, dtype, d):
    arch = default_arch()
    dt = str(dtype).removeprefix("torch.")
    bucket = "d<=128" if d <= 128 else "d256"
    for kernel in ("attention_bwd_dkdv", "attention_bwd_dq"):
        key = (kernel, configs.table_arch(arch, kernel), dt, bucket)
        configs.LOCKED_CONFIGS[key] = dataclasses.replace(configs.LOCKED_CONFIGS[key], split_min_len=min_len)


def sdpa_backend(q, k, v):
    """The backend F.scaled_dot_product_attention picks by default for these inputs (profiler kernel names)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events()).lower()
    for tag, name in (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "efficient"), ("efficient", "efficient")):
        if tag in names:
            return name
    return "math"


def stock_varlen(q, k, v, cu, max_seqlen, scale):
    """(call, how) for torch's packed-varlen attention on these tokens, causal, or (None, why not).
    The API moved between torch releases: causality is `is_causal=True` (2.9) or `window_size=(-1, 0)`
    (later); GQA is `enable_gqa=True` where the call has it, else K / V are expanded to the q heads
    first (inside the timed call, so the row says so)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as ex:
        return None, f"unavailable in torch {torch.__version__}: {ex}"
    params = inspect.signature(varlen_attn).parameters
    kw, how = {}, ["torch.nn.attention.varlen.varlen_attn"]
    if "is_causal" in params:
        kw["is_causal"] = True
    elif "window_size" in params:
        kw["window_size"] = (-1, 0)
    else:
        return None, f"varlen_attn in torch {torch.__version__} has no causal argument"
    if "scale" in params:
        kw["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        return None, "varlen_attn without a scale argument and a scale other than 1/sqrt(D)"
    group = q.shape[1] // k.shape[1]
    expand = group > 1 and "enable_gqa" not in params
    if group > 1 and not expand:
        kw["enable_gqa"] = True
    how.append("K / V expanded to the q heads in the call" if expand else f"{' '.join(f'{a}={b}' for a, b in kw.items())}")

    def call(q, k, v):
        if expand:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, **kw)
    return call, "; ".join(how)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--min-lens", type=int, nargs="+", default=[0, 1024, 2048, 4096])
    ap.add_argument("--time-box", type=float, default=1e9)
    ap.add_argument("--fwd-sweep", action="store_true",
                    help="also time the forward at other (block_m, block_n, warps, stages): another block_n is "
                         "another reduction order (decode would follow), so these rows are speed only")
    args = ap.parse_args()
    t0 = time.time()
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    shapes = [("4 x 8192", [8192] * 4, 32, 8, 128), ("16 x 2048", [2048] * 16, 32, 8, 128),
              ("64 x 1024", [1024] * 64, 32, 8, 128),
              ("64 mixed 64..4096", [int(x) for x in torch.randint(64, 4097, (64,), generator=torch.Generator().manual_seed(1))], 32, 8, 128),
              ("4 x 8192 MHA", [8192] * 4, 32, 32, 128), ("4 x 8192 D=64", [8192] * 4, 32, 8, 64),
              ("2 x 8192 D=256", [8192] * 2, 16, 8, 256)]
    rows, compare = [], []
    saved = dict(configs.LOCKED_CONFIGS)
    report = {"what": "attention backward: split_min_len thresholds, and fwd / fwd+bwd against SDPA, same run",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "rows": rows, "sdpa": compare,
              "varlen": [], "fwd_sweep": []}
    for label, lens, hq, hkv, d in shapes:
        if time.time() - t0 > args.time_box:
            break
        N, L = sum(lens), max(lens)
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
        q, k, v = (torch.randn(N, h, d, device="cuda", generator=g).to(dt) for h in (hq, hkv, hkv))
        sc = d ** -0.5
        shape = f"{label}, {hq}/{hkv} heads, D={d}, causal, bf16"
        out, lse = ops.launch_forward(q, k, v, cu, L, sc, True)
        do = torch.randn_like(out)
        if args.fwd_sweep and d == 128 and label in ("4 x 8192", "16 x 2048", "64 x 1024"):
            locked_ms = graph_ms(lambda: ops.launch_forward(q, k, v, cu, L, sc, True))
            for bm, bn, w, st in ((128, 64, 8, 4), (128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 16, 2),
                                  (64, 128, 4, 3), (128, 32, 8, 4), (64, 64, 4, 4)):
                c = configs.MatmulConfig(bm, bn, 0, 1, w, st)
                try:
                    ms = graph_ms(lambda: ops.launch_forward(q, k, v, cu, L, sc, True, cfg=c))
                    r = {"shape": shape, "block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st,
                         "ms": ms, "locked_ms": locked_ms, "vs_locked": locked_ms / ms}
                except Exception as ex:  # noqa: BLE001 - reported
                    r = {"shape": shape, "block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st,
                         "error": repr(ex)[:200]}
                report["fwd_sweep"].append(r)
                print(r, flush=True)
        base, base_ms = None, None
        for m in args.min_lens:
            set_split(m, dt, d)
            res = ops.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True)
            ms = graph_ms(lambda: ops.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True))
            if base is None:
                base, base_ms = res, ms
                again = graph_ms(lambda: ops.launch_backward(do, None, q, k, v, out, lse, cu, L, sc, True))
            rows.append({"shape": shape, "split_min_len": m, "bwd_ms": ms, "vs_off": base_ms / ms,
                         "off_again_ms": again if m == args.min_lens[0] else None,
                         "bitwise_vs_off": all(torch.equal(a, b) for a, b in zip(base, res))})
            print(rows[-1], flush=True)
        configs.LOCKED_CONFIGS.clear()
        configs.LOCKED_CONFIGS.update(saved)
        # the public op, timed once per shape, against torch's packed-varlen call (every shape, mixed
        # lengths included) and against SDPA (equal lengths only: SDPA takes [B, H, L, D])
        qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))

        def rlk_fwd():
            return attention(qr, kr, vr, cu, max_seqlen=L, causal=True, validate=False)[0]

        def rlk_fb():
            return torch.autograd.grad(rlk_fwd(), (qr, kr, vr), do)

        ours = {"fwd": graph_ms(rlk_fwd), "fwd+bwd": graph_ms(rlk_fb)}
        stock, how = stock_varlen(q, k, v, cu, L, sc)
        vrow = {"shape": shape, "baseline": how}
        if stock is not None:
            def st_fwd():
                return stock(qr, kr, vr)

            def st_fb():
                return torch.autograd.grad(st_fwd(), (qr, kr, vr), do)

            for p, fs in (("fwd", st_fwd), ("fwd+bwd", st_fb)):
                try:
                    sms, clock = device_ms(fs, "cuda")
                    r = {"pass": p, "rlk_ms": ours[p], "stock_varlen_ms": sms, "ratio": sms / ours[p],
                         "stock_clock": clock}
                except Exception as ex:  # noqa: BLE001 - reported
                    r = {"pass": p, "error": f"{type(ex).__name__}: {str(ex)[:300]}"}
                report["varlen"].append(vrow | r)
                print(report["varlen"][-1], flush=True)
        else:
            report["varlen"].append(vrow | {"error": "not run"})
            print(report["varlen"][-1], flush=True)
        if len(set(lens)) == 1:
            B = len(lens)
            qs, ks, vs = (x.detach().reshape(B, L, -1, d).transpose(1, 2).requires_grad_() for x in (q, k, v))
            dos = do.reshape(B, L, hq, d).transpose(1, 2)

            def sd_fwd():
                return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

            def sd_fb():
                return torch.autograd.grad(sd_fwd(), (qs, ks, vs), dos)

            row = {"shape": shape, "sdpa_backend": sdpa_backend(qs, ks, vs)}
            for p, fs in (("fwd", sd_fwd), ("fwd+bwd", sd_fb)):
                r = {"pass": p, "rlk_ms": ours[p], "sdpa_default_ms": graph_ms(fs)}
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    r["sdpa_flash_ms"] = graph_ms(fs)
                r["ratio"] = r["sdpa_default_ms"] / r["rlk_ms"]
                compare.append(row | r)
                print(compare[-1], flush=True)
        del q, k, v, out, lse, do
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
