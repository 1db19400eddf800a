"""Tiny transformers models with random weights from a fixed seed, for tests and probes (no download).

    hf = tiny_hf_model("qwen3", seed=0)          # Qwen3ForCausalLM, hidden 64, 2 layers, GQA 2:1
    hf = tiny_hf_model("llama", seed=0)          # LlamaForCausalLM, llama3 RoPE scaling, tied embeddings

Sizes are chosen for the Triton interpreter (about 1 ms per program-iteration): head_dim 32 (the
attention kernel needs a power of two >= 16), 2 q heads over 1 kv head, vocab 256.
"""
from __future__ import annotations

import torch

__all__ = ["tiny_hf_config", "tiny_hf_model"]


def tiny_hf_config(family: str = "qwen3", **overrides):
    """A transformers config of the family ("qwen3", "qwen2", "llama") at test size."""
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-6,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None)
    if family == "qwen3":
        from transformers import Qwen3Config
        return Qwen3Config(**{**common, "head_dim": 32, **overrides})
    if family == "qwen2":
        from transformers import Qwen2Config
        return Qwen2Config(**{**common, **overrides})
    if family == "llama":
        from transformers import LlamaConfig
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        return LlamaConfig(**{**common, "rope_parameters": rope, "tie_word_embeddings": True, **overrides})
    raise ValueError(f"unknown family {family!r}")


def tiny_hf_model(family: str = "qwen3", seed: int = 0, **overrides):
    """The family's *ForCausalLM in fp32, eval mode, weights from torch.manual_seed(seed).

    Biases and norm weights are randomized too (transformers initializes them to 0 / 1), so that a
    runner that skipped one would be caught."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_hf_config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:  # a larger init than 0.02 so that logits are not flat
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model
