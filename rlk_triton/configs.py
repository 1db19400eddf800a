"""The locked launch configs: one table, no autotune.

A config is a pure function of (kernel, arch, dtype, V bucket). It never depends on the number of
rows, so a row is computed by the same code, with the same reduction tree, whatever batch it is in.
The table is data: its fingerprint (hash of the table + triton version + arch) names a build, and
docs/configs.md is generated from it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch
import triton

from ._runtime import default_arch


@dataclass(frozen=True)
class LaunchConfig:
    block_v: int  # vocab elements per tile: the unit of the fixed tile order
    num_warps: int
    num_stages: int


# V buckets, by their upper bound (inclusive). The last bucket is open.
V_BUCKETS = (1024, 8192, None)

_DTYPES = ("bfloat16", "float16", "float32")


def _bucket_name(v_max):
    return "v>8192" if v_max is None else f"v<={v_max}"


# (kernel, arch, dtype, bucket) -> LaunchConfig.
# "cuda" is the row set for CUDA archs without rows of their own (not tuned; same semantics).
# sm90 rows come from scripts/gpu_tune.py on an H200 (docs/reports/h200-tune-2026-12-02.json):
# at [16384 x 151936] bf16 one warp per row with 2048-wide tiles read the logits at 1.03x the
# copy rate (2-4 warps: 0.92-1.04x; 8 warps: 0.70x); the backward peaked at 2048-wide tiles, 2 warps.
# 4-byte logits take half as wide tiles, so that a tile is the same number of bytes.
def _rows():
    t = {}
    for dt in _DTYPES:
        two_byte = dt != "float32"
        for arch in ("sm90", "cuda"):
            t[("selected_logp_fwd", arch, dt, "v<=1024")] = LaunchConfig(1024, 1, 3)
            t[("selected_logp_fwd", arch, dt, "v<=8192")] = LaunchConfig(2048 if two_byte else 1024, 1, 3)
            t[("selected_logp_fwd", arch, dt, "v>8192")] = LaunchConfig(2048 if two_byte else 1024, 1, 3)
            t[("selected_logp_bwd", arch, dt, "v<=1024")] = LaunchConfig(1024, 2, 1)
            t[("selected_logp_bwd", arch, dt, "v<=8192")] = LaunchConfig(2048 if two_byte else 1024, 2, 1)
            t[("selected_logp_bwd", arch, dt, "v>8192")] = LaunchConfig(2048 if two_byte else 1024, 2, 1)
        # The interpreter pays about 1 ms per program-iteration: few, wide tiles.
        for kernel in ("selected_logp_fwd", "selected_logp_bwd"):
            t[(kernel, "interpreter", dt, "v<=1024")] = LaunchConfig(1024, 4, 1)
            t[(kernel, "interpreter", dt, "v<=8192")] = LaunchConfig(8192, 4, 1)
            t[(kernel, "interpreter", dt, "v>8192")] = LaunchConfig(16384, 4, 1)
    # Per-token RL kernels over fp32 [B, T] (block_v = the tile of the dim a program streams: tokens
    # of a row, rows of the batch, members of a group). One bucket: they never depend on B or T.
    # The "cuda" rows are untuned defaults; the interpreter rows keep tests cheap.
    rl = {  # kernel: (cuda block, cuda warps, interpreter block, interpreter warps)
        "rl_ratio_kl_fwd": (1024, 4, 256, 4), "rl_ratio_kl_bwd": (1024, 4, 256, 4),
        "rl_policy_loss_rows": (1024, 4, 256, 4), "rl_policy_loss_batch": (1024, 4, 64, 4),
        "rl_policy_loss_bwd": (1024, 4, 256, 4),
        "gae": (1024, 4, 512, 1), "group_stats": (256, 2, 1024, 1),
    }
    for kernel, (cb, cw, ib, iw) in rl.items():
        t[(kernel, "cuda", "float32", "any")] = LaunchConfig(cb, cw, 1)
        t[(kernel, "interpreter", "float32", "any")] = LaunchConfig(ib, iw, 1)
    return t


LOCKED_CONFIGS: dict[tuple[str, str, str, str], LaunchConfig] = _rows()


def v_bucket(V: int) -> str:
    for v_max in V_BUCKETS:
        if v_max is None or V <= v_max:
            return _bucket_name(v_max)
    raise AssertionError("unreachable: the last bucket is open")


def table_arch(arch: str, kernel: str | None = None) -> str:
    """The table's arch key for a runtime arch: its own rows (for that kernel) if it has them, else
    the generic CUDA rows."""
    if any(k[1] == arch and (kernel is None or k[0] == kernel) for k in LOCKED_CONFIGS):
        return arch
    if arch.startswith("sm"):
        return "cuda"
    raise KeyError(f"no locked configs for arch {arch!r}")


def lookup(kernel: str, arch: str, dtype: torch.dtype, V: int) -> LaunchConfig:
    """The locked config of a launch. Raises KeyError for a combination the table does not hold."""
    dt = str(dtype).removeprefix("torch.")
    key = (kernel, table_arch(arch, kernel), dt, v_bucket(V))
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


def lookup_fixed(kernel: str, arch: str) -> LaunchConfig:
    """The locked config of an fp32 per-token kernel with a single shape bucket."""
    key = (kernel, table_arch(arch, kernel), "float32", "any")
    try:
        return LOCKED_CONFIGS[key]
    except KeyError:
        raise KeyError(f"no locked config for {key}") from None


def table_as_data() -> list[dict]:
    return [
        {"kernel": k, "arch": a, "dtype": d, "v_bucket": b, **asdict(c)}
        for (k, a, d, b), c in sorted(LOCKED_CONFIGS.items())
    ]


def fingerprint(arch: str | None = None) -> str:
    """Hash of the locked-config table, the triton version and the arch: names the compiled semantics."""
    arch = arch or default_arch()
    payload = json.dumps(
        {"table": table_as_data(), "triton": triton.__version__, "arch": arch}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
