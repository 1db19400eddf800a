"""The registered operators and how `rlk-triton check` verifies each on this machine.

Each entry names the op's contract table, its parity cases (small under the interpreter, larger on
a GPU), its judge (testing.parity) and its row-wise form for the invariance harness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Operator:
    name: str
    contract: str
    parity_cases: Callable[[bool], list]  # (on_gpu) -> cases
    judge: Callable  # (case, device) -> {name: error / bound}
    row_ops: Callable[[str, bool], list]  # (device, on_gpu) -> [RowOp]


def _selected_logp() -> Operator:
    from .testing import parity

    def cases(on_gpu):
        # the float64 reference on the host dominates the time: few rows even on a GPU
        rows, big = (32, (1, 3, 1000, 32000, 50257, 151936, 262144)) if on_gpu else (4, (1, 3, 1000, 50257))
        out = []
        for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            for V in big:
                for T, layout in (("rows", "contiguous"), (0.7, "slice3d")):
                    out.append(parity.LogpCase(rows, V, dtype, T, 3.0, layout, seed=i * 1000 + V))
        return out

    def row_ops(device, on_gpu):
        Vs = (1000, 151936) if on_gpu else (1000,)
        return [parity.selected_logp_row_op(V, dt, device) for V in Vs
                for dt in (torch.bfloat16, torch.float16, torch.float32)]

    return Operator("selected_logp", "selected_logp", cases, parity.judge_selected_logp, row_ops)


def operators() -> list[Operator]:
    return [_selected_logp()]
