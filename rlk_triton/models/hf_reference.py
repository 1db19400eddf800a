"""transformers' own logp of a packed batch, for accuracy comparisons (tests, measurements).

Each sequence runs alone through the *ForCausalLM (no padding, no mask approximations); the
logits are upcast to float64 before log_softmax so that the logp's error is the model's arithmetic
in the dtype asked for, not the softmax's.
"""
from __future__ import annotations

import copy

import torch

__all__ = ["hf_packed_logp", "hf_model_in"]


def hf_model_in(hf_model, dtype: torch.dtype, weights_dtype: torch.dtype | None = None):
    """A copy of hf_model computing in dtype, with its weights first rounded to weights_dtype.

    hf_model_in(m, torch.float64, torch.bfloat16) is the float64 ground truth for a bf16 run: the
    same (bf16) weights, upcast exactly."""
    m = copy.deepcopy(hf_model)
    if weights_dtype is not None:
        m = m.to(weights_dtype)
    return m.to(dtype).eval()


@torch.no_grad()
def hf_packed_logp(hf_model, tokens: torch.Tensor, cu_seqlens: torch.Tensor, temperature: float = 1.0,
                   ignore_index: int = -100) -> torch.Tensor:
    """float64 [N]: log softmax(logits / T)[next token] per token, 0 at each sequence's last token."""
    out = torch.zeros(tokens.shape[0], dtype=torch.float64)
    cu = cu_seqlens.tolist()
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        if b - a < 2:
            continue
        x = tokens[a:b].long()[None].to(next(hf_model.parameters()).device)
        logits = hf_model(input_ids=x).logits[0].double() / temperature
        lp = torch.log_softmax(logits, dim=-1)
        out[a:b - 1] = lp[:-1].gather(1, x[0, 1:, None])[:, 0].cpu()
    return out
