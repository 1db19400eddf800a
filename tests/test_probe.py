"""The layer-wise probe: finds the op where two executions part ways, and nothing where they do not."""
import pytest
import torch

from rlk_triton.errors import InputError, ShapeError
from rlk_triton.probe import Recording, TransformersRecorder, compare, layer_of

transformers = pytest.importorskip("transformers")
from rlk_triton.drift.tiny import synthetic_prompts, tiny_model  # noqa: E402

NAMES = ["embed"] + [f"layers.{i}.{op}" for i in range(2) for op in
                     ("input_norm", "q_proj", "q", "k_proj", "k", "v", "attn_out", "o_proj", "post_norm", "mlp", "out")] \
    + ["final_norm", "logits"]


def _chain(perturb=None, rows=5, width=8):
    """A synthetic op chain fed through record(): each op's rows feed the next, like a model's."""
    rec = Recording("chain")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=g)
    keys = [(0, p) for p in range(rows)]
    for name in ("embed", "layers.0.mlp", "layers.0.out", "layers.1.mlp", "layers.1.out", "logits"):
        x = torch.tanh(x @ torch.randn(width, width, generator=g))
        if name == perturb:
            x = x.clone()
            x[2, 3] += 1e-3
        rec(name, x, keys)
    return rec


def test_recording_interface_and_errors():
    rec = Recording("r")
    rec.record("b", torch.zeros(2, 3), [(0, 0), (0, 1)])
    rec.record("a", torch.zeros(1, 3), torch.tensor([[1, 0]]))
    rec.record("b", torch.ones(1, 3), [(1, 0)])
    assert rec.ops == ["b", "a"]  # order of first record
    keys, rows = rec.rows("b")
    assert keys.tolist() == [[0, 0], [0, 1], [1, 0]] and rows.shape == (3, 3)
    with pytest.raises(InputError) as e:
        rec.record("b", torch.zeros(1, 3), [(0, 1)])
    assert e.value.argument == "keys"
    with pytest.raises(ShapeError) as e:
        rec.record("c", torch.zeros(2, 3), [(0, 0)])
    assert e.value.argument == "keys"
    with pytest.raises(ShapeError):
        rec.record("b", torch.zeros(1, 4), [(2, 0)])
    with pytest.raises(InputError) as e:
        compare(rec, "not a recording")
    assert e.value.argument == "b"
    assert layer_of("layers.12.attn_out") == 12 and layer_of("final_norm") is None


def test_bound_callback_keys_every_row():
    rec = Recording("packed")
    record = rec.bound([(0, 0), (0, 1), (1, 0)])
    record("embed", torch.zeros(3, 4))
    record("logits", torch.ones(3, 2))
    assert rec.ops == ["embed", "logits"] and rec.rows("logits")[0].tolist() == [[0, 0], [0, 1], [1, 0]]
    with pytest.raises(ShapeError):
        record("final_norm", torch.zeros(2, 4))


def test_compare_identical_chains_is_bitwise():
    res = compare(_chain(), _chain())
    assert res.bitwise and res.first_divergent_op is None
    assert [o.name for o in res.ops] == _chain().ops
    assert all(o.tokens == 5 and o.max_abs_diff == 0 for o in res.ops)


@pytest.mark.parametrize("op", ["layers.0.mlp", "layers.1.out", "logits"])
def test_compare_finds_injected_divergence_in_a_chain(op):
    res = compare(_chain(), _chain(perturb=op))
    assert res.first_divergent_op == op
    first = res.op(op)
    assert first.worst_key == (0, 2) and first.rows_differ == 1
    order = [o.name for o in res.ops]
    assert all(o.bitwise for o in res.ops[:order.index(op)])
    assert all(not o.bitwise for o in res.ops[order.index(op):])


