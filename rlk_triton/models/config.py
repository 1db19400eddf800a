"""The decoder config: what a Qwen2 / Qwen3 / Llama checkpoint means to the runner.

`DecoderConfig.from_hf(cfg)` reads a transformers config object (Qwen3Config, Qwen2Config,
LlamaConfig) or a config.json dict and keeps only the fields the runner computes with. Anything the
runner would compute differently from transformers (MoE, a sliding window in use, another
activation, a head_dim the projections do not fit, a length-dependent RoPE) raises
UnsupportedConfigError naming the field: a silent approximation would break the claim that the
runner is the same function as the checkpoint's own implementation.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import InputError

__all__ = ["DecoderConfig", "UnsupportedConfigError", "WeightError", "FAMILIES"]


class UnsupportedConfigError(InputError):
    """A model config asks for something the runner does not implement; ``argument`` names the field."""


class WeightError(InputError):
    """A checkpoint's tensors do not fit the config (missing, unexpected, wrong shape); names the tensor."""


# model_type -> what the family computes differently. Qwen2 always has q/k/v bias (and no o bias);
# Qwen3 has per-head RMSNorm of q and k before RoPE and attention_bias for q/k/v/o; Llama has
# attention_bias for q/k/v/o and mlp_bias.
FAMILIES = {
    "qwen2": dict(qk_norm=False, qkv_bias_field=None, qkv_bias_default=True, o_bias_field=None),
    "qwen3": dict(qk_norm=True, qkv_bias_field="attention_bias", qkv_bias_default=False, o_bias_field="attention_bias"),
    "llama": dict(qk_norm=False, qkv_bias_field="attention_bias", qkv_bias_default=False, o_bias_field="attention_bias"),
}

_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class DecoderConfig:
    """The fields a dense decoder-only Qwen2 / Qwen3 / Llama model computes with.

    rope_scaling is None or a dict that rlk_triton.ops.rope.rope_inv_freq understands
    ({"type": "linear" | "llama3", ...}).
    """
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    eos_token_id: tuple = field(default_factory=tuple)
    dtype: Optional[str] = None          # the checkpoint's dtype name ("bfloat16"...), if it says

    @classmethod
    def from_hf(cls, cfg: Any) -> "DecoderConfig":
        """From a transformers PretrainedConfig or a config.json dict. Raises UnsupportedConfigError."""
        d = cfg if isinstance(cfg, dict) else cfg.to_dict()
        if not isinstance(d, dict):
            raise UnsupportedConfigError("config", f"expected a transformers config or a dict, got {type(cfg).__name__}")
        d = dict(d)
        if isinstance(d.get("text_config"), dict) and "model_type" not in d:
            d = dict(d["text_config"])
        mt = d.get("model_type")
        if mt not in FAMILIES:
            raise UnsupportedConfigError("model_type", f"{mt!r} is not one of {sorted(FAMILIES)} (dense Qwen2 / "
                                         "Qwen3 / Llama only)")
        fam = FAMILIES[mt]

        def need_int(name, minimum=1):
            v = d.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise UnsupportedConfigError(name, f"must be an int >= {minimum}, got {v!r}")
            return v

        for moe in ("num_experts", "num_local_experts", "n_routed_experts"):
            v = d.get(moe)
            if v not in (None, 0, 1) and not (isinstance(v, int) and v <= 1):
                raise UnsupportedConfigError(moe, f"{v}: mixture-of-experts layers are not supported")
        act = d.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise UnsupportedConfigError("hidden_act", f"{act!r}: only silu (SwiGLU) is supported")
        if d.get("use_sliding_window"):
            raise UnsupportedConfigError("use_sliding_window", "sliding-window attention is not supported")
        layer_types = d.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise UnsupportedConfigError("layer_types", f"{sorted(set(layer_types))}: only full_attention layers "
                                         "are supported (sliding_window in use)")
        if d.get("pretraining_tp", 1) not in (None, 1):
            raise UnsupportedConfigError("pretraining_tp", "must be 1")
        if d.get("attention_dropout", 0.0) not in (None, 0, 0.0):
            # dropout would make training differ from rollout by design
            raise UnsupportedConfigError("attention_dropout", f"{d['attention_dropout']}: must be 0")

        H = need_int("hidden_size")
        heads = need_int("num_attention_heads")
        kv = d.get("num_key_value_heads") or heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or heads % kv:
            raise UnsupportedConfigError("num_key_value_heads", f"{kv} must divide num_attention_heads {heads}")
        head_dim = d.get("head_dim") or H // heads
        if mt != "qwen3" and d.get("head_dim") is None and H % heads:
            raise UnsupportedConfigError("head_dim", f"hidden_size {H} is not a multiple of {heads} heads")
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 16 or head_dim > 256 \
                or head_dim & (head_dim - 1):
            raise UnsupportedConfigError("head_dim", f"{head_dim}: the attention kernel needs a power of two in "
                                         "[16, 256]")
        if d.get("partial_rotary_factor", 1.0) not in (None, 1, 1.0):
            raise UnsupportedConfigError("partial_rotary_factor", "partial rotary embeddings are not supported")

        theta, scaling = _rope(d)
        eos = d.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        qkv_bias = bool(d.get(fam["qkv_bias_field"], fam["qkv_bias_default"])) if fam["qkv_bias_field"] \
            else fam["qkv_bias_default"]
        o_bias = bool(d.get(fam["o_bias_field"], False)) if fam["o_bias_field"] else False
        mlp_bias = bool(d.get("mlp_bias", False)) if mt == "llama" else False
        dtype = d.get("dtype") or d.get("torch_dtype")
        return cls(
            model_type=mt, vocab_size=need_int("vocab_size"), hidden_size=H,
            intermediate_size=need_int("intermediate_size"), num_layers=need_int("num_hidden_layers"),
            num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=need_int("max_position_embeddings") if "max_position_embeddings" in d else 4096,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), qk_norm=fam["qk_norm"],
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, eos_token_id=eos,
            dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
        )

    def replace(self, **kw) -> "DecoderConfig":
        return dataclasses.replace(self, **kw)


def _rope(d: dict) -> tuple[float, Optional[dict]]:
    """(rope_theta, scaling dict for rope_inv_freq) from transformers 5's rope_parameters or the
    older rope_theta + rope_scaling fields of a config.json."""
    params = d.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        kinds = {tuple(sorted(v.items())) for v in params.values()}
        if len(kinds) != 1:
            raise UnsupportedConfigError("rope_parameters", "per-layer-type RoPE parameters are not supported")
        params = next(iter(params.values()))
    if not params:
        params = dict(d.get("rope_scaling") or {})
        params.setdefault("rope_theta", d.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in _ROPE_TYPES:
        raise UnsupportedConfigError("rope_parameters", f"rope_type {kind!r} is not supported (supported: "
                                     f"{', '.join(_ROPE_TYPES)}; dynamic / YaRN / longrope depend on the length)")
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise UnsupportedConfigError("rope_theta", f"must be a number > 0, got {theta!r}")
    if kind == "default":
        return float(theta), None
    if params.get("attention_factor") not in (None, 1, 1.0):
        raise UnsupportedConfigError("rope_parameters", "attention_factor != 1 is not supported")
    keys = {"linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}[kind]
    missing = [k for k in keys if k not in params]
    if missing:
        raise UnsupportedConfigError("rope_parameters", f"{kind} scaling lacks {missing}")
    return float(theta), {"type": kind, **{k: params[k] for k in keys}}
