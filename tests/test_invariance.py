"""Bitwise batch invariance of selected_logp through the shared harness, and the harness itself."""
import pytest
import torch

from rlk_triton.logp import selected_logp, selected_logp_indexed
from rlk_triton.testing import RowOp, assert_batch_invariant, check_batch_invariance
from rlk_triton.testing.parity import make_logits, selected_logp_row_op


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("V", (1000, 32000))
@pytest.mark.parametrize("temperature", ("rows", 0.7))
def test_selected_logp_batch_invariant(V, dtype, temperature, device):
    report = assert_batch_invariant(selected_logp_row_op(V, dtype, device, temperature),
                                    probe_rows=2, batch_sizes=(3, 7))
    axes = {r.axis for r in report.results}
    assert axes == {"repeat", "batch_size", "row_position", "padding_rows", "neighbours", "dense_indexed"}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("V", (1, 1000, 32000, 151936, 262144))
@pytest.mark.parametrize("temperature", ("rows", 1.0))
def test_selected_logp_batch_invariant_gpu(V, dtype, temperature):
    assert_batch_invariant(selected_logp_row_op(V, dtype, "cuda", temperature),
                           probe_rows=4, batch_sizes=(5, 64, 1000))


def test_harness_catches_a_row_mixing_op(device):
    """An op whose rows depend on the batch (a batch mean) must fail the check."""
    def make_rows(n, gen):
        return (torch.randn(n, 16, generator=gen).to(device),)

    op = RowOp("mixes rows", lambda x: (x - x.mean(0, keepdim=True),), make_rows, grad_inputs=(0,))
    report = check_batch_invariance(op, probe_rows=2, batch_sizes=(3, 7))
    assert not report.passed
    assert {r.axis for r in report.failures()} >= {"batch_size", "neighbours"}


def test_harness_catches_order_dependent_reduction(device):
    """A per-row sum whose association depends on the batch size is caught bitwise."""
    def f(x):
        chunks = 16 if x.shape[0] % 2 else 64  # a different summation tree for odd batches
        return (x.view(x.shape[0], chunks, -1).sum(-1).sum(-1),)

    def make_rows(n, gen):
        return (torch.randn(n, 4096, generator=gen, dtype=torch.float32).to(device),)

    assert not check_batch_invariance(RowOp("order", f, make_rows), probe_rows=2, batch_sizes=(3, 8)).passed


def _logits(n, V, dtype, device, seed=0):
    return make_logits(n, V, dtype, 3.0, torch.Generator().manual_seed(seed), device)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_logp_same_with_and_without_entropy(dtype, device):
    """Rollout often asks for logp alone and the trainer for logp + entropy: same bits."""
    x = _logits(6, 5000, dtype, device)
    t = torch.randint(0, 5000, (6,)).to(device)
    a = selected_logp(x, t, temperature=0.9)
    b, _ = selected_logp(x, t, temperature=0.9, return_entropy=True)
    assert torch.equal(a, b)


def test_scalar_and_per_row_temperature_agree(device):
    x = _logits(5, 3000, torch.bfloat16, device)
    t = torch.randint(0, 3000, (5,)).to(device)
    a = selected_logp(x, t, temperature=0.65)
    b = selected_logp(x, t, temperature=torch.full((5,), 0.65, device=device))
    c = selected_logp(x, t, temperature=torch.tensor(0.65, device=device))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_shifted_3d_slice_equals_contiguous_copy(device):
    """logits[:, :-1] of a [B, T, V] step is read in place and matches its contiguous copy bitwise."""
    full = _logits(2 * 6, 1500, torch.bfloat16, device).view(2, 6, 1500)
    tokens = torch.randint(0, 1500, (2, 6)).to(device)
    sliced = selected_logp(full[:, :-1], tokens[:, 1:])
    copied = selected_logp(full[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    flat = selected_logp(full[:, :-1].reshape(-1, 1500), tokens[:, 1:].reshape(-1))
    assert sliced.shape == (2, 5)
    assert torch.equal(sliced, copied) and torch.equal(sliced.reshape(-1), flat)


def test_4d_logits_match_flattened(device):
    x = _logits(2 * 3 * 4, 700, torch.float32, device).view(2, 3, 4, 700)
    t = torch.randint(0, 700, (2, 3, 4)).to(device)
    a = selected_logp(x, t)
    b = selected_logp(x.reshape(-1, 700), t.reshape(-1))
    assert a.shape == (2, 3, 4) and torch.equal(a.reshape(-1), b)


def test_indexed_gradient_is_zero_off_the_scored_rows(device):
    x = _logits(6, 900, torch.bfloat16, device).requires_grad_(True)
    t = torch.randint(0, 900, (6,)).to(device)
    rows = torch.tensor([4, 1], device=device)
    lp = selected_logp_indexed(x, t[rows], rows)
    lp.sum().backward()
    g = x.grad
    assert torch.count_nonzero(g[[0, 2, 3, 5]]) == 0
    x2 = x.detach().clone().requires_grad_(True)
    selected_logp(x2, t)[rows].sum().backward()
    assert torch.equal(g[rows], x2.grad[rows])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_selected_logp_batch_invariant_large_vocab(dtype, device):
    assert_batch_invariant(selected_logp_row_op(151936, dtype, device, "rows"), probe_rows=3, batch_sizes=(4, 9))


def test_strided_targets_and_1d_logits(device):
    x = _logits(6, 300, torch.float32, device)
    every_other = torch.randint(0, 300, (12,)).to(device)[::2]  # a strided 1-D view
    assert torch.equal(selected_logp(x, every_other), selected_logp(x, every_other.clone()))
    one_row = selected_logp(x[2], every_other[2])
    assert one_row.shape == () and torch.equal(one_row, selected_logp(x, every_other)[2])
