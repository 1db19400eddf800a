"""scripts/gpu_attention_split.py's stock packed-varlen baseline: torch.nn.attention.varlen.varlen_attn's
arguments changed between torch releases, and the GPU run must call whichever this torch has, causal,
with the library's scale and GQA (the call itself needs CUDA: only the adaptation is checked here)."""
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_attention_split as script  # noqa: E402

Q, K = torch.zeros(10, 4, 16), torch.zeros(10, 2, 16)
CU = torch.tensor([0, 4, 10], dtype=torch.int32)
SEEN = []


def varlen_2_9(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    SEEN.append(dict(locals()))
    return query


def varlen_later(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                 window_size=(-1, -1), enable_gqa=False):
    SEEN.append(dict(locals()))
    return query


def varlen_no_causal(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
    return query


@pytest.fixture
def install(monkeypatch):
    """Put a torch.nn.attention.varlen with the given varlen_attn in place (calls recorded in SEEN)."""
    SEEN.clear()

    def put(fn):
        module = types.ModuleType("torch.nn.attention.varlen")
        module.varlen_attn = fn
        monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", module)
    return put


def test_torch_2_9_signature_is_causal_and_expands_kv(install):
    install(varlen_2_9)
    call, how = script.stock_varlen(Q, K, K, CU, 6, 16 ** -0.5)
    assert call is not None and "expanded" in how
    call(Q, K, K)
    assert SEEN[0]["is_causal"] is True and SEEN[0]["key"].shape[1] == Q.shape[1] and SEEN[0]["max_q"] == 6


def test_later_signature_uses_the_window_scale_and_gqa(install):
    install(varlen_later)
    call, how = script.stock_varlen(Q, K, K, CU, 6, 0.3)
    call(Q, K, K)
    got = SEEN[0]
    assert got["window_size"] == (-1, 0) and got["scale"] == 0.3 and got["enable_gqa"] is True
    assert got["key"].shape[1] == K.shape[1]  # not expanded


@pytest.mark.parametrize("fn, why", [(varlen_no_causal, "no causal"), (varlen_2_9, "scale")])
def test_refuses_what_it_cannot_ask_for(install, fn, why):
    install(fn)
    call, how = script.stock_varlen(Q, K, K, CU, 6, 0.3)  # 0.3 is not 1/sqrt(16): 2.9's call has no scale
    assert call is None and why in how


def test_this_torch_has_a_usable_call():
    call, how = script.stock_varlen(Q, K, K, CU, 6, 16 ** -0.5)
    assert call is not None, how
