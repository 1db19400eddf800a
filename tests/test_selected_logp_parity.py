"""Parity of selected_logp with the float64 reference, judged by contracts/selected_logp.yaml."""
import itertools

import pytest
import torch

from rlk_triton.testing.parity import LogpCase, judge_selected_logp

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TEMPS = (1.0, 0.7, "rows")
LAYOUTS = ("contiguous", "row_stride", "slice3d")

# Full product on small and mid vocabularies; the large ones on a diagonal (the interpreter is slow).
CASES = [LogpCase(4, V, dt, T, 3.0, lay, seed=i)
         for i, (V, dt, T, lay) in enumerate(itertools.product((1, 3, 1000, 32000), DTYPES, TEMPS, LAYOUTS))]
CASES += [LogpCase(4, V, dt, T, 3.0, lay, seed=100 + i)
          for i, (V, (dt, T, lay)) in enumerate(itertools.product(
              (50257, 151936), zip(DTYPES, TEMPS, LAYOUTS)))]
# Scales from nearly uniform to peaked rows of size ~1e4.
CASES += [LogpCase(4, 1000, dt, T, scale, "contiguous", seed=200 + i)
          for i, (dt, scale, T) in enumerate(itertools.product(DTYPES, (0.01, 30.0, 1e4), (1.0, "rows")))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", "-"))
def test_selected_logp_within_contract(case, device):
    ratios = judge_selected_logp(case, device)
    assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: error / contract bound {ratios}"


@pytest.mark.gpu
@pytest.mark.parametrize("V", (1, 3, 1000, 32000, 50257, 151936, 262144))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T", TEMPS)
def test_selected_logp_within_contract_gpu(V, dtype, T):
    for layout in LAYOUTS:
        case = LogpCase(64, V, dtype, T, 3.0, layout, seed=V)
        ratios = judge_selected_logp(case, "cuda")
        assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


def _extreme_rows(V, dtype, device):
    x = torch.randn(4, V) * 3
    x[0] = float("-inf")
    x[0, V // 2] = 1.0  # all but one logit -inf
    x[1, ::2] = 1e4  # very large, positive and negative
    x[1, 1::2] = -1e4
    x[2] = 1e4  # all equal and large
    x[3, :-1] = float("-inf")  # the only finite logit is the last one
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", (2, 1000, 50257))
def test_extreme_rows_are_finite_and_within_contract(V, dtype, device):
    from rlk_triton import contracts
    from rlk_triton._runtime import arch_of
    from rlk_triton.logp import selected_logp
    from rlk_triton.reference import selected_logp_reference
    from rlk_triton.testing.parity import row_scale

    x = _extreme_rows(V, dtype, device)
    targets = torch.tensor([V // 2, 0, V - 1, V - 1], device=device)
    logp, ent = selected_logp(x, targets, return_entropy=True)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    ref_lp, ref_ent = selected_logp_reference(x.double().cpu().numpy(), targets.cpu().numpy())
    bound = contracts.judgment("selected_logp", dtype, "forward_accuracy", arch_of(x.device))["outputs"]
    scale = row_scale(x.double().cpu().numpy(), 1.0)
    assert contracts.scaled_abs_ratio(logp.cpu(), ref_lp, scale, bound["logp"]) <= 1.0
    assert contracts.scaled_abs_ratio(ent.cpu(), ref_ent, scale, bound["entropy"]) <= 1.0
    leaf = x.detach().requires_grad_(True)
    lp, en = selected_logp(leaf, targets, return_entropy=True)
    (lp.sum() + en.sum()).backward()
    assert torch.isfinite(leaf.grad.float()).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", (151936, 262144))
def test_large_vocab_sweep_on_the_interpreter(V, dtype, device):
    """The GPU sizes on the interpreter: minutes on a CPU, so behind --runslow."""
    for T, layout in (("rows", "contiguous"), (0.7, "slice3d"), (1.3, "row_stride")):
        case = LogpCase(16, V, dtype, T, 3.0, layout, seed=V + 7)
        ratios = judge_selected_logp(case, device)
        assert all(r <= 1.0 for r in ratios.values()), f"{case.label()}: {ratios}"


@pytest.mark.parametrize("which", ("logp only", "entropy only"))
def test_gradient_of_one_output_alone(which, device, monkeypatch):
    """Autograd hands the op None for the unused output (no zeros materialized): still exact, and an
    entropy returned but not differentiated leaves the kernel's entropy term off."""
    from rlk_triton import contracts
    from rlk_triton._runtime import arch_of
    from rlk_triton.logp import selected_logp
    from rlk_triton.ops import selected_logp as ops
    from rlk_triton.reference import selected_logp_grad_reference
    from rlk_triton.testing.parity import logp_grad_sensitivity, make_logits

    launched, launch = [], ops.launch_backward

    def spy(grad_logp, grad_entropy, *rest):
        launched.append(grad_entropy is None)
        return launch(grad_logp, grad_entropy, *rest)
    monkeypatch.setattr(ops, "launch_backward", spy)

    x = make_logits(3, 777, torch.bfloat16, 3.0, torch.Generator().manual_seed(5), device).requires_grad_(True)
    t = torch.randint(0, 777, (3,), generator=torch.Generator().manual_seed(6)).to(device)
    logp, ent = selected_logp(x, t, temperature=0.8, return_entropy=True)
    (logp.sum() if which == "logp only" else ent.sum()).backward()
    g = torch.ones(3) if which == "logp only" else torch.zeros(3)
    h = None if which == "logp only" else torch.ones(3)
    x64, t64 = x.detach().double().cpu().numpy(), t.cpu().numpy()
    ref = selected_logp_grad_reference(x64, t64, g.numpy(), None if h is None else h.numpy(), 0.8)
    sens = logp_grad_sensitivity(x64, t64, 0.8, g.numpy(), (h if h is not None else torch.zeros(3)).numpy(), ref)
    bound = contracts.judgment("selected_logp", torch.bfloat16, "gradient_accuracy", arch_of(x.device))
    assert contracts.rounding_plus_sensitivity_ratio(x.grad.double().cpu().numpy(), ref, sens, bound) <= 1.0
    assert launched == [which == "logp only"]
