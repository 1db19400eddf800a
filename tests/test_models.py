"""rlk_triton.models: configs, weight loading, and the bitwise claims of the decoder.

The claim: every sampled token's rollout logp equals its training logp (torch.equal) for any batch
composition, request order, micro-batch, prefill chunk size and page layout; a token's training logp
and d hidden rows do not depend on the other sequences of its micro-batch; parameter gradients are
bitwise equal on repeat. Models are tiny transformers models with seeded random weights.
"""
import json

import pytest
import torch

from rlk_triton.errors import InputError, RlkError
from rlk_triton.models import (DecoderConfig, RolloutEngine, SamplingParams, UnsupportedConfigError, WeightError,
                               from_hf_model, from_pretrained_dir, keep_mask, to_training_batch, train_forward)
from rlk_triton.models.sampling import sample_tokens
from rlk_triton.models.tiny import tiny_hf_config, tiny_hf_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _prompts(n, lo, hi, seed, V=256):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(0, V, (k,), generator=g).tolist() for k in lens]


def _pack(seqs, device):
    toks = torch.tensor([t for s in seqs for t in s], dtype=torch.int64, device=device)
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    return toks, torch.tensor(cu, dtype=torch.int32, device=device)


class KeyedRows:
    """A record callback keeping one row per (name, sequence id, position), detached."""

    def __init__(self):
        self.rows = {}

    def __call__(self, name, tensor, keys):
        t = tensor.detach()
        for i, (sid, pos) in enumerate(keys.tolist()):
            self.rows[(name, sid, pos)] = t[i].clone()


@pytest.fixture(scope="module")
def qwen3():
    return tiny_hf_model("qwen3", seed=0)


@pytest.fixture(scope="module")
def qwen3_bf16(qwen3):
    return from_hf_model(qwen3, dtype=torch.bfloat16, device=DEVICE)


# ---- configs ----

def test_config_from_object_and_from_dict_agree(tmp_path):
    for family in ("qwen3", "qwen2", "llama"):
        cfg = tiny_hf_config(family)
        a = DecoderConfig.from_hf(cfg)
        b = DecoderConfig.from_hf(json.loads(cfg.to_json_string()))
        assert a == b and a.model_type == family
    llama = DecoderConfig.from_hf(tiny_hf_config("llama"))
    assert llama.rope_scaling["type"] == "llama3" and llama.tie_word_embeddings
    assert DecoderConfig.from_hf(tiny_hf_config("qwen2")).qkv_bias
    assert DecoderConfig.from_hf(tiny_hf_config("qwen3")).qk_norm
    # a transformers-4 style config.json: rope_theta and rope_scaling at the top level
    old = {k: v for k, v in tiny_hf_config("llama").to_dict().items() if k != "rope_parameters"}
    old.update(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    assert DecoderConfig.from_hf(old) == llama


@pytest.mark.parametrize("change,field", [
    ({"num_experts": 8}, "num_experts"),
    ({"num_local_experts": 4}, "num_local_experts"),
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
    ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 16}, "layer_types"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"head_dim": 24}, "head_dim"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters"),
])
def test_unsupported_config_raises_naming_the_field(change, field):
    d = tiny_hf_config("qwen3").to_dict()
    d.update(change)
    with pytest.raises(UnsupportedConfigError) as e:
        DecoderConfig.from_hf(d)
    assert e.value.argument == field and isinstance(e.value, RlkError)


# ---- weights ----

@pytest.mark.parametrize("family,shard", [("qwen3", None), ("llama", "40KB")])
def test_checkpoint_dir_loads_the_same_weights_as_the_object(tmp_path, family, shard):
    hf = tiny_hf_model(family, seed=1)
    kw = {} if shard is None else {"max_shard_size": shard}
    hf.save_pretrained(tmp_path, **kw)
    if shard is not None:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    a = from_hf_model(hf)
    b = from_pretrained_dir(tmp_path)
    assert a.dtype == b.dtype == torch.float32
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    if family == "llama":  # tied: the LM head is the embedding matrix itself
        assert b.lm_head is None and b.lm_head_weight is b.model.embed_tokens.weight
    c = from_pretrained_dir(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in c.parameters())
    assert all(p.requires_grad for p in c.parameters())


