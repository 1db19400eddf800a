"""rlk_triton.models computes transformers' function: judged by contracts/models.yaml.

ref64 = transformers in float64 on the same dtype-rounded weights; the bound scales with
transformers' own error in the same dtype (max over the scored tokens of |hf_dtype - ref64|), so
the row says "within rtol times what transformers itself gets in this precision".
"""
import pytest
import torch

from rlk_triton import contracts
from rlk_triton.models import from_hf_model, train_forward
from rlk_triton.models.hf_reference import hf_model_in, hf_packed_logp
from rlk_triton.models.tiny import tiny_hf_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _batch(lens, seed=5):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    tokens = torch.randint(0, 256, (sum(lens),), generator=g)
    scored = torch.ones(sum(lens), dtype=torch.bool)
    scored[cu[1:].long() - 1] = False
    return tokens, cu, scored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_logp_within_contract_of_transformers(family, dtype):
    hf = tiny_hf_model(family, seed=0)
    tokens, cu, scored = _batch([7, 11, 5])
    ours = train_forward(from_hf_model(hf, dtype=dtype, device=DEVICE), tokens, cu, temperature=0.8)
    ours = ours.detach().cpu().double()
    ref = hf_packed_logp(hf_model_in(hf, torch.float64, dtype), tokens, cu, temperature=0.8)
    same_dtype = hf_packed_logp(hf_model_in(hf, dtype), tokens, cu, temperature=0.8)
    baseline = (same_dtype - ref)[scored].abs().max().item()
    assert baseline > 0
    bound = contracts.judgment("models", dtype, "forward_accuracy")["outputs"]["logp"]
    ratio = contracts.scaled_abs_ratio(ours[scored].numpy(), ref[scored].numpy(), baseline, bound)
    assert ratio <= 1.0, (ratio, (ours - ref)[scored].abs().max().item(), baseline)
    assert bool((ours[~scored] == 0).all())


def _hf_grads(m, tokens, cu):
    m.zero_grad()
    total = 0
    c = cu.tolist()
    for s in range(len(c) - 1):
        x = tokens[c[s]:c[s + 1]][None]
        lp = torch.log_softmax(m(input_ids=x).logits[0].double(), -1)[:-1].gather(1, x[0, 1:, None])
        total = total + lp.sum()
    total.backward()
    return {n: p.grad.double() for n, p in m.named_parameters()}


@pytest.mark.parametrize("family,dtype", [
    ("qwen3", torch.bfloat16),
    pytest.param("qwen3", torch.float32, marks=pytest.mark.slow),
    pytest.param("llama", torch.bfloat16, marks=pytest.mark.slow),
    pytest.param("llama", torch.float32, marks=pytest.mark.slow),
], ids=["qwen3-bf16", "qwen3-fp32", "llama-bf16", "llama-fp32"])
def test_parameter_gradients_within_contract_of_transformers(family, dtype):
    hf = tiny_hf_model(family, seed=0)
    tokens, cu, _ = _batch([4, 6, 5], seed=6)
    model = from_hf_model(hf, dtype=dtype, device=DEVICE)
    train_forward(model, tokens, cu).sum().backward()
    ref = _hf_grads(hf_model_in(hf, torch.float64, dtype), tokens, cu)
    same_dtype = _hf_grads(hf_model_in(hf, dtype), tokens, cu)
    bound = contracts.judgment("models", dtype, "gradient_accuracy")
    for name, p in model.named_parameters():
        sens = (same_dtype[name] - ref[name]).abs().max().item()
        ratio = contracts.rounding_plus_sensitivity_ratio(p.grad.cpu().double().numpy(), ref[name].numpy(),
                                                          sens, bound)
        assert ratio <= 1.0, (name, ratio)
