"""How each operator's claims are checked: its parity cases, the judge that holds a result against
its contract, the row ops of the bitwise batch-invariance axes, and the small probe that measures
whether a backend is usable here. The claims themselves are rlk_triton/operators.py's; this module
only depends on them (the registry reaches the probes by name: registry.register_probe).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Harness:
    op: str
    parity_cases: Callable[[bool], list]  # (on_gpu) -> cases
    judge: Callable  # (case, device, backend=...) -> {name: error / bound}
    row_ops: Callable[[str, bool], list]  # (device, on_gpu) -> [RowOp]
    probe: Callable[[str, str], None]  # (backend name, device): raises if unusable


@functools.lru_cache(maxsize=None)
def harnesses() -> dict:
    """op name -> Harness, for every operator of rlk_triton/operators.py."""
    from .attention_parity import attention_harness
    from .linear_parity import linear_logp_harness
    from .matmul_parity import matmul_harness
    from .parity import selected_logp_harness
    from .positional import embedding_harness, rope_harness
    from .rl_ops import rl_harnesses
    from .rowwise import rmsnorm_harness, swiglu_harness

    hs = [selected_logp_harness(), linear_logp_harness(), matmul_harness(), rmsnorm_harness(), swiglu_harness(),
          rope_harness(), embedding_harness(), attention_harness(), *rl_harnesses()]
    return {h.op: h for h in hs}


def harness(op: str) -> Harness:
    from ..errors import InputError

    try:
        return harnesses()[op]
    except KeyError:
        raise InputError("op", f"no harness for operator {op!r} (have: {sorted(harnesses())})") from None


def register_probes() -> None:
    """Give the registry every operator's availability probe (it looks them up by operator name)."""
    from .. import registry

    for name, h in harnesses().items():
        registry.register_probe(name, h.probe)