def test_weight_errors_name_the_tensor(tmp_path):
    from rlk_triton.models import from_state_dict
    hf = tiny_hf_model("qwen3")
    sd = dict(hf.state_dict())
    cfg = DecoderConfig.from_hf(hf.config)
    name = "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(WeightError) as e:
        from_state_dict(cfg, {k: v for k, v in sd.items() if k != name})
    assert e.value.argument == name
    with pytest.raises(WeightError) as e:
        from_state_dict(cfg, {**sd, name: sd[name][:, :3]})
    assert e.value.argument == name
    with pytest.raises(InputError) as e:
        from_pretrained_dir(tmp_path)
    assert e.value.argument == "path"


# ---- sampling ----

def test_draws_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 256, generator=g).to(torch.bfloat16)
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=7)
              for t, k, p in [(1.0, 0, 1.0), (0.7, 20, 1.0), (1.3, 0, 0.8), (0.0, 0, 1.0), (0.9, 5, 0.5), (1.0, 1, 1.0)]]
    ids, steps = [3, 1, 4, 1, 5, 9], [0, 2, 7, 1, 8, 2]
    full, keep = sample_tokens(logits, params, ids, steps)
    for subset in ([5, 0], [2], [4, 3, 1]):
        part, keep_p = sample_tokens(logits[subset], [params[i] for i in subset], [ids[i] for i in subset],
                                     [steps[i] for i in subset])
        assert torch.equal(part, full[subset]) and torch.equal(keep_p, keep[subset])
    # top-k keeps k tokens (no ties in random logits); the greedy row takes the argmax
    assert int(keep[1].sum()) == 20 and int(keep[5].sum()) == 1
    assert int(full[3]) == int(torch.argmax(logits[3].float()))
    assert bool(keep[torch.arange(6), full].all())
    # top-p keeps the smallest prefix of the sorted probabilities that reaches p
    p = torch.softmax(logits[2].float() / 1.3, -1)
    kept = p[keep[2]].sum()
    assert kept >= 0.8 and kept - p[keep[2]].min() < 0.8
    again = sample_tokens(logits, params, ids, [s + 1 for s in steps])[0]
    assert not torch.equal(again, full)  # the step enters the draw


