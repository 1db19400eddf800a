"""GSPO (sequence-level clipped loss) against the float64 reference, judged by contracts/rl_losses.yaml.

Scales (what fp32 rounding grows with): the sequence ratio s_i = exp(mean of log-ratios) carries a
relative error of about eps * (1 + m_i), m_i = mean over the sequence's active tokens of
|logp| + |old_logp| (the subtraction and the mean), so
  gspo_sequence_loss: |A_i| * max(s_i, clip(s_i)) * (1 + m_i)
  gspo_loss:          the same, summed with the aggregation's weight
  gspo_ratio:         s_i * (1 + m_i) (for the mean, the mean of those; for min / max, their max)
  gradient sensitivity: |d| * (1 + m_i)
"""
import numpy as np
import pytest
import torch

from rlk_triton import contracts, errors
from rlk_triton._runtime import arch_of
from rlk_triton.losses import BACKENDS, gspo_loss
from rlk_triton.reference.losses import gspo_reference
from rlk_triton.testing import RowOp, assert_batch_invariant


def _inputs(B, T, seed, device, spread=1e-3, p_active=0.8):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4
    logp = old + spread * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.rand(B, T, generator=g) < p_active
    return [x.to(device) for x in (logp, old, adv, mask)]


def _scales(logp, old, adv, mask, eps_low, eps_high, normalizer):
    lp, od, a, m = (x.double().cpu().numpy() for x in (logp, old, adv, mask))
    m = m.astype(bool)
    n = m.sum(1)
    has = n > 0
    mag = np.where(m, np.abs(lp) + np.abs(od), 0.0).sum(1) / np.maximum(n, 1)
    s = np.exp(np.where(m, lp - od, 0.0).sum(1) / np.maximum(n, 1))
    cs = np.clip(s, 1 - eps_low, 1 + eps_high)
    seq = np.where(has, np.abs(a) * np.maximum(s, cs) * (1 + mag), 0.0)
    denom = normalizer if normalizer is not None else has.sum()
    w = 1.0 / denom if denom else 0.0
    ratio = np.where(has, s * (1 + mag), 0.0)
    return {"seq": seq, "loss": seq.sum() * w, "ratio_mean": ratio.sum() / max(has.sum(), 1),
            "ratio_ext": ratio.max(initial=0.0), "grad": (1 + mag)[:, None]}


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def _judge(logp, old, adv, mask, device, eps_low=3e-4, eps_high=4e-4, normalizer=None, backend="triton"):
    leaf = logp.detach().clone().requires_grad_(True)
    loss, seq, diag = gspo_loss(leaf, old, adv, mask=mask, eps_low=eps_low, eps_high=eps_high, normalizer=normalizer,
                                backend=backend)
    loss.backward()
    rl, rseq, rdiag, rgrad, _ = gspo_reference(logp.cpu(), old.cpu(), adv.cpu(), mask.cpu(), eps_low, eps_high,
                                               normalizer)
    arch = arch_of(torch.device(device))
    out = contracts.judgment("rl_losses", torch.float32, "forward_accuracy", arch)["outputs"]
    sc = _scales(logp, old, adv, mask, eps_low, eps_high, normalizer)
    ratios = {
        "loss": contracts.scaled_abs_ratio([float(loss.detach())], [rl], [sc["loss"]], out["gspo_loss"]),
        "seq": contracts.scaled_abs_ratio(seq.detach().cpu(), rseq, sc["seq"], out["gspo_sequence_loss"]),
        "clipfrac": contracts.scaled_abs_ratio([float(diag["clipfrac"])], [rdiag["clipfrac"]], [1.0], out["clipfrac"]),
        "ratio_mean": contracts.scaled_abs_ratio([float(diag["ratio_mean"])], [rdiag["ratio_mean"]],
                                                 [sc["ratio_mean"]], out["gspo_ratio"]),
    }
    for k in ("ratio_min", "ratio_max"):
        ratios[k] = contracts.scaled_abs_ratio([float(diag[k])], [rdiag[k]], [sc["ratio_ext"]], out["gspo_ratio"])
    bound = contracts.judgment("rl_losses", torch.float32, "gradient_accuracy", arch)
    ratios["grad"] = contracts.rounding_plus_sensitivity_ratio(leaf.grad.cpu(), rgrad, np.abs(rgrad) * sc["grad"], bound)
    return ratios, loss, seq, diag, leaf.grad


@pytest.mark.parametrize("B,T", ((1, 1), (4, 7), (3, 300), (5, 700)))
@pytest.mark.parametrize("spread", (1e-4, 1e-2, 1.0))
@pytest.mark.parametrize("normalizer", (None, 8.0))
def test_gspo_within_contract(B, T, spread, normalizer, device, backend):
    logp, old, adv, mask = _inputs(B, T, B * T, device, spread)
    if B > 2:
        mask[1] = False  # an empty sequence
    ratios, loss, seq, diag, grad = _judge(logp, old, adv, mask, device, normalizer=normalizer, backend=backend)
    assert all(r <= 1.0 for r in ratios.values()), ratios
    assert torch.isfinite(grad).all() and not grad[~mask].any()


def test_fully_masked_batch_gives_zero(device, backend):
    logp, old, adv, mask = _inputs(3, 9, 1, device)
    logp = logp.requires_grad_(True)
    loss, seq, diag = gspo_loss(logp, old, adv, mask=torch.zeros_like(mask), backend=backend)
    loss.backward()
    assert float(loss.detach()) == 0.0 and not seq.any() and all(float(v) == 0.0 for v in diag.values())
    assert not logp.grad.any()


def test_gspo_rows_are_batch_invariant(device, backend):
    T = 300

    def make_rows(n, g):
        old = -torch.rand(n, T, generator=g) * 4
        logp = old + 1e-2 * torch.randn(n, T, generator=g)
        return logp.to(device), old.to(device), torch.randn(n, generator=g).to(device), \
            (torch.rand(n, T, generator=g) < 0.8).to(device)

    def forward(logp, old, adv, mask):  # a fixed normalizer: each sequence's term and gradient are its own
        _, seq, _ = gspo_loss(logp, old, adv, mask=mask, eps_low=0.2, eps_high=0.2, normalizer=10.0, backend=backend)
        return (seq,)

    assert_batch_invariant(RowOp(f"gspo.{backend}", forward, make_rows, grad_inputs=(0,)), probe_rows=2, batch_sizes=(3, 6))


def test_typed_errors(device):
    logp, old, adv, mask = _inputs(2, 5, 0, device)
    for kwargs, err, arg in (
        (dict(advantages=adv[:1]), errors.ShapeError, "advantages"),
        (dict(advantages=adv.double()), errors.DTypeError, "advantages"),
        (dict(eps_low=2.0), errors.InputError, "eps_low"),
        (dict(normalizer=0.0), errors.InputError, "normalizer"),
    ):
        call = dict(advantages=adv, mask=mask)
        call.update(kwargs)
        a = call.pop("advantages")
        with pytest.raises(err) as e:
            gspo_loss(logp, old, a, **call)
        assert e.value.argument == arg


@pytest.mark.gpu
def test_gspo_at_scale_gpu():
    logp, old, adv, mask = _inputs(64, 8192, 5, "cuda", 1e-2)
    ratios, *_ = _judge(logp, old, adv, mask, "cuda", eps_low=0.2, eps_high=0.28)
    assert all(r <= 1.0 for r in ratios.values()), ratios
