"""The embedded default of `rlk-triton drift`: a tiny Qwen3-shaped model with seeded random weights
and a seeded synthetic prompt set, plus loaders for a local checkpoint and a prompt file.

Nothing here downloads anything: a checkpoint is read with local_files_only=True.

- `tiny_config(preset)` / `tiny_model(seed, dtype, preset)`: "tiny" (2 layers, hidden 64, 4 q / 2 kv
  heads of 16, vocab 512: runs on CPU in a second) or "gpu" (4 layers, hidden 1024, heads 16 / 8 of 128,
  intermediate 3072, vocab 151936: Qwen3's real vocab and head shapes, for the GPU).
- `synthetic_prompts(seed, vocab_size)`: 8 prompts of token ids, lengths 3..17 (every other length,
  shuffled), so a batch is ragged and left padding is exercised.
- `load_model(path, dtype)`, `load_prompts(file, tokenizer_dir)`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import DTypeError, InputError

PRESETS = {
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=512),
    "gpu": dict(num_hidden_layers=4, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                head_dim=128, intermediate_size=3072, vocab_size=151936),
}
# Standard deviation of the random LM head. The default init (0.02) gives logits of std ~0.02 * sqrt(H)
# after the final RMSNorm: a near-uniform distribution where every token's logp is ~ -log V and a
# drift of the logits hardly moves it. A logit std of a few units looks like a trained model's.
LM_HEAD_LOGIT_STD = 3.0
INIT_RANGE = 0.08  # the other weights: large enough that attention and the MLP are not near-identity
PAD_ID = 0  # the tiny models' pad id; prompts never contain it
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype, argument: str = "dtype") -> torch.dtype:
    """torch.dtype from a dtype or its name ('bfloat16', 'bf16', 'float32', 'fp32', 'float16')."""
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise DTypeError(argument, f"must be one of {sorted(set(_DTYPES))}, got {dtype!r}")


def tiny_config(preset: str = "tiny"):
    """A transformers Qwen3Config of the preset ('tiny' or 'gpu'); no EOS, so every rollout runs to
    max_new_tokens and the token counts are fixed."""
    from transformers import Qwen3Config

    if preset not in PRESETS:
        raise InputError("preset", f"must be one of {sorted(PRESETS)}, got {preset!r}")
    return Qwen3Config(**PRESETS[preset], tie_word_embeddings=False, max_position_embeddings=4096,
                       initializer_range=INIT_RANGE, rms_norm_eps=1e-6, pad_token_id=PAD_ID,
                       bos_token_id=None, eos_token_id=None)


def tiny_model(seed: int = 0, dtype="bfloat16", preset: str = "tiny", device="cpu"):
    """Qwen3ForCausalLM of the preset with random weights from `seed` (same seed, same bits on any
    machine: initialized in float32 on the CPU, then cast and moved), in eval mode."""
    from transformers import Qwen3ForCausalLM

    dtype = resolve_dtype(dtype)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError("seed", f"must be an int, got {seed!r}")
    config = tiny_config(preset)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
        with torch.no_grad():
            # RMSNorm weights init to 1; give the norms some per-channel spread so they do real work.
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
            model.lm_head.weight.normal_(0.0, LM_HEAD_LOGIT_STD / config.hidden_size ** 0.5)
    return model.to(device=device, dtype=dtype).eval()


def synthetic_prompts(seed: int = 0, vocab_size: int = 512, n: int = 8, min_len: int = 3,
                      max_len: int = 17) -> list[list[int]]:
    """`n` prompts of token ids in [1, vocab_size) (0 is the pad id), lengths spread over
    [min_len, max_len] and shuffled, from a seeded generator."""
    if n < 1:
        raise InputError("n", f"must be >= 1, got {n}")
    if not 1 <= min_len <= max_len:
        raise InputError("min_len", f"needs 1 <= min_len <= max_len, got {min_len}, {max_len}")
    if vocab_size < 2:
        raise InputError("vocab_size", f"must be >= 2, got {vocab_size}")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(min_len, max_len, n).round().long()
    lengths = lengths[torch.randperm(n, generator=gen)]
    return [torch.randint(1, vocab_size, (int(L),), generator=gen).tolist() for L in lengths]


def load_model(path, dtype="bfloat16", device="cpu"):
    """A local Hugging Face checkpoint directory, never the hub (local_files_only=True), in eval mode."""
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype)
    p = Path(path)
    if not p.is_dir():
        raise InputError("model", f"{path} is not a local checkpoint directory")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as e:
        raise InputError("model", f"cannot load a causal LM from {path}: {e}") from e
    return model.to(device).eval()


def load_prompts(file, tokenizer_dir=None) -> list[list[int]]:
    """Prompts from a jsonl file, one object a line: {"ids": [int, ...]} or {"text": "..."}; text is
    tokenized with AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True) (no special
    tokens added: the file says exactly what the model sees)."""
    p = Path(file)
    if not p.is_file():
        raise InputError("prompts", f"{file} is not a file")
    tokenizer, prompts = None, []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError("prompts", f"{file}:{lineno}: not JSON ({e})") from e
        if isinstance(obj, dict) and "ids" in obj:
            ids = obj["ids"]
            if not (isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool)
                                                          and i >= 0 for i in ids)):
                raise InputError("prompts", f"{file}:{lineno}: 'ids' must be a non-empty list of ints >= 0")
        elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
            if tokenizer is None:
                if tokenizer_dir is None:
                    raise InputError("prompts", f"{file}:{lineno}: a 'text' prompt needs --model (its tokenizer)")
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
            ids = tokenizer(obj["text"], add_special_tokens=False)["input_ids"]
            if not ids:
                raise InputError("prompts", f"{file}:{lineno}: the text tokenizes to nothing")
        else:
            raise InputError("prompts", f"{file}:{lineno}: expected {{\"ids\": [...]}} or {{\"text\": \"...\"}}")
        prompts.append(list(ids))
    if not prompts:
        raise InputError("prompts", f"{file} holds no prompts")
    return prompts
