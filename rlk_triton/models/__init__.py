"""Decoder-only models (Qwen2 / Qwen3 / Llama 3) built only from rlk_triton operators (docs/models.md).

    from rlk_triton.models import from_hf_model, train_forward, RolloutEngine, SamplingParams
    model = from_hf_model(hf_model)                                    # or from_pretrained_dir(path)
    results = RolloutEngine(model, max_num_seqs=4, chunk_size=8).generate(prompts, SamplingParams(0.8))
    tokens, cu_seqlens, rows = to_training_batch(results)
    logp = train_forward(model, tokens, cu_seqlens, temperature=0.8)   # logp[rows] == rollout logp, bitwise
"""
from .config import FAMILIES, DecoderConfig, UnsupportedConfigError, WeightError
from .decoder import DecoderModel
from .rollout import KVCacheFullError, RolloutEngine, RolloutResult, to_training_batch
from .sampling import LOGP_MODES, SamplingParams, draw_seed, keep_mask
from .training import next_token_targets, score_logits, train_forward
from .weights import from_hf_model, from_pretrained_dir, from_state_dict

__all__ = [
    "DecoderConfig", "DecoderModel", "FAMILIES", "UnsupportedConfigError", "WeightError", "KVCacheFullError",
    "from_hf_model", "from_pretrained_dir", "from_state_dict",
    "train_forward", "next_token_targets", "score_logits",
    "RolloutEngine", "RolloutResult", "to_training_batch",
    "SamplingParams", "LOGP_MODES", "keep_mask", "draw_seed",
]
