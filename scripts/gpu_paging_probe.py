"""attention_decode's page-id reads on the GPU: what reading the next block's page id one block
ahead (configs.MatmulConfig.page_ahead) does to the compiled loop (its async waits and K / V buffers,
from the Triton cache's TTGIR) and to the time, at decode steps and prefill chunks, bits compared
with the training forward.

    TRITON_CACHE_DIR=/tmp/tc python scripts/gpu_paging_probe.py --out paging.json [--prefill-only]

Report: docs/reports/h200-paging-2026-12-04.json. That run also measured a third way since removed
(each key's page id read as a vector beside the keys: slower at every shape).
"""
import argparse
import dataclasses
import glob
import json
import os
import re

import torch
import triton

from rlk_triton import bench, configs
from rlk_triton._runtime import default_arch
from rlk_triton.ops import attention as at

DT, D, Hq, Hkv, PAGE = torch.bfloat16, 128, 16, 8, 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill-only", action="store_true", help="chunked prefill rows only, more configs")
    args = ap.parse_args()
    arch = default_arch()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B, L in ((8, 32768),) if args.prefill_only else ((8, 32768), (64, 4096), (256, 1024)):
        N = B * L
        q = torch.randn(N, Hq, D, device="cuda", generator=g).to(DT)
        k = torch.randn(N, Hkv, D, device="cuda", generator=g).to(DT)
        v = torch.randn(N, Hkv, D, device="cuda", generator=g).to(DT)
        cu = torch.arange(0, N + 1, L, device="cuda", dtype=torch.int32)
        out_t, lse_t = at.launch_forward(q, k, v, cu, L, D**-0.5, True)
        per = L // PAGE
        bt = torch.randperm(B * per, device="cuda", generator=g).reshape(B, per).to(torch.int32)
        kc = torch.empty(B * per, PAGE, Hkv, D, device="cuda", dtype=DT)
        vc = torch.empty_like(kc)
        kc[bt.reshape(-1).long()] = k.reshape(B * per, PAGE, Hkv, D)
        vc[bt.reshape(-1).long()] = v.reshape(B * per, PAGE, Hkv, D)
        sl = torch.full((B,), L, device="cuda", dtype=torch.int32)
        last = cu[1:].long() - 1
        qd = q[last].contiguous()
        cuq = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        if B == 8:
            fwd = bench.graph_ms(lambda: at.launch_forward(q, k, v, cu, L, D**-0.5, True), 2)
            rows.append({"case": "forward 8 x 32768", "ms": fwd})
            pre_cfgs = [configs.lookup_decode(arch, DT, D, B * Hkv, L * 2),
                        configs.MatmulConfig(128, 64, 0, 1, 8, 3), configs.MatmulConfig(128, 64, 0, 1, 8, 3, q_heads=1)]
            if args.prefill_only:
                pre_cfgs = [configs.MatmulConfig(m, 64, 0, 1, w, st, q_heads=qh) for m, w, st, qh in (
                    (128, 8, 2, 0), (128, 8, 3, 0), (128, 8, 4, 0), (128, 8, 5, 0), (128, 4, 3, 0), (64, 4, 3, 0),
                    (64, 4, 4, 0), (128, 8, 4, 1))]
            for c in pre_cfgs:
                for pg in (True,) if args.prefill_only else (False, True):
                    o, lz = at.launch_decode(q, kc, vc, bt, sl, cu, L, D**-0.5, cfg=dataclasses.replace(c, page_ahead=pg))
                    ms = bench.graph_ms(lambda: at.launch_decode(q, kc, vc, bt, sl, cu, L, D**-0.5, cfg=dataclasses.replace(c, page_ahead=pg)), 2)
                    rows.append({"case": f"prefill {B} x {L}", "page_ahead": pg, "config": str(c), "ms": ms,
                                 "vs_forward": fwd / ms, "bitwise": torch.equal(o, out_t) and torch.equal(lz, lse_t)})
                    print(rows[-1], flush=True)
            if args.prefill_only:
                C = 4096
                tok = torch.arange(N, device="cuda").reshape(B, L)
                chunks = [(tok[:, c0:c0 + C].reshape(-1), torch.full((B,), c0 + C, device="cuda", dtype=torch.int32))
                          for c0 in range(0, L, C)]
                chunks = [(i, q[i].contiguous(), s) for i, s in chunks]
                cuc = torch.arange(0, B * C + 1, C, device="cuda", dtype=torch.int32)
                for c in pre_cfgs[:3]:
                    run = lambda: [at.launch_decode(qc, kc, vc, bt, s, cuc, C, D**-0.5, cfg=dataclasses.replace(c, page_ahead=True))  # noqa: E731
                                   for _, qc, s in chunks]
                    res = run()
                    ms = bench.graph_ms(run, 2)
                    rows.append({"case": f"prefill {B} x {L} in chunks of {C}", "page_ahead": True, "config": str(c), "ms": ms,
                                 "vs_forward": fwd / ms,
                                 "bitwise": all(torch.equal(o, out_t[i]) and torch.equal(lz, lse_t[:, i])
                                                for (i, _, _), (o, lz) in zip(chunks, res))})
                    print(rows[-1], flush=True)
                continue
        c = configs.lookup_decode(arch, DT, D, B * Hkv, 2)
        for pg in (False, True):
            o, lz = at.launch_decode(qd, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=dataclasses.replace(c, page_ahead=pg))
            ms = bench.graph_ms(lambda: at.launch_decode(qd, kc, vc, bt, sl, cuq, 1, D**-0.5, cfg=dataclasses.replace(c, page_ahead=pg)), 10)
            rows.append({"case": f"decode {B} x {L}", "page_ahead": pg, "config": str(c), "ms": ms,
                         "bitwise": torch.equal(o, out_t[last]) and torch.equal(lz, lse_t[:, last])})
            print(rows[-1], flush=True)
        del q, k, v, kc, vc, out_t, lse_t
        torch.cuda.empty_cache()
    loops = []
    for f in glob.glob(os.path.join(os.environ.get("TRITON_CACHE_DIR", "/tmp/tc"), "*", "_decode_kernel.ttgir")):
        txt = open(f).read()
        loops.append({"file": os.path.basename(os.path.dirname(f)),
                      "async_wait_nums": re.findall(r"async_wait .*?\{num = (\d+)", txt),
                      "kv_buffers": re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x64x128xbf16", txt)})
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "rows": rows, "loops": loops}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
