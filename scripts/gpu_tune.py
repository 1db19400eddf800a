"""Sweep launch configs of the selected_logp kernels on the GPU, to choose the locked ones.

This is the only code that edits configs.LOCKED_CONFIGS (in its own process): it times each
candidate and prints the ratios against the copy rate measured in the same run. The chosen rows
go into rlk_triton/configs.py by hand, with the report in docs/reports/.
Run on the device: python scripts/gpu_tune.py --out $OUT/tune.json
"""
import argparse
import itertools
import json
import sys

import torch
import triton

from rlk_triton import bench, configs
from rlk_triton.logp import selected_logp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--V", type=int, default=151936)
    args = ap.parse_args()
    arch = configs.table_arch(f"sm{''.join(map(str, torch.cuda.get_device_capability()))}")
    rows, V = args.rows, args.V
    copy = bench.copy_rate_gbps()
    logits, targets, grad = bench.logp_inputs(rows, V)
    nbytes = logits.numel() * logits.element_size()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "rows": rows, "V": V, "copy_GBps": copy, "fwd": [], "bwd": []}
    print(f"copy {copy:.0f} GB/s", flush=True)
    key_f = ("selected_logp_fwd", arch, "bfloat16", configs.v_bucket(V))
    key_b = ("selected_logp_bwd", arch, "bfloat16", configs.v_bucket(V))
    base_f, base_b = configs.LOCKED_CONFIGS[key_f], configs.LOCKED_CONFIGS[key_b]
    for block, warps, stages in itertools.product((1024, 2048, 4096, 8192), (1, 2, 4, 8), (1, 3)):
        if block // (32 * warps) > 128:  # too many elements per thread: spills
            continue
        configs.LOCKED_CONFIGS[key_f] = configs.LaunchConfig(block, warps, stages)
        for ent in (False, True):
            try:
                ms = bench.median_ms(lambda: selected_logp(logits, targets, return_entropy=ent, validate=False))
                r = {"block_v": block, "num_warps": warps, "num_stages": stages, "entropy": ent,
                     "ms": ms, "ratio_vs_copy": nbytes / ms / 1e6 / copy}
            except Exception as ex:  # noqa: BLE001 - a config that fails to compile is a finding
                r = {"block_v": block, "num_warps": warps, "num_stages": stages, "entropy": ent, "error": str(ex)[:200]}
            report["fwd"].append(r)
            print(json.dumps(r), flush=True)
    configs.LOCKED_CONFIGS[key_f] = base_f
    # backward alone: time fwd+bwd minus fwd with the fwd config fixed
    fwd_ms = bench.median_ms(lambda: selected_logp(logits, targets, validate=False))
    for block, warps in itertools.product((1024, 2048, 4096, 8192), (2, 4, 8, 16)):
        configs.LOCKED_CONFIGS[key_b] = configs.LaunchConfig(block, warps, 1)
        step = bench.logp_fwd_bwd(lambda x, t: selected_logp(x, t, validate=False), logits, targets, grad)
        try:
            ms = bench.median_ms(step)
            r = {"block_v": block, "num_warps": warps, "fwd_bwd_ms": ms, "bwd_ms": ms - fwd_ms,
                 "ratio_vs_copy": 3 * nbytes / ms / 1e6 / copy}
        except Exception as ex:  # noqa: BLE001
            r = {"block_v": block, "num_warps": warps, "error": str(ex)[:200]}
        report["bwd"].append(r)
        print(json.dumps(r), flush=True)
    configs.LOCKED_CONFIGS[key_b] = base_b
    best_f = max((r for r in report["fwd"] if "ms" in r and not r["entropy"]), key=lambda r: r["ratio_vs_copy"])
    best_fe = max((r for r in report["fwd"] if "ms" in r and r["entropy"]), key=lambda r: r["ratio_vs_copy"])
    best_b = max((r for r in report["bwd"] if "fwd_bwd_ms" in r), key=lambda r: r["ratio_vs_copy"])
    print("best fwd", best_f, "\nbest fwd+entropy", best_fe, "\nbest fwd+bwd", best_b)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
