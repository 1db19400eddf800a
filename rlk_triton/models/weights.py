"""Weights from a transformers model object or a local checkpoint directory. No network, ever.

    model = from_hf_model(hf_model)                       # Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM
    model = from_pretrained_dir("/ckpt", dtype=torch.bfloat16, device="cuda")

A directory holds config.json and model.safetensors, or shards listed in
model.safetensors.index.json. Tensors keep their stored dtype unless dtype= asks for another;
missing, unexpected or misshapen tensors raise WeightError naming the tensor.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Optional

import torch

from ..errors import DTypeError, InputError
from .config import DecoderConfig, WeightError
from .decoder import DecoderModel

__all__ = ["from_hf_model", "from_pretrained_dir", "from_state_dict"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _resolve_dtype(dtype, tensors: Mapping[str, torch.Tensor]) -> torch.dtype:
    if dtype is None:
        floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
        if len(floats) != 1:
            raise DTypeError("dtype", f"the checkpoint holds {sorted(map(str, floats))}: pass dtype=")
        dtype = floats.pop()
    if isinstance(dtype, str):
        dtype = _DTYPES.get(dtype.removeprefix("torch."), dtype)
    if dtype not in _DTYPES.values():
        raise DTypeError("dtype", f"{dtype} is not one of bfloat16, float16, float32")
    return dtype


def from_state_dict(config: DecoderConfig, tensors: Mapping[str, torch.Tensor], *, dtype=None, device=None,
                    max_positions: Optional[int] = None) -> DecoderModel:
    """A DecoderModel holding copies of `tensors` (transformers' names), cast to dtype if given."""
    dtype = _resolve_dtype(dtype, tensors)
    if device is None:
        device = next(iter(tensors.values())).device if tensors else "cpu"
    model = DecoderModel(config, dtype=dtype, device=device, max_positions=max_positions)
    own = dict(model.named_parameters())
    given = dict(tensors)
    if config.tie_word_embeddings:
        given.pop("lm_head.weight", None)  # the embedding matrix, stored or not
    missing = sorted(set(own) - set(given))
    unexpected = sorted(k for k in set(given) - set(own) if not k.endswith("rotary_emb.inv_freq"))
    if missing:
        raise WeightError(missing[0], f"missing from the checkpoint ({len(missing)} missing: {missing[:4]})")
    if unexpected:
        raise WeightError(unexpected[0], f"not used by a {config.model_type} model with this config "
                          f"({len(unexpected)} unexpected: {unexpected[:4]})")
    with torch.no_grad():
        for name, p in own.items():
            t = given[name]
            if tuple(t.shape) != tuple(p.shape):
                raise WeightError(name, f"shape {tuple(t.shape)}, the config needs {tuple(p.shape)}")
            p.copy_(t.to(device=p.device, dtype=dtype))
    return model


def from_hf_model(hf_model, *, dtype=None, device=None, max_positions: Optional[int] = None) -> DecoderModel:
    """From a transformers *ForCausalLM object: its config and its parameters (copied)."""
    if not hasattr(hf_model, "config") or not hasattr(hf_model, "state_dict"):
        raise InputError("hf_model", f"expected a transformers model, got {type(hf_model).__name__}")
    config = DecoderConfig.from_hf(hf_model.config)
    tensors = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return from_state_dict(config, tensors, dtype=dtype, device=device, max_positions=max_positions)


def from_pretrained_dir(path, *, dtype=None, device=None, max_positions: Optional[int] = None) -> DecoderModel:
    """From a local directory: config.json + model.safetensors (or shards + model.safetensors.index.json)."""
    from safetensors.torch import load_file

    root = Path(path)
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise InputError("path", f"{root} has no config.json")
    config = DecoderConfig.from_hf(json.loads(cfg_file.read_text()))
    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (root / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise InputError("path", f"{root} has neither model.safetensors nor model.safetensors.index.json")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        f = root / shard
        if not f.is_file():
            raise WeightError(shard, f"listed in the index but not in {root}")
        tensors.update(load_file(str(f)))
    if dtype is None and config.dtype is not None and len({t.dtype for t in tensors.values()}) != 1:
        dtype = config.dtype
    return from_state_dict(config, tensors, dtype=dtype, device=device, max_positions=max_positions)