def test_keep_mask_cuts_by_rank_with_ties_to_the_lower_token_id():
    """keep_mask's rules, row by row: top-k keeps the k highest, ties at the cut going to the lower
    token id (a stable descending sort); top-p keeps the shortest prefix of that order whose mass
    before each kept token is below p; the most likely token is always kept; top_k 0 / top_p 1 keep
    everything and temperature 0 counts as 1."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0],  # a three-way tie at the top
                           [0.0, 2.0, 1.0, 2.0, 2.0]])
    expect_k2 = torch.tensor([[False, True, True, False, False],
                              [False, True, False, True, False]])
    assert torch.equal(keep_mask(logits, 1.0, 2, 1.0), expect_k2)
    assert bool(keep_mask(logits, 1.0, 0, 1.0).all())
    # top-p by the sorted mass: row 0's probabilities sorted are (a, a, a, b, c) with 3a + b + c = 1
    z = torch.softmax(logits[0], -1)
    a = float(z[1])
    for p, kept in ((a - 1e-4, 1), (a + 1e-4, 2), (2 * a + 1e-4, 3), (3 * a + 1e-4, 4)):
        row = keep_mask(logits[:1], 1.0, 0, p)[0]
        assert int(row.sum()) == kept and bool(row[1:1 + min(kept, 3)].all()), (p, row)
    # per-row arguments: at T 1 row 1's three tied tokens each hold 0.286 of the mass, so top-p 0.6 keeps
    # all three; at T 0.25 they hold 0.333 each and it keeps two
    both = logits[1:].expand(2, 5)
    per_row = keep_mask(both, torch.tensor([1.0, 0.25]), torch.tensor([0, 0]), torch.tensor([0.6, 0.6]))
    assert torch.equal(per_row, torch.tensor([[False, True, False, True, True], [False, True, False, True, False]]))
    assert torch.equal(keep_mask(logits, 1.0, torch.tensor([0, 2]), 1.0)[1], expect_k2[1])
    assert torch.equal(keep_mask(both, 0.0, 0, 0.6), per_row[:1].expand(2, 5))  # temperature 0 counts as 1
    top = torch.tensor([[False, True, False, False, False]] * 2)
    assert torch.equal(keep_mask(logits, 1.0, 0, 0.0), top)  # no mass at all: still the most likely token
    # exactly p before the second of two equal tokens: the first already reaches p
    assert torch.equal(keep_mask(torch.zeros(1, 2), 1.0, 0, 0.5), torch.tensor([[True, False]]))


def test_keep_mask_rows_do_not_depend_on_the_batch(device):
    """keep_mask row by row (the rollout masks the rows it samples, the trainer every token): a row's
    mask is the same bits alone and inside a larger batch, at an LLM vocab on the GPU, with the
    softmax and cumsum of top-p in play."""
    V = 151936 if device == "cuda" else 4099
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(48, V, generator=g).to(torch.bfloat16).to(device)
    T = torch.linspace(0.5, 1.5, 48)
    k = torch.tensor([0, 50] * 24)
    p = torch.linspace(0.5, 0.99, 48)
    full = keep_mask(logits, T.to(device), k.to(device), p.to(device))
    kept = full.sum(-1)
    assert int(kept.max()) < V and int(kept.min()) > 1  # every row cut, none to a single token
    for rows in ([0], [47, 5], list(range(7, 40, 3))):
        part = keep_mask(logits[rows], T[rows].to(device), k[rows].to(device), p[rows].to(device))
        assert torch.equal(part, full[rows]), rows


def test_engine_argument_errors(qwen3_bf16):
    with pytest.raises(InputError) as e:
        RolloutEngine(qwen3_bf16, page_size=3)
    assert e.value.argument == "page_size"
    eng = RolloutEngine(qwen3_bf16, max_num_seqs=1)
    with pytest.raises(InputError) as e:
        eng.add_request([1, 2], max_new_tokens=10_000)
    assert e.value.argument == "max_new_tokens"
    with pytest.raises(InputError) as e:
        SamplingParams(top_p=0.0)
    assert e.value.argument == "top_p"


# ---- the bitwise claims ----

def test_rollout_logp_is_training_logp_bitwise(qwen3_bf16):
    """Two engines that share nothing but the model and the seeds (other max_num_seqs, chunk sizes,
    page sizes and page orders, request order, an eos id) sample the same tokens with the same logp,
    and the trainer's logp of those tokens is bitwise the rollout's; so is every op's output row."""
    model = qwen3_bf16
    prompts = _prompts(3, 3, 6, seed=11)
    sp = [SamplingParams(temperature=0.9, seed=5), SamplingParams(temperature=0.9, top_k=40, seed=5),
          SamplingParams(temperature=0.9, seed=6)]
    new = [3, 2, 3]
    rec_a = KeyedRows()
    eng_a = RolloutEngine(model, max_num_seqs=2, chunk_size=2, page_seed=0)
    res_a = eng_a.generate(prompts, sp, max_new_tokens=new, record=rec_a)
    assert [len(r.tokens) for r in res_a] == new and all(r.finish_reason == "length" for r in res_a)

    # the other engine: requests in reverse order with the same ids, an eos taken from run A
    eos = res_a[0].tokens[1]
    eng_b = RolloutEngine(model, max_num_seqs=3, chunk_size=5, page_size=2 * eng_a.page_size, page_seed=123)
    order = [2, 0, 1]
    res_b = eng_b.generate([prompts[i] for i in order], [sp[i] for i in order], max_new_tokens=[new[i] for i in order],
                           eos_token_id=eos, request_ids=[res_a[i].request_id for i in order])
    for j, i in enumerate(order):
        a, b = res_a[i], res_b[j]
        n = a.tokens.index(eos) + 1 if eos in a.tokens else len(a.tokens)
        assert b.tokens == a.tokens[:n] and b.finish_reason == ("eos" if eos in a.tokens else "length")
        assert torch.equal(b.logp, a.logp[:n])
    assert eng_b.steps < eng_a.steps  # another batching: fewer, larger steps

    # the trainer, on one pack of all three in yet another order
    perm = [1, 2, 0]
    tokens, cu, rows = to_training_batch([res_a[i] for i in perm], device=DEVICE)
    rec_t = KeyedRows()
    logp = train_forward(model, tokens, cu, temperature=0.9, record=rec_t, seq_ids=[res_a[i].request_id for i in perm])
    assert torch.equal(logp[rows], torch.cat([res_a[i].logp for i in perm]).to(DEVICE))
    # op by op: every row the rollout computed is bitwise the trainer's row for (request, position)
    names = {k[0] for k in rec_a.rows}
    assert {"embed", "layers.0.q_rope", "layers.1.attn_out", "layers.1.attn_lse", "final_norm", "logp"} <= names
    compared = 0
    for key, row in rec_a.rows.items():
        if key in rec_t.rows:
            assert torch.equal(row, rec_t.rows[key].to(row.device)), key
            compared += 1
    # all but the rollout's logits rows (the trainer's raw mode has no [N, V] logits)
    assert compared == len([k for k in rec_a.rows if k[0] != "logits"]) > 500


