"""native/ on the GPU: the gate (`rlk_triton.native.admit`, which writes the admission record), then the
native kernel against the Triton kernel, same run: rows {op, shape, backend, wall_ms, device_ms,
bitwise} for the raw launches and, when admitted, the public call (rms_norm(backend=...)).

    python scripts/gpu_native.py --out native.json --commit <sha>

wall_ms: calls from the host with one sync at the end (what an eager caller pays per call);
device_ms: the same call captured in a CUDA graph.
"""
import argparse
import json
import time

import torch
import triton

from rlk_triton import bench, native
from rlk_triton.ops.rmsnorm import rms_norm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    t0 = time.time()
    gate = native.admit("rmsnorm")
    gate["seconds"] = time.time() - t0
    record = json.loads(native.record_path("rmsnorm").read_text()) if gate["admitted"] else None
    print({k: v for k, v in gate.items() if k != "mismatches"}, gate["mismatches"][:20], flush=True)
    rows = []
    report = {"what": "native/ rms_norm forward: the gate, then native against Triton, same run",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "gate": gate, "record": record, "rows": rows}
    nop = native.native_op("rmsnorm")
    ext = native.load("rmsnorm")
    g = torch.Generator(device="cuda").manual_seed(0)
    for N, H in ((1, 4096), (8, 4096), (64, 4096), (1024, 4096), (16384, 4096), (16384, 8192)):
        x = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(H, device="cuda", generator=g).to(torch.bfloat16)
        want = nop.triton(x, w, 1e-6, 0.0)
        calls = {"triton launch": lambda: nop.triton(x, w, 1e-6, 0.0),
                 "native launch": lambda: nop.native(ext, x, w, 1e-6, 0.0),
                 "rms_norm(backend='triton')": lambda: rms_norm(x, w, eps=1e-6)}
        if gate["admitted"]:
            calls["rms_norm(backend='cuda_native')"] = lambda: rms_norm(x, w, eps=1e-6, backend="cuda_native")
        for name, fn in calls.items():
            got = fn()
            y = got[0] if isinstance(got, tuple) else got
            rows.append({"op": "rms_norm fwd", "shape": f"{N} x {H} bf16", "backend": name,
                         "wall_ms": bench.wall_ms(fn), "device_ms": bench.graph_ms(fn),
                         "bitwise": native.same_bits(y, want[0])})
            print(rows[-1], flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
