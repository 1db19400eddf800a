"""The drift command's parts independent of rlk's model: tiny model, control group, report, chart."""
import json

import pytest
import torch

from rlk_triton.errors import DTypeError, InputError, ShapeError

transformers = pytest.importorskip("transformers")
from rlk_triton.drift import report as R  # noqa: E402
from rlk_triton.drift.chart import write_chart  # noqa: E402
from rlk_triton.drift.control import run_control  # noqa: E402
from rlk_triton.drift.tiny import load_model, load_prompts, synthetic_prompts, tiny_model  # noqa: E402
from rlk_triton.probe import compare  # noqa: E402

NEW = 6


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0, dtype="bfloat16")


@pytest.fixture(scope="module")
def prompts():
    return synthetic_prompts(seed=0, vocab_size=512)


@pytest.fixture(scope="module")
def result(model, prompts):
    return run_control(model, prompts, max_new_tokens=NEW, temperature=0.8, seed=3, probe=True)


def test_tiny_model_and_prompts_are_seeded():
    a, b, c = tiny_model(seed=1, dtype="float32"), tiny_model(seed=1, dtype="float32"), tiny_model(seed=2, dtype="float32")
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    p = synthetic_prompts(seed=0, vocab_size=512)
    assert p == synthetic_prompts(seed=0, vocab_size=512) and p != synthetic_prompts(seed=1, vocab_size=512)
    assert len(p) == 8 and min(map(len, p)) == 3 and max(map(len, p)) == 17
    assert all(0 < t < 512 for q in p for t in q)
    with pytest.raises(InputError) as e:
        tiny_model(dtype="int8")
    assert e.value.argument == "dtype"
    with pytest.raises(InputError) as e:
        tiny_model(preset="huge")
    assert e.value.argument == "preset"


def test_loaders_are_local(tmp_path):
    tiny_model(seed=0, dtype="float32").save_pretrained(tmp_path / "ckpt")
    m = load_model(tmp_path / "ckpt", dtype="float32")
    assert torch.equal(m.lm_head.weight, tiny_model(seed=0, dtype="float32").lm_head.weight)
    with pytest.raises(InputError) as e:
        load_model(tmp_path / "missing")
    assert e.value.argument == "model"
    f = tmp_path / "p.jsonl"
    f.write_text('{"ids": [1, 2, 3]}\n\n{"ids": [7]}\n')
    assert load_prompts(f) == [[1, 2, 3], [7]]
    f.write_text('{"text": "hello"}\n')
    with pytest.raises(InputError) as e:
        load_prompts(f)  # text needs a tokenizer
    assert e.value.argument == "prompts"
    f.write_text('{"ids": []}\n')
    with pytest.raises(InputError):
        load_prompts(f)


def test_control_arrays_are_aligned(model, prompts, result):
    r = result
    B = len(prompts)
    assert r.tokens_scored == B * NEW  # the tiny model has no EOS: every completion is NEW long
    for x in (r.rollout_logp, r.train_alone_logp, r.train_batched_logp):
        assert x.dtype == torch.float32 and x.shape == (B * NEW,) and bool(torch.isfinite(x).all())
    assert r.dtype == torch.bfloat16
    keys = r.keys.tolist()
    assert keys == sorted(keys) and len(set(map(tuple, keys))) == len(keys)
    for (b, p), tok in zip(keys, r.tokens.tolist()):
        assert len(prompts[b]) <= p < len(r.sequences[b]) and r.sequences[b][p] == tok
        assert r.sequences[b][:len(prompts[b])] == prompts[b]
    # Alignment against an independent computation: sequence 2 alone, scored by hand.
    b = 2
    seq = torch.tensor([r.sequences[b]])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=seq).logits[0].float() / r.temperature, -1)
    rows = [i for i, (s, _) in enumerate(keys) if s == b]
    want = torch.stack([lp[p - 1, r.sequences[b][p]] for _, p in (keys[i] for i in rows)])
    assert torch.equal(r.train_alone_logp[rows], want)
    # The rollout scores the same tokens: near the trainer's, far closer than two different tokens' logps.
    assert float((r.rollout_logp - r.train_alone_logp).abs().max()) < float(r.train_alone_logp.std())