def test_processed_logp_matches_training_llama_fp32():
    """Llama 3 (llama3 RoPE scaling, tied embeddings) in fp32, logp of the top-k / top-p renormalized
    distribution, with two-token prefill chunks: rollout == trainer, bitwise."""
    model = from_hf_model(tiny_hf_model("llama", seed=2), dtype=torch.float32, device=DEVICE)
    prompts = _prompts(3, 2, 4, seed=3)
    sp = SamplingParams(temperature=0.8, top_k=30, top_p=0.9, seed=1)
    res = RolloutEngine(model, max_num_seqs=2, chunk_size=2, logp_mode="processed", page_seed=4).generate(
        prompts, sp, max_new_tokens=[3, 2, 2])
    tokens, cu, rows = to_training_batch(res, device=DEVICE)
    logp = train_forward(model, tokens, cu, temperature=0.8, logp_mode="processed", top_k=30, top_p=0.9)
    assert torch.equal(logp[rows], torch.cat([r.logp for r in res]).to(DEVICE))
    raw = train_forward(model, tokens, cu, temperature=0.8)
    assert bool((logp[rows] >= raw[rows]).all())  # renormalizing over a subset raises the logp


def test_training_rows_do_not_depend_on_the_micro_batch(qwen3_bf16):
    """A sequence's logp and d hidden rows (embedding output, final norm) are bitwise the same in any
    micro-batch and position in it; parameter gradients are bitwise equal on repeat."""
    model = qwen3_bf16
    seqs = _prompts(3, 3, 6, seed=22)
    g = torch.Generator().manual_seed(4)
    weights = {i: 0.5 + torch.rand(len(s), generator=g) for i, s in enumerate(seqs)}  # every token counts

    def run(order):
        model.zero_grad(set_to_none=True)
        tokens, cu = _pack([seqs[i] for i in order], DEVICE)
        kept = {}

        def record(name, t, keys):
            if name in ("embed", "final_norm"):
                t.retain_grad()
                kept[name] = t
        logp = train_forward(model, tokens, cu, record=record, seq_ids=order)
        w = torch.cat([weights[i] for i in order]).to(DEVICE)
        (logp * w).sum().backward()
        out, start = {}, 0
        for i in order:
            n = len(seqs[i])
            out[i] = (logp[start:start + n].detach(), kept["embed"].grad[start:start + n],
                      kept["final_norm"].grad[start:start + n])
            start += n
        return out, {k: p.grad.clone() for k, p in model.named_parameters()}

    full, grads = run([0, 1, 2])
    part, _ = run([2, 0])
    for i in (0, 2):
        for a, b in zip(full[i], part[i]):
            assert torch.equal(a, b)
    _, grads_again = run([0, 1, 2])
    assert grads.keys() == grads_again.keys()
    assert all(torch.equal(grads[k], grads_again[k]) for k in grads)
    zero = [k for k, g in grads.items() if not bool(g.abs().sum() > 0)]
    assert not zero, zero


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_rollout_is_training_at_gpu_size(family):
    """GPU only: a larger model (hidden 1024, head_dim 128, 4 layers, vocab 32000), 24 prompts of
    up to 300 tokens, 8 running at once, chunks of 100, pages of 2 x block_n."""
    over = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    if family == "qwen3":
        over["head_dim"] = 128
    model = from_hf_model(tiny_hf_model(family, seed=0, **over), dtype=torch.bfloat16, device="cuda")
    prompts = _prompts(24, 20, 300, seed=1, V=32000)
    eng = RolloutEngine(model, max_num_seqs=8, chunk_size=100, page_seed=9)
    eng = RolloutEngine(model, max_num_seqs=8, chunk_size=100, page_size=2 * eng.page_size, page_seed=9)
    res = eng.generate(prompts, SamplingParams(temperature=1.0, top_p=0.95, seed=3),
                       max_new_tokens=[16 + (i % 5) * 8 for i in range(24)])
    tokens, cu, rows = to_training_batch(res, device="cuda")
    logp = train_forward(model, tokens, cu)
    assert torch.equal(logp[rows], torch.cat([r.logp for r in res]).cuda())
