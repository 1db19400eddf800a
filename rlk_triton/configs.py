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
# Values for sm90 come from the sweep in scripts/gpu_tune.py on an H200 (docs/reports/).
def _rows():
    t = {}
    for dt in _DTYPES:
        wide = dt != "float32"  # 2-byte logits: twice the elements per 16-byte load
        for arch in ("sm90", "cuda"):
            t[("selected_logp_fwd", arch, dt, "v<=1024")] = LaunchConfig(1024, 4, 1)
            t[("selected_logp_fwd", arch, dt, "v<=8192")] = LaunchConfig(2048 if wide else 1024, 4, 1)
            t[("selected_logp_fwd", arch, dt, "v>8192")] = LaunchConfig(4096 if wide else 2048, 8, 1)
            t[("selected_logp_bwd", arch, dt, "v<=1024")] = LaunchConfig(1024, 4, 1)
            t[("selected_logp_bwd", arch, dt, "v<=8192")] = LaunchConfig(2048, 4, 1)
            t[("selected_logp_bwd", arch, dt, "v>8192")] = LaunchConfig(4096, 8, 1)
        # The interpreter pays about 1 ms per program-iteration: few, wide tiles.
        for kernel in ("selected_logp_fwd", "selected_logp_bwd"):
            t[(kernel, "interpreter", dt, "v<=1024")] = LaunchConfig(1024, 4, 1)
            t[(kernel, "interpreter", dt, "v<=8192")] = LaunchConfig(8192, 4, 1)
            t[(kernel, "interpreter", dt, "v>8192")] = LaunchConfig(16384, 4, 1)
    return t


LOCKED_CONFIGS: dict[tuple[str, str, str, str], LaunchConfig] = _rows()


def v_bucket(V: int) -> str:
    for v_max in V_BUCKETS:
        if v_max is None or V <= v_max:
            return _bucket_name(v_max)
    raise AssertionError("unreachable: the last bucket is open")


def table_arch(arch: str) -> str:
    """The table's arch key for a runtime arch: its own rows if it has them, else the generic CUDA rows."""
    if any(k[1] == arch for k in LOCKED_CONFIGS):
        return arch
    if arch.startswith("sm"):
        return "cuda"
    raise KeyError(f"no locked configs for arch {arch!r}")


def lookup(kernel: str, arch: str, dtype: torch.dtype, V: int) -> LaunchConfig:
    """The locked config of a launch. Raises KeyError for a combination the table does not hold."""
    dt = str(dtype).removeprefix("torch.")
    key = (kernel, table_arch(arch), dt, v_bucket(V))
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
