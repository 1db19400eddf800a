"""H200 benchmark of the RL operators at [64 x 8192] against the equivalent eager torch code,
measured in the same run. Run on the device: python scripts/gpu_bench_rl.py --out $OUT/rl.json
"""
import argparse
import datetime
import json
import sys

import torch
import triton

from rlk_triton import bench

B, T = 64, 8192


def eager_gae(r, v, m, gamma, lam):
    """The usual framework loop (verl-style), with masked tokens transparent as ours."""
    adv = torch.zeros_like(r)
    a_next = torch.zeros(r.shape[0], device=r.device)
    v_next = torch.zeros(r.shape[0], device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        act = m[:, t]
        delta = r[:, t] + gamma * v_next - v[:, t]
        a = delta + gamma * lam * a_next
        adv[:, t] = torch.where(act, a, 0.0)
        a_next = torch.where(act, a, a_next)
        v_next = torch.where(act, v[:, t], v_next)
    return adv, adv + v


def eager_group(s, gid, ok, G, eps=1e-6):
    w = ok.float()
    n = torch.zeros(G, device=s.device).index_add_(0, gid, w)
    mean = torch.zeros(G, device=s.device).index_add_(0, gid, s * w) / n.clamp_min(1)
    dev = (s - mean[gid]) * w
    var = torch.zeros(G, device=s.device).index_add_(0, gid, dev * dev) / (n - 1).clamp_min(1)
    out = (s - mean[gid]) / (var.sqrt()[gid] + eps)
    return torch.where(ok & (n[gid] > 1), out, 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    from rlk_triton.advantages import gae, group_advantages

    g = torch.Generator(device="cuda").manual_seed(0)
    r = torch.randn(B, T, device="cuda", generator=g)
    v = torch.randn(B, T, device="cuda", generator=g)
    m = torch.rand(B, T, device="cuda", generator=g) < 0.9
    rows = []

    def add(name, fn, baseline=None):
        """ms: wall-clock per call (host overhead included); graph_ms: the device work alone."""
        ms = bench.median_ms(fn, rep_ms=300)
        row = {"name": name, "ms": round(ms, 4)}
        try:
            row["graph_ms"] = round(bench.graph_ms(fn, rep_ms=300), 4)
        except Exception as ex:  # noqa: BLE001 - e.g. a host sync inside fn: not capturable
            row["graph_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
        if baseline:
            row["speedup_vs_eager"] = round(baseline[0] / ms, 2)
            if "graph_ms" in row and baseline[1]:
                row["graph_speedup_vs_eager"] = round(baseline[1] / row["graph_ms"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        return ms, row.get("graph_ms")

    e = add("eager torch GAE loop [64 x 8192]", lambda: eager_gae(r, v, m, 0.99, 0.95))
    add("rlk gae [64 x 8192]", lambda: gae(r, v, m, gamma=0.99, lam=0.95), e)
    s = torch.randn(B * 64, device="cuda", generator=g)
    gid = torch.randint(0, B * 8, (B * 64,), device="cuda", generator=g)
    ok = torch.rand(B * 64, device="cuda", generator=g) > 0.05
    e = add("eager torch group mean/std (4096 seqs, 512 groups)", lambda: eager_group(s, gid, ok, B * 8))
    add("rlk group_advantages mean_std (4096 seqs, 512 groups)",
        lambda: group_advantages(s, gid, num_groups=B * 8, mode="mean_std", valid=ok), e)
    add("rlk group_advantages mean_std validate=False (4096 seqs, 512 groups)",
        lambda: group_advantages(s, gid, num_groups=B * 8, mode="mean_std", valid=ok, validate=False), e)
    try:
        import rl_loss_bench  # scripts/rl_loss_bench.py, when the policy losses exist

        rl_loss_bench.run(add, B, T)
    except ImportError as ex:
        rows.append({"name": "policy losses", "error": str(ex)})
    report = {"date": datetime.date.today().isoformat(), "commit": args.commit,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "shape": [B, T], "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