def test_control_is_reproducible_and_seeded(model, prompts, result):
    again = run_control(model, prompts, max_new_tokens=NEW, temperature=0.8, seed=3)
    assert again.sequences == result.sequences and torch.equal(again.rollout_logp, result.rollout_logp)
    other = run_control(model, prompts, max_new_tokens=NEW, temperature=0.8, seed=4)
    assert other.sequences != result.sequences
    greedy = run_control(model, prompts[:2], max_new_tokens=3, greedy=True)
    assert greedy.greedy and greedy.tokens_scored == 6
    with pytest.raises(InputError) as e:
        run_control(model, [[1, 2], []])
    assert e.value.argument == "prompts"
    with pytest.raises(InputError) as e:
        run_control(model, prompts, temperature=0.0)
    assert e.value.argument == "temperature"


def test_control_probe(result):
    res = result.probe()
    assert res.op("embed").bitwise  # the same token ids embed to the same bits in any batch
    # The probe's verdict agrees with the logp it leads to: logits differ iff some logp does.
    logp_differ = not torch.equal(result.rollout_logp, result.train_batched_logp)
    assert (res.first_divergent_op is not None) == (logp_differ or not res.op("logits").bitwise)
    dec = result.probe(decode_only=True)
    assert dec.op("embed").tokens == len(result.sequences) * (NEW - 1)


def _groups(result):
    control = R.control_group(result)
    same = compare(result.recordings["train_batched"], result.recordings["train_batched"])
    rlk = R.measure_group("rlk", result.train_batched_logp.clone(), result.train_batched_logp.clone(), result.keys,
                          dtype=result.dtype, probe=same)
    return control, rlk


def test_report_layout(model, result):
    control, rlk = _groups(result)
    rep = R.build_report(control=control, rlk=rlk, model=R.describe_model(model, "tiny"), device=R.device_name("cpu"),
                         dtype=result.dtype, seed=result.seed, settings={"temperature": result.temperature})
    text = json.dumps(rep, allow_nan=False)
    assert json.loads(text) == rep
    for k in ("model", "device", "dtype", "seed", "versions", "config_fingerprint", "control", "rlk"):
        assert k in rep, k
    for k in ("torch", "triton", "transformers", "numpy"):
        assert rep["versions"][k], k
    for name in ("control", "rlk"):
        for k in ("max_abs_dlogp", "mean_abs_dlogp", "tokens", "bitwise", "first_divergent_op"):
            assert k in rep[name], (name, k)
        assert rep[name]["tokens"] == result.tokens_scored
    d = (result.rollout_logp - result.train_batched_logp).abs()
    assert rep["control"]["bitwise"] == bool((d == 0).all())
    assert rep["control"]["max_abs_dlogp"] == pytest.approx(float(d.max()), rel=1e-6)
    assert rep["control"]["first_divergent_op"] == control.probe.first_divergent_op
    assert rep["rlk"]["bitwise"] is True and rep["rlk"]["max_abs_dlogp"] == 0 and rep["rlk"]["first_divergent_op"] is None
    assert set(rep["control"]["variants"]) == {"rollout_vs_train_alone", "train_alone_vs_train_batched"}
    table = R.format_table(rep)
    assert "control" in table and "rlk" in table and rep["device"] in table
    rep_none = R.build_report(control=control, rlk=None, model="m", device="cpu", dtype="bfloat16", seed=0)
    assert rep_none["rlk"] is None and "(not run)" in R.format_table(rep_none)


def test_measure_group_checks_inputs(result):
    k, lp = result.keys, result.rollout_logp
    with pytest.raises(DTypeError) as e:
        R.measure_group("x", lp.bfloat16(), lp, k, dtype=torch.bfloat16)
    assert e.value.argument == "rollout_logp"
    with pytest.raises(ShapeError) as e:
        R.measure_group("x", lp, lp, k[:-1], dtype=torch.bfloat16)
    assert e.value.argument == "keys"
    with pytest.raises(InputError) as e:
        R.measure_group("x", lp[:2], lp[:2], torch.tensor([[0, 1], [0, 1]]), dtype=torch.bfloat16)
    assert e.value.argument == "keys"
    g = R.measure_group("x", lp, lp + 1e-3, k, dtype=torch.bfloat16)
    assert not g.bitwise and g.report.status == "fail"


def test_chart_writes_png(tmp_path, result):
    control, rlk = _groups(result)
    rep = R.build_report(control=control, rlk=rlk, model="tiny", device="cpu", dtype=result.dtype, seed=0)
    for name, r in (("both.png", rlk), ("control_only.png", None)):
        out = write_chart(tmp_path / name, rep, control, r)
        data = out.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(InputError) as e:
        write_chart(tmp_path / "x.jpg", rep, control, rlk)
    assert e.value.argument == "chart"
