"""Bad input gets a typed error that names the argument; empty input gives empty output."""
import math

import pytest
import torch

from rlk_triton import _runtime, errors
from rlk_triton.logp import selected_logp, selected_logp_indexed


def _x(device, n=3, V=50, dtype=torch.float32):
    return torch.randn(n, V, dtype=dtype, device=device)


def _t(device, n=3, V=50):
    return torch.randint(0, V, (n,), device=device)


@pytest.mark.parametrize("dtype", (torch.float64, torch.int32, torch.float8_e4m3fn))
def test_unsupported_logits_dtype(dtype, device):
    x = torch.zeros(3, 50, device=device).to(dtype)
    with pytest.raises(errors.DTypeError) as e:
        selected_logp(x, _t(device))
    assert e.value.argument == "logits"


def test_non_tensor_logits(device):
    with pytest.raises(errors.DTypeError, match="logits"):
        selected_logp([[0.0, 1.0]], _t(device, 1, 2))


def test_shape_mismatch(device):
    with pytest.raises(errors.ShapeError) as e:
        selected_logp(_x(device), _t(device, 4))
    assert e.value.argument == "target_ids"


def test_target_dtype(device):
    with pytest.raises(errors.DTypeError) as e:
        selected_logp(_x(device), _t(device).float())
    assert e.value.argument == "target_ids"


def test_non_contiguous_vocab_dim_raises(device):
    x = torch.randn(50, 3, device=device).t()
    with pytest.raises(errors.LayoutError) as e:
        selected_logp(x, _t(device))
    assert e.value.argument == "logits"


@pytest.mark.parametrize("bad", (50, -1, -101, 10**6))
def test_target_out_of_range(bad, device):
    t = _t(device)
    t[1] = bad
    with pytest.raises(errors.TargetIndexError) as e:
        selected_logp(_x(device), t)
    assert e.value.argument == "target_ids" and str(bad) in str(e.value)


def test_out_of_range_without_validation_is_nan_not_garbage(device):
    t = _t(device)
    t[1] = 50
    out = selected_logp(_x(device), t, validate=False)
    assert math.isnan(out[1].item()) and torch.isfinite(out[[0, 2]]).all()


def test_ignore_index_gives_zero_logp_and_zero_logp_gradient(device):
    x = _x(device).requires_grad_(True)
    t = _t(device)
    t[0] = -100
    logp, ent = selected_logp(x, t, return_entropy=True)
    assert logp[0].item() == 0.0 and ent[0].item() > 0
    logp.sum().backward()
    assert torch.count_nonzero(x.grad[0]) == 0 and torch.count_nonzero(x.grad[1]) > 0
    t[0] = 7
    with pytest.raises(errors.TargetIndexError):
        selected_logp(_x(device), torch.full((3,), -1, device=device), ignore_index=-100)
    assert selected_logp(_x(device), torch.full((3,), -1, device=device), ignore_index=-1).eq(0).all()


@pytest.mark.parametrize("T", (0.0, -1.0, float("nan"), float("inf"), "hot", True))
def test_bad_scalar_temperature(T, device):
    with pytest.raises(errors.TemperatureError) as e:
        selected_logp(_x(device), _t(device), temperature=T)
    assert e.value.argument == "temperature"


def test_bad_tensor_temperature(device):
    bad = torch.tensor([1.0, 0.0, 1.0], device=device)
    with pytest.raises(errors.TemperatureError):
        selected_logp(_x(device), _t(device), temperature=bad)
    with pytest.raises(errors.ShapeError) as e:
        selected_logp(_x(device), _t(device), temperature=torch.ones(4, device=device))
    assert e.value.argument == "temperature"
    with pytest.raises(errors.DTypeError):
        selected_logp(_x(device), _t(device), temperature=torch.ones(3, dtype=torch.int64, device=device))


def test_row_indices_checked(device):
    x, t = _x(device, 5), _t(device, 2)
    for rows, err in ((torch.tensor([0, 5]), errors.ShapeError), (torch.tensor([1, 1]), errors.ShapeError),
                      (torch.tensor([0.0, 1.0]), errors.DTypeError), (torch.tensor([[0, 1]]), errors.ShapeError)):
        with pytest.raises(err) as e:
            selected_logp_indexed(x, t, rows.to(device))
        assert e.value.argument == "row_indices"


def test_empty_inputs_give_empty_outputs(device):
    out, ent = selected_logp(torch.empty(0, 50, device=device), torch.empty(0, dtype=torch.long, device=device),
                             return_entropy=True)
    assert out.shape == (0,) and ent.shape == (0,) and out.dtype == torch.float32
    out = selected_logp(torch.empty(2, 0, 50, device=device), torch.empty(2, 0, dtype=torch.long, device=device))
    assert out.shape == (2, 0)
    x = torch.empty(0, 50, device=device, requires_grad=True)
    selected_logp(x, torch.empty(0, dtype=torch.long, device=device)).sum().backward()
    assert x.grad.shape == (0, 50)
    with pytest.raises(errors.ShapeError):
        selected_logp(torch.empty(3, 0, device=device), _t(device))


def test_cpu_tensors_without_interpreter_raise(monkeypatch):
    import rlk_triton.logp as logp_mod

    monkeypatch.setattr(logp_mod, "_INTERPRETED", False)
    with pytest.raises(errors.DeviceError, match="TRITON_INTERPRET"):
        selected_logp(torch.randn(2, 5), torch.zeros(2, dtype=torch.long))


def test_errors_are_value_errors_with_the_argument_name():
    e = errors.TargetIndexError("target_ids", "bad")
    assert isinstance(e, ValueError) and isinstance(e, IndexError) and str(e).startswith("target_ids:")


@pytest.mark.parametrize("n", (1, 7, _runtime.HOST_CHECK_MAX_IDS, _runtime.HOST_CHECK_MAX_IDS + 1, 1000))
def test_first_id_outside_finds_the_first_bad_id_on_both_paths(n):
    """The range check of ids (targets, token ids, positions, group ids): the host copy up to
    HOST_CHECK_MAX_IDS ids and the device ops above it answer alike: the first flat position outside
    [lo, hi) that is not the allowed id, with its value, or None."""
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 50, (n,), generator=g)
    assert _runtime.first_id_outside(ids, 0, 50) is None
    assert _runtime.first_id_outside(ids[:0], 0, 50) is None
    ids[n // 2] = -100  # the allowed id (an ignore_index) below lo
    assert _runtime.first_id_outside(ids, 0, 50, allowed=-100) is None
    assert _runtime.first_id_outside(ids, 0, 50) == (n // 2, -100)
    ids[n - 1] = 50
    want = (n // 2, -100) if n > 1 else (0, 50)
    assert _runtime.first_id_outside(ids, 0, 50) == want
    assert _runtime.first_id_outside(ids, 0, 50, allowed=-100) == ((n - 1, 50) if n > 1 else (0, 50))
    assert _runtime.first_id_outside(ids.to(torch.int32), 0, 50, allowed=-100) == \
        _runtime.first_id_outside(ids, 0, 50, allowed=-100)
