"""The dlogp audit: metrics against NumPy float64, exact merges, contract judgments, typed errors,
the sync-free accumulator, non-finite inputs, and the frameworks' metric names."""
import contextlib
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlk_triton import audit, contracts, errors
from rlk_triton.testing.parity import make_logits, row_scale

EPS = float(np.finfo(np.float64).eps)
OP = "selected_logp"


def _batch(B=6, T=50, seed=0, active=0.7):
    """float32 logp of both sides: dlogp from below an ulp (exact zeros) up to clipped sizes."""
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.empty(B, T).exponential_(generator=g)
    size = 10.0 ** (torch.rand(B, T, generator=g) * 9 - 9)
    train = rollout + torch.randn(B, T, generator=g) * size
    same = torch.rand(B, T, generator=g) < 0.1
    train[same] = rollout[same]
    mask = torch.rand(B, T, generator=g) < active
    return train.float(), rollout.float(), mask


def _assert_mean(ours, terms, extra=()):
    """ours is the float64 mean of terms up to two summation orders (Higham's gamma_n bound) and the
    last-ulp differences of the libm functions that made the terms (bounded through `extra`)."""
    terms = np.asarray(terms, np.float64)
    n = terms.size
    u = EPS / 2
    gamma = (n + 2) * u / (1 - (n + 2) * u)
    ref = terms.sum() / n
    bound = 2 * gamma * (np.abs(terms).sum() + np.abs(np.asarray(extra, np.float64)).sum()) / n + EPS * abs(ref)
    assert abs(ours - ref) <= bound, (ours, ref, bound)


