"""Host time of a mode-policy decision and of a backend descriptor on this CPU: what a framework pays
to call `policy.resolve` per op call (with rows=) or `registry.capabilities()`.

    python scripts/policy_cost_cpu.py [--json FILE] [--label TEXT]

Decisions are resolved for cpu with the availability of an H200 simulated (Triton and the reference
available, the native kernels admitted), so every candidate is examined as on the GPU machine.
Each row: the best of 5 rounds, microseconds per call.
"""
import argparse
import json
import platform
import subprocess
import sys
import time
import warnings

import rlk_triton._runtime as _runtime
from rlk_triton import native, policy, registry

_runtime.arch_of = lambda device, argument="device": "sm90"  # as on the H200
policy.arch_of = _runtime.arch_of
registry.measure_availability = lambda op, backend, device: (True, None)
native.usable = lambda op, device: (True, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    kw = dict(dtype="bfloat16", device="cpu", fast="auto", consistency="audit", env={})
    calls = {
        "policy.resolve selected_logp, rows=8": lambda: policy.resolve("selected_logp", rows=8, **kw),
        "policy.resolve rmsnorm, rows=None": lambda: policy.resolve("rmsnorm", **kw),
        "registry.capabilities('cpu'), every backend": lambda: registry.capabilities("cpu"),
    }
    rows = []
    for name, fn in calls.items():
        fn()
        t0 = time.perf_counter()
        fn()
        n = max(5, min(2000, int(0.5 / max(time.perf_counter() - t0, 1e-6))))  # about half a second a round
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        rows.append({"call": name, "host_us": best, "calls_per_round": n})
        print(f"{name:45s} {best:10.1f} us", flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.json, "w") as f:
            json.dump({"what": __doc__.splitlines()[0], "commit": commit, "label": args.label,
                       "cpu": platform.processor() or platform.machine(), "python": sys.version.split()[0],
                       "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
