"""The torch reference backend meets the same contract and the same bitwise invariance."""
import itertools

import pytest
import torch

from rlk_triton.logp import selected_logp
from rlk_triton.testing import assert_batch_invariant
from rlk_triton.testing.parity import LogpCase, judge_selected_logp, selected_logp_row_op

CASES = [LogpCase(20, V, dt, T, 3.0, lay, seed=i) for i, (V, dt, T, lay) in enumerate(itertools.product(
    (1, 3, 1000), (torch.bfloat16, torch.float16, torch.float32), (0.7, "rows"), ("contiguous", "slice3d")))]
CASES += [LogpCase(4, 50257, torch.bfloat16, 1.0, 1e4, "row_stride", seed=99)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", "-"))
def test_reference_backend_within_contract(case, device):
    ratios = judge_selected_logp(case, device, backend="torch_reference")
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_reference_backend_batch_invariant(dtype, device):
    # batch sizes straddle the 16-row chunk so that rows move between chunks and chunk positions
    assert_batch_invariant(selected_logp_row_op(700, dtype, device, "rows", backend="torch_reference"),
                           probe_rows=3, batch_sizes=(5, 17, 40))


def test_reference_backend_runs_on_cpu_without_the_interpreter(monkeypatch):
    import rlk_triton.logp as logp_mod

    monkeypatch.setattr(logp_mod, "_INTERPRETED", False)
    x = torch.randn(3, 10)
    out = selected_logp(x, torch.tensor([1, 2, 3]), backend="torch_reference")
    assert out.dtype == torch.float32 and out.shape == (3,)


def test_unknown_backend_is_a_typed_error(device):
    from rlk_triton.errors import BackendError

    with pytest.raises(BackendError) as e:
        selected_logp(torch.randn(2, 5, device=device), torch.zeros(2, dtype=torch.long, device=device),
                      backend="cuda_magic")
    assert e.value.argument == "backend"