def _numpy_metrics(train, rollout, mask, eps_low, eps_high):
    t, r, m = (x.double().numpy() for x in (train, rollout, mask))
    m = m.astype(bool)
    d = np.where(t == r, 0.0, t - r)
    key = np.where(m, np.abs(d), -1.0)
    w = int(np.argmax(key.ravel()))
    b, p = np.unravel_index(w, d.shape) if d.ndim == 2 else (0, w)
    dv = d[m]
    ratio = np.exp(dv)
    return {"d": dv, "active": int(m.sum()), "exact": int((dv == 0).sum()), "abs_max": float(np.abs(dv).max()),
            "worst": (int(b), int(p), float(t.reshape(-1)[w]), float(r.reshape(-1)[w])),
            "quantiles": np.quantile(np.abs(dv), audit.QUANTILES, method="linear"),
            "clipped": int(((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).sum()), "ratio": ratio}


def test_metrics_match_numpy_float64():
    train, rollout, mask = _batch()
    rep = audit.compare_logp(train, rollout, mask, dtype=torch.float32, clip_range=(0.2, 0.28), expect_bitwise=True)
    ref = _numpy_metrics(train, rollout, mask, 0.2, 0.28)
    d = ref["d"]
    assert (rep.samples, rep.tokens, rep.active, rep.nonfinite) == (6, 300, ref["active"], 0)
    assert rep.coverage == ref["active"] / 300 and rep.exact == ref["exact"] and 0 < rep.exact < rep.active
    assert rep.abs_max == ref["abs_max"]
    w = rep.worst
    assert (w.sample, w.position, w.train, w.rollout) == ref["worst"]
    assert rep.percentiles_exact and list(rep.percentiles.values()) == list(ref["quantiles"])
    assert 0 < rep.clipped == ref["clipped"] and rep.clipfrac0 == ref["clipped"] / ref["active"]
    _assert_mean(rep.abs_mean, np.abs(d))
    _assert_mean(rep.dlogp_mean, d)
    _assert_mean(rep.ratio0, ref["ratio"], extra=ref["ratio"])
    _assert_mean(rep.approx_kl0, np.expm1(d) - d, extra=np.abs(np.expm1(d)) + np.abs(d))
    assert rep.abs_mean == rep.sum_abs / rep.finite and rep.ratio0 == rep.sum_ratio / rep.finite
    assert sum(rep.histogram) == rep.active and rep.histogram[0] == rep.exact
    assert rep.status == audit.FAIL and rep.passed is False

    t, r, m = (x.double().numpy() for x in (train, rollout, mask))
    for i, s in enumerate(rep.per_sample):
        di = np.where(t[i] == r[i], 0.0, t[i] - r[i])[m[i].astype(bool)]
        assert (s.active, s.nonfinite, s.abs_max) == (di.size, 0, float(np.abs(di).max()))
        _assert_mean(s.abs_mean, np.abs(di))
        _assert_mean(s.ratio0, np.exp(di), extra=np.exp(di))
        _assert_mean(s.approx_kl0, np.expm1(di) - di, extra=np.abs(np.expm1(di)) + np.abs(di))
        ri = np.exp(di)
        assert s.clipfrac0 == int(((ri < 0.8) | (ri > 1.28)).sum()) / di.size
    json.dumps(rep.to_dict(histogram=True), allow_nan=False)


def test_flat_input_is_one_sample():
    train, rollout, mask = _batch(B=3, T=40, seed=1)
    two_d = audit.compare_logp(train, rollout, mask, dtype="float32", expect_bitwise=True)
    flat = audit.compare_logp(train.flatten(), rollout.flatten(), mask.flatten(), dtype="float32", expect_bitwise=True)
    assert flat.samples == 1 and len(flat.per_sample) == 1 and flat.per_sample[0].active == two_d.active
    assert (flat.active, flat.exact, flat.abs_max, flat.histogram) == (two_d.active, two_d.exact, two_d.abs_max,
                                                                      two_d.histogram)
    assert flat.percentiles == two_d.percentiles
    assert (flat.worst.sample, flat.worst.position) == (0, two_d.worst.sample * 40 + two_d.worst.position)


def _bitwise(train, rollout, mask=None, **kw):
    return audit.compare_logp(train, rollout, mask, dtype="float32", expect_bitwise=True, **kw)


@pytest.mark.parametrize("shape", ((4, 9), (0, 7), (3, 0), (0,)))
def test_no_active_token_is_not_applicable(shape):
    train, rollout, _ = _batch(seed=2)
    t, r = (x.flatten()[:math.prod(shape)].view(shape) for x in (train, rollout))
    rep = _bitwise(t, r, torch.zeros(t.shape, dtype=torch.bool))
    assert rep.status == audit.NOT_APPLICABLE and rep.passed is None and rep.active == 0
    out = rep.to_dict(histogram=True)
    text = json.dumps(out, allow_nan=False)
    assert "NaN" not in text and "nan" not in text
    for k in ("abs_mean", "abs_max", "abs_p50", "abs_p90", "abs_p99", "ratio0", "clipfrac0", "approx_kl0",
              "dlogp_mean", "worst_token"):
        assert out[k] is None, k
    assert all(v is None for s in out["per_sample"] for k, v in s.items() if k not in ("active", "nonfinite"))
    assert "no active tokens" in rep.summary()


def test_not_applicable_is_left_out_of_merged_pass_fail():
    train, rollout, mask = _batch(seed=3)
    na = _bitwise(train, rollout, torch.zeros_like(mask))
    good = _bitwise(train, train.clone(), mask)
    bad = _bitwise(train, rollout, mask)
    assert good.status == audit.PASS and bad.status == audit.FAIL
    assert audit.LogpAuditReport.merge(na, good, na).status == audit.PASS
    assert audit.merge_reports([good, na, bad]).status == audit.FAIL
    merged = audit.LogpAuditReport.merge(na, na)
    assert merged.status == audit.NOT_APPLICABLE and merged.report_counts == {"pass": 0, "fail": 0, "not_applicable": 2}
    assert audit.merge_reports([good, na, bad]).report_counts == {"pass": 1, "fail": 1, "not_applicable": 1}
    json.dumps(merged.to_dict(), allow_nan=False)


def test_merged_micro_batches_equal_one_report_of_the_whole_batch():
    train, rollout, mask = _batch(B=8, T=40, seed=4)
    train[6, 17] = rollout[6, 17] - 3.0  # the worst token sits in the last micro-batch
    mask[6, 17] = True
    ids = torch.arange(8 * 40).view(8, 40)
    cuts = ((0, 3), (3, 4), (4, 8))
    parts = []
    for a, b in cuts:
        m = mask[a:b] if (a, b) != (3, 4) else torch.zeros_like(mask[a:b])  # one micro-batch all padding
        parts.append(_bitwise(train[a:b], rollout[a:b], m, metadata={"token_id": ids[a:b], "step": 7}))
    whole = _bitwise(train, rollout, torch.cat([mask[:3], torch.zeros_like(mask[3:4]), mask[4:]]),
                     metadata={"token_id": ids, "step": 7})
    merged = audit.LogpAuditReport.merge(*parts)
    for k in ("samples", "tokens", "active", "exact", "clipped", "nonfinite", "abs_max", "worst", "histogram"):
        assert getattr(merged, k) == getattr(whole, k), k
    assert merged.worst.sample == 6 and merged.worst.metadata == {"token_id": 6 * 40 + 17, "step": 7}
    assert [(s.active, s.abs_max) for s in merged.per_sample] == [(s.active, s.abs_max) for s in whole.per_sample]
    t, r, m = (x.double().numpy() for x in (train, rollout, mask))
    m[3] = False
    d = np.where(t == r, 0.0, t - r)[m.astype(bool)]
    for rep in (merged, whole):
        _assert_mean(rep.abs_mean, np.abs(d))
        _assert_mean(rep.dlogp_mean, d)
        _assert_mean(rep.ratio0, np.exp(d), extra=np.exp(d))
        _assert_mean(rep.approx_kl0, np.expm1(d) - d, extra=np.abs(np.expm1(d)) + np.abs(d))
    assert merged.clipfrac0 == whole.clipfrac0
    assert not merged.percentiles_exact and whole.percentiles_exact
    f = audit.PERCENTILE_MERGE_FACTOR
    for q, exact in whole.percentiles.items():
        assert exact / f <= merged.percentiles[q] <= exact * f, q
    # One batch with values (the rest not applicable) keeps its exact percentiles.
    kept = audit.LogpAuditReport.merge(parts[1], parts[0])
    assert kept.percentiles_exact and kept.percentiles == parts[0].percentiles
    assert kept.worst.sample == parts[0].worst.sample + 1


@pytest.mark.parametrize("seed", range(4))
def test_merged_percentiles_within_the_bin_bound_over_many_decades(seed):
    g = torch.Generator().manual_seed(seed)
    n = 4000
    size = 10.0 ** (torch.rand(n, generator=g, dtype=torch.float64) * 14 - 11.5)  # inside [1e-12, 1e3)
    size[torch.rand(n, generator=g) < 0.2] = 0.0
    rollout = -torch.rand(n, generator=g, dtype=torch.float64)
    train = rollout - size * torch.sign(torch.randn(n, generator=g, dtype=torch.float64))
    exact = np.quantile(np.abs((train - rollout).numpy()), audit.QUANTILES)
    cuts = torch.tensor_split(torch.arange(n), 5)
    merged = audit.merge_reports(_bitwise(train[c], rollout[c]) for c in cuts)
    f = audit.PERCENTILE_MERGE_FACTOR
    for q, e in zip(audit.QUANTILES, exact):
        assert e / f <= merged.percentiles[q] <= e * f, (q, e, merged.percentiles[q])


def _rank_worker(rank, world, init_method, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        train, rollout, mask = _batch(B=3 + rank, T=20, seed=10 + rank)
        merged = audit.merge_across_ranks(_bitwise(train, rollout, mask))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(merged.to_dict(histogram=True), allow_nan=False))
    finally:
        dist.destroy_process_group()


def test_merge_across_ranks_gloo(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_worker, args=(2, f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert got[0] == got[1]
    local = [_bitwise(*_batch(B=3 + r, T=20, seed=10 + r)) for r in range(2)]
    expect = audit.LogpAuditReport.merge(*local)
    assert got[0] == json.loads(json.dumps(expect.to_dict(histogram=True)))
    assert got[0]["samples"] == 7 and got[0]["reports"]["fail"] == 2
    assert audit.merge_across_ranks(local[0]).to_dict() == local[0].to_dict()  # no process group: a world of one


def test_bitwise_judgment_passes_equal_and_fails_one_ulp():
    train, _, mask = _batch(seed=5)
    train[0, 0], mask[0, 0] = -math.inf, True  # equal infinities are no difference
    rep = _bitwise(train, train.clone(), mask)
    assert rep.status == audit.PASS and rep.exact == rep.active and rep.abs_max == 0.0 and rep.worst_ratio is None
    assert rep.nonfinite == 0 and rep.nonfinite_inputs == 1 and rep.first_nonfinite_input.position == 0
    assert rep.judgment == "forward_invariance" and rep.kind == "bitwise" and rep.bound is None
    assert rep.contract_id == contracts.contract_id(OP, torch.float32)
    off = train.clone()
    mask[2, 3] = True
    off[2, 3] = torch.nextafter(train[2, 3], torch.tensor(0.0))
    rep = _bitwise(train, off, mask)
    assert rep.status == audit.FAIL and rep.exact == rep.active - 1
    assert (rep.worst.sample, rep.worst.position) == (2, 3) and rep.abs_max == abs(float(off[2, 3]) - float(train[2, 3]))


@pytest.mark.parametrize("dtype", (torch.bfloat16, "float16", torch.float32))
def test_accuracy_judgment_passes_at_the_contract_bound_and_fails_past_it(dtype):
    bound = contracts.judgment(OP, dtype, "forward_accuracy")["outputs"]["logp"]
    scale = torch.linspace(2.0, 30.0, 4, dtype=torch.float64)[:, None]  # per row
    allowed = (2.0 * (bound["atol"] + bound["rtol"] * scale)).expand(4, 6)
    rollout = torch.zeros(4, 6, dtype=torch.float64)

    def judge(train, rs=scale):
        return audit.compare_logp(train, rollout, dtype=dtype, row_scale=rs)

    at = judge(-allowed.clone())
    assert at.status == audit.PASS and at.worst_ratio == 1.0 and at.judgment == "forward_accuracy"
    assert at.bound == {"atol": bound["atol"], "rtol": bound["rtol"]}
    assert judge(-allowed / 2).worst_ratio == 0.5
    past = -allowed.clone()
    past[1, 4] = torch.nextafter(past[1, 4], torch.tensor(-math.inf, dtype=torch.float64))
    rep = judge(past)
    assert rep.status == audit.FAIL and rep.worst_ratio > 1.0
    flat = judge(-allowed[2].clone().expand(4, 6).contiguous(), rs=float(scale[2]))  # a float row_scale
    assert flat.status == audit.PASS and flat.worst_ratio == 1.0


def test_arch_override_names_its_contract():
    train, rollout, mask = _batch(seed=6)
    for arch in (None, "interpreter"):
        rep = audit.compare_logp(train, rollout, mask, dtype=torch.bfloat16, row_scale=20.0, arch=arch)
        assert rep.contract_id == contracts.contract_id(OP, torch.bfloat16, arch) and rep.arch == arch
    assert contracts.contract_id(OP, torch.bfloat16, "interpreter") != contracts.contract_id(OP, torch.bfloat16)


def test_missing_contract_rows_fail_closed():
    train, rollout, mask = _batch(seed=7)
    for kw in ({"expect_bitwise": True}, {"row_scale": 1.0}):
        with pytest.raises(errors.ContractError):
            audit.compare_logp(train, rollout, mask, dtype=torch.float64, **kw)
        with pytest.raises(errors.ContractError):
            audit.compare_logp(train, rollout, mask, op="no_such_op", dtype=torch.float32, **kw)
    with pytest.raises(errors.InputError) as e:
        audit.compare_logp(train, rollout, mask, dtype=torch.bfloat16)
    assert e.value.argument == "row_scale"


def test_merging_different_laws_raises():
    train, rollout, mask = _batch(seed=8)
    base = _bitwise(train, rollout, mask)
    others = (
        audit.compare_logp(train, rollout, mask, dtype="float32", row_scale=5.0),
        audit.compare_logp(train, rollout, mask, dtype="bfloat16", expect_bitwise=True),
        _bitwise(train, rollout, mask, clip_range=0.3),
        audit.compare_logp(train, rollout, mask, dtype="bfloat16", expect_bitwise=True, arch="interpreter"),
    )
    for other in others:
        with pytest.raises(audit.ReportMismatchError) as e:
            audit.LogpAuditReport.merge(base, other)
        assert isinstance(e.value, errors.InputError) and e.value.argument == "reports"
    with pytest.raises(errors.InputError):
        audit.merge_reports([])


def test_nonfinite_tokens_fail_and_stay_out_of_the_metrics():
    train, rollout, mask = _batch(seed=9)
    mask[:] = True
    rollout[0, 5] = float("nan")
    train[1, 2] = -math.inf
    train[3, 3] = float("nan")
    mask[3, 3] = False  # inactive: ignored
    for kw in ({"expect_bitwise": True}, {"row_scale": 1e9}):
        rep = audit.compare_logp(train, rollout, mask, dtype="float32", **kw)
        assert rep.status == audit.FAIL and rep.nonfinite == 2 and rep.finite == rep.active - 2
        assert rep.nonfinite_inputs == 2 and repr(rep.first_nonfinite_input) == repr(rep.first_nonfinite)
        assert (rep.first_nonfinite.sample, rep.first_nonfinite.position) == (0, 5)
        assert math.isfinite(rep.abs_mean) and math.isfinite(rep.abs_max) and sum(rep.histogram) == rep.finite
        assert rep.per_sample[0].nonfinite == 1 and rep.per_sample[1].nonfinite == 1
        text = json.dumps(rep.to_dict(), allow_nan=False)
        assert '"rollout": "nan"' in text
    assert rep.worst_ratio <= 1.0  # the finite tokens are within the loose bound: the NaN alone fails it


def test_metadata_is_read_at_the_worst_token_or_copied():
    train, rollout, mask = _batch(B=2, T=5, seed=11)
    train[1, 3], mask[1, 3] = rollout[1, 3] + 2.0, True
    meta = {"token_id": torch.arange(10).view(2, 5), "sample_id": torch.tensor([40, 41]), "step": 3,
            "tag": "rank0"}
    rep = _bitwise(train, rollout, mask, metadata=meta)
    assert rep.worst.metadata == {"token_id": 8, "sample_id": [40, 41], "step": 3, "tag": "rank0"}
    assert json.loads(json.dumps(rep.to_dict(), allow_nan=False))["worst_token"]["metadata"]["token_id"] == 8


@pytest.mark.parametrize("case, error, argument", [
    (lambda t, r, m: (t, r[:, :-1], m), errors.ShapeError, "rollout_logp"),
    (lambda t, r, m: (t[None], r[None], m[None]), errors.ShapeError, "train_logp"),
    (lambda t, r, m: (t.long(), r, m), errors.DTypeError, "train_logp"),
    (lambda t, r, m: (t, r.tolist(), m), errors.DTypeError, "rollout_logp"),
    (lambda t, r, m: (t, r.to("meta"), m), errors.DeviceError, "rollout_logp"),
    (lambda t, r, m: (t, r, m[:, :-1]), errors.ShapeError, "mask"),
    (lambda t, r, m: (t, r, m.float() * 0.5), errors.InputError, "mask"),
    (lambda t, r, m: (t, r, m.to(torch.complex64)), errors.DTypeError, "mask"),
    (lambda t, r, m: (t, r, m.to("meta")), errors.DeviceError, "mask"),
])
def test_bad_inputs_raise_typed_errors(case, error, argument):
    with pytest.raises(error) as e:
        _bitwise(*case(*_batch(B=2, T=4)))
    assert e.value.argument == argument


def test_int_and_float_masks_are_masks():
    train, rollout, mask = _batch(seed=12)
    ref = _bitwise(train, rollout, mask)
    for m in (mask.long(), mask.float()):
        assert _bitwise(train, rollout, m).to_dict() == ref.to_dict()


@pytest.mark.parametrize("clip_range", (-0.1, 1.0, (0.2,), (0.2, 0.2, 0.2), "0.2", True, math.nan, (0.2, math.inf)))
def test_bad_clip_range(clip_range):
    with pytest.raises(errors.InputError) as e:
        _bitwise(*_batch(B=2, T=4), clip_range=clip_range)
    assert e.value.argument == "clip_range"


@pytest.mark.parametrize("rs, error", [
    (-1.0, errors.InputError), (math.nan, errors.InputError), ("1", errors.InputError),
    (torch.ones(3, 1), errors.ShapeError), (torch.ones(2, 1, dtype=torch.long), errors.DTypeError),
    (torch.ones(2, 1, device="meta"), errors.DeviceError),
])
def test_bad_row_scale(rs, error):
    with pytest.raises(error) as e:
        audit.compare_logp(*_batch(B=2, T=4), dtype="float32", row_scale=rs)
    assert e.value.argument == "row_scale"


def test_bad_metadata():
    with pytest.raises(errors.InputError) as e:
        _bitwise(*_batch(B=2, T=4), metadata=[1])
    assert e.value.argument == "metadata"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_logp_row_scale_is_the_parity_row_scale(dtype):
    g = torch.Generator().manual_seed(13)
    x = make_logits(2 * 7, 301, dtype, 9.0, g, "cpu").view(2, 7, 301)
    x[0, 2, 5] = -math.inf
    x[1, 1, :] = -math.inf
    x[1, 1, 3] = 2.0
    buf = torch.zeros(2, 8, 301, dtype=dtype)
    buf[:, :-1] = x
    temps = 0.5 + torch.rand(2, 7, generator=g)
    ours = audit.logp_row_scale(buf[:, :-1], temps, chunk_rows=3)  # strided, in chunks
    ref = row_scale(x.reshape(14, 301).double().numpy(), temps.reshape(-1).double().numpy()).reshape(2, 7)
    assert ours.dtype == torch.float64 and np.array_equal(ours.numpy(), ref)
    assert np.array_equal(audit.logp_row_scale(x, 0.7).numpy(), row_scale(x.reshape(14, 301).double().numpy(),
                                                                            0.7).reshape(2, 7))
    with pytest.raises(errors.TemperatureError):
        audit.logp_row_scale(x, 0.0)


# ---- the accumulator: add() per micro-batch, no host sync until report() ----

_SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
_SHAPE_SYNCS = ("nonzero", "bincount", "masked_select", "unique", "argwhere")


@contextlib.contextmanager
def _no_host_sync(monkeypatch):
    """Tensor methods that move a value to the host (or build a data-dependent shape) raise inside."""
    def trap(name):
        def raiser(*args, **kwargs):
            raise AssertionError(f"{name} called in add()")
        return raiser

    getitem = torch.Tensor.__getitem__

    def checked_getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(torch.is_tensor(i) and i.dtype == torch.bool for i in parts):
            raise AssertionError("boolean-mask indexing in add()")
        return getitem(self, index)

    with monkeypatch.context() as m:
        for name in _SYNCS + _SHAPE_SYNCS:
            m.setattr(torch.Tensor, name, trap(f"Tensor.{name}"))
        for name in _SHAPE_SYNCS:
            m.setattr(torch, name, trap(f"torch.{name}"))
        m.setattr(torch.Tensor, "__getitem__", checked_getitem)
        with pytest.raises(AssertionError):  # the traps are armed
            bool(torch.ones(()))
        yield


def _micro_batches(seed=20, B=8, T=30):
    """Cuts of one batch along the sample dim: a worst token and non-finite tokens in later cuts, one
    cut all padding, an int mask, logp-shaped and other metadata, a per-token row_scale."""
    train, rollout, mask = _batch(B=B, T=T, seed=seed)
    train[5, 7], mask[5, 7] = rollout[5, 7] - 2.5, True
    rollout[6, 2], mask[6, 2] = float("nan"), True
    train[7, 4], rollout[7, 4], mask[7, 4] = -math.inf, -math.inf, True  # dlogp 0, a non-finite input
    mask[2:3] = False
    scale = 1.0 + torch.rand(B, T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 20
    ids = torch.arange(B * T).view(B, T)
    cuts = ((0, 2), (2, 3), (3, 6), (6, 8))
    return [(train[a:b], rollout[a:b], mask[a:b].long() if a else mask[a:b], scale[a:b],
             {"token_id": ids[a:b], "sample_id": ids[a:b, 0], "flag": ids[a:b] % 2 == 0,
              "weight": ids[a:b].double() / 7, "step": 3}) for a, b in cuts]


@pytest.mark.parametrize("bitwise", (True, False))
def test_accumulator_report_is_the_merge_of_its_micro_batches(bitwise, monkeypatch):
    law = {"dtype": "float32", "clip_range": (0.2, 0.28), "expect_bitwise": bitwise}
    parts = _micro_batches()
    acc = audit.LogpAudit(**law)
    with _no_host_sync(monkeypatch):
        for t, r, m, s, meta in parts:
            acc.add(t, r, m, row_scale=None if bitwise else s, metadata=meta)
    assert acc.adds == 4 and acc.device == torch.device("cpu")
    got = acc.report()
    per_mb = [audit.compare_logp(t, r, m, row_scale=None if bitwise else s, metadata=meta, **law)
              for t, r, m, s, meta in parts]
    want = audit.LogpAuditReport.merge(*per_mb)
    assert repr(got) == repr(want)  # every field, the float64 sums to the last bit (repr round-trips; NaN == NaN)
    assert got.to_dict(histogram=True) == want.to_dict(histogram=True)
    counts = got.report_counts  # one per add(): the all-padding one is not applicable, the NaN one fails
    assert counts["not_applicable"] == 1 and counts["fail"] >= 1 and sum(counts.values()) == 4
    assert (got.worst.sample, got.worst.position) == (5, 7) and got.worst.metadata == {
        "token_id": 5 * 30 + 7, "sample_id": [90, 120, 150], "flag": False, "weight": (5 * 30 + 7) / 7, "step": 3}
    assert (got.first_nonfinite.sample, got.first_nonfinite.position) == (6, 2)
    assert (got.first_nonfinite_input.sample, got.first_nonfinite_input.position) == (6, 2)
    assert got.nonfinite == 1 and got.nonfinite_inputs == 2 and got.status == audit.FAIL
    assert repr(acc.report()) == repr(got)  # report() reads, it does not consume
    acc.reset()
    assert acc.adds == 0 and acc.report().status == audit.NOT_APPLICABLE and acc.report().samples == 0


def test_one_add_is_compare_logp_with_exact_percentiles(monkeypatch):
    train, rollout, mask = _batch(seed=21)
    meta = {"token_id": torch.arange(300).view(6, 50), "tag": "x"}
    acc = audit.LogpAudit(dtype=torch.float32, expect_bitwise=True)
    with _no_host_sync(monkeypatch):
        acc.add(train, rollout, mask, metadata=meta)
    rep = acc.report()
    assert rep == _bitwise(train, rollout, mask, metadata=meta) and rep.reports is None
    assert rep.percentiles_exact and list(rep.percentiles.values()) == list(_numpy_metrics(
        train, rollout, mask, 0.2, 0.2)["quantiles"])


def test_accumulated_percentiles_are_exact_only_from_the_first_add_with_tokens():
    train, rollout, mask = _batch(seed=22)
    pad = torch.zeros_like(mask)
    empty = train[:0]
    for adds, exact in (([(empty, pad[:0]), (train, mask), (train, pad)], True),  # values only in the first with tokens
                        ([(train, pad), (train, mask)], False)):  # a later add(): read from the histogram
        acc = audit.LogpAudit(dtype="float32", expect_bitwise=True)
        for t, m in adds:
            acc.add(t, rollout[:t.shape[0]], m)
        got = acc.report()
        want = audit.merge_reports(_bitwise(t, rollout[:t.shape[0]], m) for t, m in adds)
        assert want.percentiles_exact and got.percentiles_exact is exact
        if exact:
            assert got.percentiles == want.percentiles
        # Everything else is the merge's.
        assert repr(dataclasses.replace(got, exact_percentiles=None)) == repr(
            dataclasses.replace(want, exact_percentiles=None))


def test_value_checks_are_device_flags_raised_by_report(monkeypatch):
    train, rollout, mask = _batch(B=3, T=8, seed=23)
    mask[:, 0] = True
    scale = torch.full((3, 8), 5.0, dtype=torch.float64)
    off = scale.clone()
    off[~mask] = math.nan  # inactive tokens may hold anything
    cases = (({"mask": mask.float() * 0.5}, "mask"), ({"row_scale": scale.clone().fill_(math.inf)}, "row_scale"),
             ({"row_scale": -scale}, "row_scale"), ({"row_scale": off}, None))
    for kw, argument in cases:
        acc = audit.LogpAudit(dtype="float32")
        kw = {"mask": mask, "row_scale": scale, **kw}
        with _no_host_sync(monkeypatch):
            acc.add(train, rollout, kw.pop("mask"), **kw)  # nothing raised yet: the values are on the device
            acc.add(train, rollout, mask, row_scale=scale)
        if argument is None:
            assert acc.report().active == 2 * int(mask.sum())
            continue
        with pytest.raises(errors.InputError) as e:
            acc.report()
        assert e.value.argument == argument and "add() number 0" in str(e.value)


def test_accumulator_checks_eagerly_what_needs_no_values():
    train, rollout, mask = _batch(B=2, T=4, seed=24)
    with pytest.raises(errors.ContractError):
        audit.LogpAudit(dtype=torch.float64, expect_bitwise=True)  # the law is resolved at construction
    with pytest.raises(errors.InputError) as e:
        audit.LogpAudit(dtype="float32", clip_range=1.5)
    assert e.value.argument == "clip_range"
    acc = audit.LogpAudit(dtype="float32")
    with pytest.raises(errors.InputError) as e:
        acc.add(train, rollout, mask)
    assert e.value.argument == "row_scale"
    with pytest.raises(errors.InputError) as e:
        acc.add(train, rollout, mask, row_scale=-1.0)  # a float is checked at once
    assert e.value.argument == "row_scale"
    acc.add(train, rollout, mask, row_scale=1.0)
    with pytest.raises(errors.DeviceError) as e:
        acc.add(train.to("meta"), rollout.to("meta"), row_scale=1.0)
    assert e.value.argument == "train_logp"
    assert acc.adds == 1  # a refused add() leaves no trace


@pytest.mark.gpu
def test_add_never_synchronizes_on_cuda(device):
    law = {"dtype": "float32", "clip_range": 0.2}
    parts = _micro_batches(seed=25)
    on_gpu = [tuple(x.to(device) for x in p[:4]) + ({k: v.to(device) if torch.is_tensor(v) else v
                                                      for k, v in p[4].items()},) for p in parts]
    audit._CONSTANTS.clear()  # the first add() copies the histogram edges to the device, without a sync too
    acc = audit.LogpAudit(**law)
    torch.cuda.synchronize()
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t, r, m, s, meta in on_gpu:
            acc.add(t, r, m, row_scale=s, metadata=meta)
        single = audit.LogpAudit(**law)
        single.add(*on_gpu[0][:3], row_scale=on_gpu[0][3])
    finally:
        torch.cuda.set_sync_debug_mode(before)
    got, want = acc.report(), audit.LogpAuditReport.merge(
        *[audit.compare_logp(t, r, m, row_scale=s, metadata=meta, **law) for t, r, m, s, meta in parts])
    # Exact on any device: counts, the histogram, maxima, tokens (libm's exp may differ in the sums).
    for k in ("samples", "tokens", "active", "nonfinite", "nonfinite_inputs", "exact", "clipped", "abs_max",
              "worst", "first_nonfinite", "first_nonfinite_input", "histogram", "percentiles", "reports"):
        assert repr(getattr(got, k)) == repr(getattr(want, k)), k  # repr: a NaN logp equals itself
    one = single.report()
    assert one.percentiles_exact and one.percentiles == audit.compare_logp(*parts[0][:3], row_scale=parts[0][3],
                                                                           **law).percentiles


# ---- non-finite inputs ----

def test_nonfinite_inputs_are_counted_and_reported_never_swallowed():
    train, rollout, mask = _batch(B=3, T=6, seed=26)
    train, mask = rollout.clone(), torch.ones_like(mask)
    train[1, 2] = rollout[1, 2] = -math.inf  # both sides -inf: dlogp 0
    train[2, 0] = rollout[2, 0] = math.inf
    train[0, 5], mask[0, 5] = math.nan, False  # inactive: ignored
    rep = _bitwise(train, rollout, mask)
    assert rep.nonfinite_inputs == 2 and rep.nonfinite == 0 and rep.exact == rep.active == 17
    assert rep.status == audit.PASS  # equal infinities alone do not fail: no dlogp is off
    assert (rep.first_nonfinite_input.sample, rep.first_nonfinite_input.position) == (1, 2)
    assert rep.first_nonfinite_input.dlogp == 0.0 and rep.first_nonfinite is None
    out = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert out["nonfinite_inputs"] == 2 and out["first_nonfinite_input_token"]["train"] == "-inf"
    assert "nonfinite inputs 2" in rep.summary()
    rollout[2, 3] = math.nan  # a NaN is both a non-finite input and a non-finite dlogp, and fails
    rep = _bitwise(train, rollout, mask)
    assert (rep.nonfinite_inputs, rep.nonfinite, rep.status) == (3, 1, audit.FAIL)
    merged = audit.merge_reports([_bitwise(train[:1], rollout[:1], mask[:1]), rep])
    assert merged.nonfinite_inputs == 3 and merged.first_nonfinite_input.sample == 1 + 1


# ---- the frameworks' names ----

FRAMEWORK_KEYS = {"training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
                  "training/rollout_probs_diff_std", "train_rollout_logprob_abs_diff",
                  "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                  "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff",
                  "rollout_corr/log_ppl_abs_diff", "rollout_corr/log_ppl_diff_max", "rollout_corr/log_ppl_diff_min",
                  "rollout_corr/ppl_ratio", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
                  "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                  "sampling/importance_sampling_ratio/max", "gen_kl_error"}
VERL_TOKEN_KEYS = ("rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token")
SEQUENCE_KEYS = ("rollout_corr/log_ppl_diff", "rollout_corr/log_ppl_abs_diff", "rollout_corr/log_ppl_diff_max",
                 "rollout_corr/log_ppl_diff_min", "rollout_corr/ppl_ratio", "rollout_corr/chi2_seq",
                 "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                 "sampling/importance_sampling_ratio/max")


def _numpy_probs_diff(train, rollout, mask):
    """verl's |exp(train) - exp(rollout)| over the finite active tokens, and how far ours may be from
    it per token: each exp or expm1 within 3 ulps (NumPy's SIMD exp documents < 2.52), plus the
    roundings of dlogp, a product and a difference: below 8 eps (exp(train) + exp(rollout))."""
    t, r, m = (x.double().numpy().ravel() for x in (train, rollout, mask))
    d = np.where(t == r, 0.0, t - r)
    keep = m.astype(bool) & np.isfinite(d)
    et, er = np.exp(t[keep]), np.exp(r[keep])
    return np.abs(et - er), 8 * EPS * (et + er)


def _assert_probs_diff(rep, x, err):
    """verl's mean, max and unbiased std (torch.std's default) of x against NumPy float64."""
    fm = rep.framework_metrics()
    n = x.size
    u = EPS / 2
    gamma = (n + 2) * u / (1 - (n + 2) * u)  # Higham's gamma for sums of n terms, either order
    assert abs(fm["training/rollout_probs_diff_max"] - x.max()) <= err.max()
    mean = x.sum() / n
    assert abs(fm["training/rollout_probs_diff_mean"] - mean) <= (2 * gamma * x.sum() + err.sum()) / n + EPS * mean
    # Ours: (S2 - S1 * (S1 / n)) / (n - 1) from float64 sums; NumPy's var is two-pass. Both are within
    # a few gamma * S2 of the exact value (S1^2 / n <= S2), and each term may be err off.
    var = np.var(x, ddof=1)
    s1, s2, e1 = x.sum(), (x * x).sum(), err.sum()
    e2 = (2 * x * err + err * err).sum()
    bound = (6 * gamma * s2 + e2 + (2 * s1 * e1 + e1 * e1) / n) / (n - 1) + 2 * EPS * var
    assert abs(fm["training/rollout_probs_diff_std"] ** 2 - var) <= bound, (fm, var, bound)


def test_framework_metrics_match_numpy_float64():
    train, rollout, mask = _batch(seed=27)
    rollout[0, 0], mask[0, 0] = math.nan, True  # non-finite tokens stay out, as in every metric
    rep = _bitwise(train, rollout, mask)
    fm = rep.framework_metrics()
    assert set(fm) == FRAMEWORK_KEYS and rep.to_dict()["framework_metrics"] == fm
    x, err = _numpy_probs_diff(train, rollout, mask)
    assert x.size == rep.finite
    _assert_probs_diff(rep, x, err)
    t, r, m = (x.double().numpy() for x in (train, rollout, mask))
    d = np.where(t == r, 0.0, t - r)[m.astype(bool)]
    d = d[np.isfinite(d)]
    assert fm["sampling/sampling_logp_difference/max"] == np.abs(d).max() == rep.abs_max
    assert fm["sampling/sampling_logp_difference/mean"] == fm["train_rollout_logprob_abs_diff"] == rep.abs_mean
    _assert_mean(fm["train_rollout_logprob_abs_diff"], np.abs(d))


def test_framework_metrics_merge_exactly():
    parts = _micro_batches(seed=28)
    reps = [audit.compare_logp(t, r, m, dtype="float32", row_scale=s) for t, r, m, s, _ in parts]
    acc = audit.LogpAudit(dtype="float32")
    for t, r, m, s, _ in parts:
        acc.add(t, r, m, row_scale=s)
    for merged in (audit.merge_reports(reps), acc.report()):
        total = 0.0
        for r in reps:
            total += r.sum_pdiff
        assert merged.sum_pdiff == total and merged.finite == sum(r.finite for r in reps)
        assert merged.pdiff_max == max(r.pdiff_max for r in reps if r.pdiff_max is not None)
        fm = merged.framework_metrics()
        assert fm["sampling/sampling_logp_difference/max"] == max(r.abs_max for r in reps if r.abs_max is not None)
        train, rollout, mask = (torch.cat([p[i] for p in parts]) for i in range(3))
        _assert_probs_diff(merged, *_numpy_probs_diff(train, rollout, mask.bool()))


def _framework_batch(seed, B=10, T=24):
    """A masked float32 batch: an empty row, a single-token row, interior holes, a non-finite token, a
    row whose only active token is non-finite, a row far off (its TRL sequence ratio is masked) and a
    token 25 below (past verl's -20 clamp of the log ratio)."""
    train, rollout, mask = _batch(B=B, T=T, seed=seed)
    mask[0] = False
    mask[1] = False
    mask[1, 9] = True
    mask[2] = True
    mask[2, 3:7] = False
    rollout[3, 5], mask[3, 5] = math.nan, True
    mask[4] = False
    train[4, 2], mask[4, 2] = math.nan, True
    train[6] = rollout[6] + 0.15
    train[7, 0], mask[7, 0] = rollout[7, 0] - 25.0, True
    return train, rollout, mask


def _gamma(n):
    """Higham's bound on the relative error of a float64 sum of n terms, in any order, with slack."""
    u = EPS / 2
    return (n + 2) * u / (1 - (n + 2) * u)


def _finite_rows(train, rollout, mask):
    """float64 (train, rollout) of each sample's finite active tokens, for the samples that have one."""
    t, r, m = (x.double().numpy() for x in (train, rollout, mask))
    keep = m.astype(bool) & np.isfinite(np.where(t == r, 0.0, t - r))
    return [(t[i][keep[i]], r[i][keep[i]]) for i in range(t.shape[0]) if keep[i].any()]


def _verl_rollout_corr(rows):
    """verl's compute_offpolicy_metrics (verl/trainer/ppo/rollout_corr_helper.py) transcribed to float64
    NumPy over the finite active tokens: {key: (value, bound on |ours - value|)}.

    The bounds are derived, not tuned: sums within _gamma(n) of the terms' absolute sum in either
    summation order; exp and expm1 within 3 ulps (NumPy's SIMD exp documents < 2.52); dlogp and each
    difference, product and division rounded once; exp's Lipschitz constant exp(x + e) for an error e
    in its argument, for the per-sequence metrics whose arguments come from differently ordered sums.
    """
    t, r = (np.concatenate(side) for side in zip(*rows))
    n, k = t.size, len(rows)
    log_ratio = t - r  # verl: old_log_prob - rollout_log_prob
    out = {}

    def mean_of(key, terms, err=0.0):  # terms' mean; err bounds each term's difference from ours
        value = terms.mean()
        out[key] = value, (2 * _gamma(terms.size) * np.abs(terms).sum() + np.sum(err)) / terms.size + EPS * abs(value)

    mean_of("rollout_corr/kl", r - t)  # ours negates each dlogp: the same terms up to sign
    k3 = np.exp(log_ratio) - log_ratio - 1
    mean_of("rollout_corr/k3_kl", k3, 8 * EPS * (np.exp(log_ratio) + np.abs(log_ratio) + 1))
    rho2 = np.exp(np.clip(log_ratio, -20.0, 20.0)) ** 2
    chi2 = rho2.mean() - 1.0  # verl: mean of rho^2, then - 1; ours: mean of expm1(2 clamp)
    out["rollout_corr/chi2_token"] = chi2, ((_gamma(n) + 8 * EPS) * (rho2.sum() + np.abs(rho2 - 1).sum()) / n
                                           + EPS * (abs(chi2) + 1))

    mean_t = np.array([a.mean() for a, _ in rows])
    mean_r = np.array([b.mean() for _, b in rows])
    log_ppl_diff = mean_r - mean_t  # verl: mean_log_prob_rollout - mean_log_prob_training, per sequence
    # Ours is -(sum of dlogp) / n_i per sample: both sides' sums, ours and the reference's, may be off.
    e = np.array([_gamma(a.size) * (np.abs(a).sum() + np.abs(b).sum() + 2 * np.abs(a - b).sum()) / a.size
                  for a, b in rows]) + EPS * (np.abs(mean_t) + np.abs(mean_r) + np.abs(log_ppl_diff))
    mean_of("rollout_corr/log_ppl_diff", log_ppl_diff, e)
    mean_of("rollout_corr/log_ppl_abs_diff", np.abs(log_ppl_diff), e)
    out["rollout_corr/log_ppl_diff_max"] = log_ppl_diff.max(), e.max()
    out["rollout_corr/log_ppl_diff_min"] = log_ppl_diff.min(), e.max()
    mean_of("rollout_corr/ppl_ratio", np.exp(log_ppl_diff), np.exp(log_ppl_diff + e) * (e + 6 * EPS))
    seq = np.clip(np.array([(a - b).sum() for a, b in rows]), -20.0, 20.0)  # verl: masked_sum, clamp
    ds = np.array([2 * _gamma(a.size) * np.abs(a - b).sum() for a, b in rows])  # the same terms, another order
    w = np.exp(2.0 * seq)
    chi2_seq = w.mean() - 1.0
    out["rollout_corr/chi2_seq"] = chi2_seq, ((_gamma(k) * (w.sum() + np.abs(w - 1).sum())
                                               + (np.exp(2 * (seq + ds)) * (2 * ds + 6 * EPS)).sum()) / k
                                              + EPS * (abs(chi2_seq) + 1))
    return out


def _trl_importance_sampling_ratio(rows, mode, clip_min, clip_max):
    """TRL GRPOTrainer's sequence importance sampling ratio stats (trl/trainer/grpo_trainer.py) in
    float64 NumPy: exp of each sequence's sum of (old - sampling) logps over its mask, clamped to
    (sequence_truncate) or set to 0 outside (sequence_mask) [clip_min, clip_max]; then min, mean, max.
    {key: (value, bound)}, with each ratio's bound exp(s + ds) (ds + 6 eps) (clamping is 1-Lipschitz) and
    a check that no ratio lies within its bound of a mask edge, where the two could decide differently."""
    s = np.array([(a - b).sum() for a, b in rows])
    ds = np.array([2 * _gamma(a.size) * np.abs(a - b).sum() for a, b in rows])
    ratio = np.exp(s)
    err = np.exp(s + ds) * (ds + 6 * EPS)
    if mode == "sequence_truncate":
        ratio = np.clip(ratio, clip_min, clip_max)
    else:
        for edge in (clip_min, clip_max):
            if edge is not None:
                assert np.all(np.abs(np.exp(s) - edge) > 2 * err), "a ratio sits on a mask edge: pick another seed"
        lo = -math.inf if clip_min is None else clip_min
        hi = math.inf if clip_max is None else clip_max
        ratio = np.where((ratio < lo) | (ratio > hi), 0.0, ratio)
    k = ratio.size
    mean = ratio.mean()
    return {"sampling/importance_sampling_ratio/min": (ratio.min(), err.max()),
            "sampling/importance_sampling_ratio/mean": (mean, (2 * _gamma(k) * ratio.sum() + err.sum()) / k
                                                        + EPS * mean),
            "sampling/importance_sampling_ratio/max": (ratio.max(), err.max())}


def _assert_within(fm, want):
    for key, (value, bound) in want.items():
        assert fm[key] is not None and abs(fm[key] - value) <= bound, (key, fm[key], value, bound)


TRL_SETTINGS = (("sequence_mask", None, 3.0), ("sequence_mask", 0.5, 2.0), ("sequence_truncate", None, 3.0),
                ("sequence_truncate", 0.5, 2.0))


def test_framework_metrics_rollout_corr_gen_kl_and_trl_ratio_match_numpy_float64():
    train, rollout, mask = _framework_batch(seed=30)
    rep = _bitwise(train, rollout, mask)
    rows = _finite_rows(train, rollout, mask)
    assert [s.dlogp_sum is not None for s in rep.per_sample] == [False, True, True, True, False] + [True] * 5
    assert len(rows) == 8 and rows[0][0].size == 1 and rep.nonfinite == 2
    fm = rep.framework_metrics()
    assert set(fm) == FRAMEWORK_KEYS and rep.to_dict()["framework_metrics"] == fm
    json.dumps(rep.to_dict(), allow_nan=False)
    want = _verl_rollout_corr(rows)
    _assert_within(fm, want)
    assert fm["rollout_corr/k3_kl"] == fm["gen_kl_error"] == rep.approx_kl0  # the same k3 mean, one accumulator
    assert fm["rollout_corr/kl"] == -rep.dlogp_mean
    for mode, lo, hi in TRL_SETTINGS:
        got = rep.framework_metrics(trl_is_mode=mode, trl_is_clip_min=lo, trl_is_clip_max=hi)
        _assert_within(got, _trl_importance_sampling_ratio(rows, mode, lo, hi))
        assert {k: v for k, v in got.items() if "importance_sampling_ratio" not in k} == {
            k: v for k, v in fm.items() if "importance_sampling_ratio" not in k}
    assert fm == rep.framework_metrics(trl_is_mode="sequence_mask", trl_is_clip_min=None, trl_is_clip_max=3.0)
    assert fm["sampling/importance_sampling_ratio/min"] == 0.0  # row 6's ratio, about exp(3), is masked
    t, r, m = (x.double().numpy() for x in (train, rollout, mask))
    for i, s in enumerate(rep.per_sample):
        if s.dlogp_sum is not None:
            keep = m[i].astype(bool) & np.isfinite(t[i] - r[i])
            _assert_mean(s.dlogp_sum / keep.sum(), t[i][keep] - r[i][keep])
            assert s.dlogp_mean == s.dlogp_sum / keep.sum()


def test_framework_metrics_rollout_corr_and_sequence_ratio_merge_exactly():
    train, rollout, mask = _framework_batch(seed=31)
    cuts = ((0, 3), (3, 4), (4, 10))
    reps = [_bitwise(train[a:b], rollout[a:b], mask[a:b]) for a, b in cuts]
    acc = audit.LogpAudit(dtype="float32", expect_bitwise=True)
    for a, b in cuts:
        acc.add(train[a:b], rollout[a:b], mask[a:b])
    whole = _bitwise(train, rollout, mask)
    want = _verl_rollout_corr(_finite_rows(train, rollout, mask))
    for merged in (audit.merge_reports(reps), audit.merge_across_ranks(audit.merge_reports(reps)), acc.report()):
        total = 0.0
        for r in reps:
            total += r.sum_chi2_token
        assert merged.sum_chi2_token == total
        # Per-sequence metrics come from the per-sample list, which merges by concatenation: bit for bit.
        assert merged.per_sample == whole.per_sample
        for mode, lo, hi in TRL_SETTINGS:
            kw = {"trl_is_mode": mode, "trl_is_clip_min": lo, "trl_is_clip_max": hi}
            fm, fw = merged.framework_metrics(**kw), whole.framework_metrics(**kw)
            assert {k: fm[k] for k in SEQUENCE_KEYS} == {k: fw[k] for k in SEQUENCE_KEYS}
        _assert_within(merged.framework_metrics(), want)  # the token means, from merged sums


def test_framework_metrics_are_none_where_undefined():
    train, rollout, mask = _batch(B=2, T=5, seed=29)
    none = _bitwise(train, rollout, torch.zeros_like(mask)).framework_metrics()
    assert set(none) == FRAMEWORK_KEYS and all(v is None for v in none.values())
    nan = train.clone()
    nan[mask] = math.nan  # active tokens, but none finite: no token and no sample to average over
    rep = _bitwise(nan, rollout, mask)
    assert rep.active > 0 and all(v is None for v in rep.framework_metrics().values())
    one = torch.zeros_like(mask)
    one[1, 3] = True
    fm = _bitwise(train, rollout, one).framework_metrics()
    assert fm["training/rollout_probs_diff_std"] is None  # torch.std of one value is NaN: reported as None
    assert fm["training/rollout_probs_diff_max"] == fm["training/rollout_probs_diff_mean"] is not None
    assert all(fm[k] is not None for k in FRAMEWORK_KEYS - {"training/rollout_probs_diff_std"})
    # One token in one sample: the sequence's log-ppl difference is the token's -dlogp, verl's kl too.
    assert (fm["rollout_corr/log_ppl_diff"] == fm["rollout_corr/log_ppl_diff_max"] == fm["rollout_corr/log_ppl_diff_min"]
            == fm["rollout_corr/kl"])
    same = _bitwise(train, train.clone(), mask).framework_metrics()
    assert same["training/rollout_probs_diff_std"] == 0.0 and same["sampling/sampling_logp_difference/max"] == 0.0
    assert all(same[k] == 0.0 for k in VERL_TOKEN_KEYS + ("rollout_corr/log_ppl_diff", "rollout_corr/chi2_seq"))
    assert same["rollout_corr/ppl_ratio"] == same["sampling/importance_sampling_ratio/mean"] == 1.0
    assert math.copysign(1.0, same["rollout_corr/kl"]) == 1.0  # 0.0, not -0.0


@pytest.mark.parametrize("kw, argument", [
    ({"trl_is_mode": "token_truncate"}, "trl_is_mode"),  # per-token clamps: not rebuilt from sums
    ({"trl_is_mode": "token_mask"}, "trl_is_mode"),
    ({"trl_is_mode": "sequence"}, "trl_is_mode"),
    ({"trl_is_clip_max": math.nan}, "trl_is_clip_max"),
    ({"trl_is_clip_min": True}, "trl_is_clip_min"),
    ({"trl_is_clip_min": 4.0}, "trl_is_clip_min"),  # above the default clip_max 3.0
])
def test_framework_metrics_bad_trl_settings_raise(kw, argument):
    train, rollout, mask = _batch(B=2, T=5, seed=32)
    for rep in (_bitwise(train, rollout, mask), _bitwise(train, rollout, torch.zeros_like(mask))):
        with pytest.raises(errors.InputError) as info:
            rep.framework_metrics(**kw)
        assert info.value.argument == argument


def test_verl_chi2_clamps_the_log_ratio_at_20():
    """A token 25 above and a sequence of three 8s (each inside, their sum 24 past the clamp): verl's
    rho = exp(clamp(log ratio, -20, 20)) per token and per sequence sum, as transcribed."""
    rollout = torch.full((3, 4), -1.0)
    train = rollout.clone()
    mask = torch.zeros(3, 4, dtype=torch.bool)
    train[0, 1], mask[0, 1] = 24.0, True
    train[1, :3], mask[1, :3] = 7.0, True
    train[2, 2], mask[2, 2] = -1.5, True
    rep = _bitwise(train, rollout, mask)
    fm = rep.framework_metrics()
    want = _verl_rollout_corr(_finite_rows(train, rollout, mask))
    _assert_within(fm, want)
    d = np.array([25.0, 8.0, 8.0, 8.0, -0.5])
    unclamped_token = np.mean(np.exp(2 * d)) - 1
    unclamped_seq = np.mean(np.exp(2 * np.array([25.0, 24.0, -0.5]))) - 1
    assert abs(unclamped_token - want["rollout_corr/chi2_token"][0]) > 1e3 * want["rollout_corr/chi2_token"][1]
    assert abs(unclamped_seq - want["rollout_corr/chi2_seq"][0]) > 1e3 * want["rollout_corr/chi2_seq"][1]