def test_compare_matches_rows_by_key_not_by_order():
    a, b = Recording("a"), Recording("b")
    x = torch.arange(12.0).reshape(4, 3)
    a.record("embed", x, [(0, 0), (0, 1), (1, 0), (1, 1)])
    b.record("embed", x.flip(0)[:3], [(1, 1), (1, 0), (0, 1)])  # other order, one token missing
    res = compare(a, b)
    assert res.bitwise and res.op("embed").tokens == 3
    b2 = Recording("b2")
    b2.record("embed", x.flip(0), [(1, 1), (1, 0), (0, 1), (0, 0)][::-1])  # keys no longer fit the rows
    assert not compare(a, b2).bitwise
    assert compare(a, b, keys=[(0, 1)]).op("embed").tokens == 1


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0, dtype="float32")


def _batch(prompts):
    T = max(map(len, prompts))
    ids = torch.zeros(len(prompts), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
        mask[b, :len(p)] = 1
    return ids, mask


def _forward(model, ids, mask, perturb=None):
    rec = Recording("fwd")
    handles = []
    if perturb is not None:
        module, kind = perturb
        bump = lambda t: t + 1e-2 * (t.abs().amax() + 1)  # noqa: E731  a change that survives rounding
        if kind == "pre":
            handles.append(module.register_forward_pre_hook(lambda m, args: (bump(args[0]), *args[1:]), prepend=True))
        else:
            handles.append(module.register_forward_hook(lambda m, args, out: bump(out), prepend=True))
    try:
        with TransformersRecorder(model, rec), torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return rec


def test_recorder_names_and_identical_forwards(model):
    prompts = synthetic_prompts(0, 512)[:4]
    ids, mask = _batch(prompts)
    a, b = _forward(model, ids, mask), _forward(model, ids, mask)
    assert a.ops == NAMES
    n = sum(map(len, prompts))
    assert all(a.rows(name)[0].shape[0] == n for name in NAMES)  # padding rows are left out
    res = compare(a, b)
    assert res.bitwise and res.first_divergent_op is None
    assert [s.stage for s in res.stages] == ["embed", "layers.0", "layers.1", "final_norm", "logits"]


@pytest.mark.parametrize("op", ["layers.0.q", "layers.1.attn_out", "layers.1.mlp", "final_norm"])
def test_recorder_finds_the_perturbed_op(model, op):
    prompts = synthetic_prompts(0, 512)[:4]
    ids, mask = _batch(prompts)
    layers = model.model.layers
    where = {"layers.0.q": (layers[0].self_attn.q_norm, "out"),
             "layers.1.attn_out": (layers[1].self_attn.o_proj, "pre"),
             "layers.1.mlp": (layers[1].mlp, "out"), "final_norm": (model.model.norm, "out")}[op]
    res = compare(_forward(model, ids, mask), _forward(model, ids, mask, perturb=where))
    assert res.first_divergent_op == op
    assert res.op(op).rows_differ == sum(map(len, prompts))
    assert not res.op("logits").bitwise
    before = [o for o in res.ops[:[o.name for o in res.ops].index(op)]]
    assert before and all(o.bitwise for o in before)


def test_recorder_keys_generate_steps_like_teacher_forcing(model):
    """Left-padded generate (prefill + one-token decode steps) and a right-padded forward key the same
    token the same way: the rows of the prompt's first embedding agree bitwise, whatever the padding."""
    prompts = synthetic_prompts(1, 512)[:3]
    B, L, new = len(prompts), max(map(len, prompts)), 4
    ids = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    roll = Recording("rollout")
    with TransformersRecorder(model, roll), torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    assert roll.rows("embed")[0].shape[0] == sum(map(len, prompts)) + B * (new - 1)
    assert roll.rows("logits")[0].shape[0] == B * new  # prefill scores only the last prompt token
    seqs = [out[b, L - len(p):].tolist() for b, p in enumerate(prompts)]
    tids, tmask = _batch(seqs)
    res = compare(roll, _forward(model, tids, tmask))
    assert res.op("embed").bitwise and res.op("embed").tokens == sum(map(len, prompts)) + B * (new - 1)
    assert res.op("logits").tokens == B * new
    keys = roll.rows("logits")[0].tolist()
    assert sorted(keys) == sorted([b, len(p) - 1 + s] for b, p in enumerate(prompts) for s in range(new))
