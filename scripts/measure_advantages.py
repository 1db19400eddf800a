"""Measure the advantage estimators' error against float64 to set contracts/advantages.yaml.

Prints, per output, the worst err / scale (scale from reference/advantages.py). Run on CPU with
TRITON_INTERPRET=1 (set automatically) or on a GPU: python scripts/measure_advantages.py
"""
import json
import os
import sys

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rlk_triton.advantages import gae, group_advantages  # noqa: E402
from rlk_triton.reference.advantages import gae_reference, group_advantages_reference  # noqa: E402


def ratio(ours, ref, scale):
    err = np.abs(np.asarray(ours, np.float64) - ref)
    return float(np.max(np.where(err == 0, 0.0, err / np.maximum(scale, 1e-300)), initial=0.0))


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    worst = {"gae_advantages": 0.0, "gae_returns": 0.0, "group_mean": 0.0, "group_mean_std": 0.0, "group_rloo": 0.0}
    for T in (1, 7, 1000, 1025, 4096, 8192):
        for scale in (1e-3, 1.0, 100.0):
            for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.5, 0.0)):
                B = 4
                r = (torch.randn(B, T, generator=g) * scale).to(dev)
                v = (torch.randn(B, T, generator=g) * scale).to(dev)
                m = (torch.rand(B, T, generator=g) > 0.2).to(dev)
                boot = (torch.randn(B, generator=g) * scale).to(dev)
                a, R = gae(r, v, m, gamma=gamma, lam=lam, bootstrap_values=boot)
                ra, rR, sc = gae_reference(r.cpu().numpy(), v.cpu().numpy(), m.cpu().numpy(), boot.cpu().numpy(),
                                           gamma, lam)
                worst["gae_advantages"] = max(worst["gae_advantages"], ratio(a.cpu(), ra, sc))
                worst["gae_returns"] = max(worst["gae_returns"], ratio(R.cpu(), rR, sc))
    for B in (2, 16, 300, 3000):
        for scale in (1e-3, 1.0, 100.0):
            s = (torch.randn(B, generator=g) * scale + scale).to(dev)
            groups = max(1, B // 8)
            gid = torch.randint(0, groups, (B,), generator=g).to(dev)
            ok = (torch.rand(B, generator=g) > 0.1).to(dev)
            for mode in ("mean", "mean_std", "rloo"):
                o = group_advantages(s, gid, num_groups=groups, mode=mode, valid=ok)
                ro, sc = group_advantages_reference(s.cpu().numpy(), gid.cpu().numpy(), ok.cpu().numpy(), mode)
                worst[f"group_{mode}"] = max(worst[f"group_{mode}"], ratio(o.cpu(), ro, sc))
    print(json.dumps({"device": dev, "worst_err_over_scale": worst}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
