"""A dense decoder-only transformer (Qwen2 / Qwen3 / Llama) built only from rlk_triton operators.

The shape follows vLLM's model executor: shared layers (this file), one model class for the
families that differ only in config (qk-norm, biases, RoPE scaling, tied LM head). Parameter names
are transformers' own ("model.layers.0.self_attn.q_proj.weight"), so a checkpoint's state dict
loads without a name map.

One forward, two callers. `forward_packed` runs the layers over a packed batch of tokens with an
attention callback: the trainer's (varlen causal attention over whole sequences) or the rollout
engine's (write k / v into the paged cache, attention_decode). Every other op is row-wise and
batch-invariant (matmul rows, RMSNorm rows, RoPE per (token, head), SwiGLU elementwise, embedding a
gather), and attention_decode gives bitwise the training attention's rows, so a token's final
hidden state is the same bits on both paths, whatever else is in the batch.

Per layer (vLLM's residual pattern; rms_norm's fused residual add, one rounding to the model dtype):
    x, residual = rms_norm(prev_mlp, input_layernorm, residual=residual)   (layer 0: rms_norm(embed))
    q, k, v = matmul(x, Wq.t(), bq), ...;  Qwen3: q, k = rms_norm per head (q_norm, k_norm)
    q, k = apply_rope(q, k, cos, sin, position_ids)
    attn, lse = attend(layer, q, k, v)
    o = matmul(attn, Wo.t(), bo)
    x, residual = rms_norm(o, post_attention_layernorm, residual=residual)
    mlp = matmul(swiglu(matmul(x, Wg.t()), matmul(x, Wu.t())), Wd.t())
final: h, _ = rms_norm(mlp, norm, residual=residual)
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from ..errors import DTypeError, ShapeError
from ..ops.embedding import embedding
from ..ops.matmul import matmul
from ..ops.rmsnorm import rms_norm
from ..ops.rope import apply_rope, rope_tables
from ..ops.swiglu import swiglu
from .config import DecoderConfig

__all__ = ["DecoderModel", "Attend", "Record"]

# attend(layer_index, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> (out [N, Hq, D], lse [Hq, N])
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], tuple]
# record(name, tensor): tensor's rows are the packed tokens of the call
Record = Callable[[str, torch.Tensor], None]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class _Linear(nn.Module):
    """Holds a [out, in] weight (+ bias) under transformers' names; computed with rlk matmul."""

    def __init__(self, n_in, n_out, bias, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=dtype, device=device)) if bias else None

    def __call__(self, x):  # not nn.Module.__call__: no hooks, just the batch-invariant matmul
        return matmul(x, self.weight.t(), self.bias)


class _Norm(nn.Module):
    def __init__(self, n, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, dtype=dtype, device=device))


class _Embedding(nn.Module):
    def __init__(self, V, H, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(V, H, dtype=dtype, device=device))


class _Attention(nn.Module):
    def __init__(self, c: DecoderConfig, dtype, device):
        super().__init__()
        H, D = c.hidden_size, c.head_dim
        self.q_proj = _Linear(H, c.num_heads * D, c.qkv_bias, dtype, device)
        self.k_proj = _Linear(H, c.num_kv_heads * D, c.qkv_bias, dtype, device)
        self.v_proj = _Linear(H, c.num_kv_heads * D, c.qkv_bias, dtype, device)
        self.o_proj = _Linear(c.num_heads * D, H, c.o_bias, dtype, device)
        if c.qk_norm:
            self.q_norm = _Norm(D, dtype, device)
            self.k_norm = _Norm(D, dtype, device)


class _MLP(nn.Module):
    def __init__(self, c: DecoderConfig, dtype, device):
        super().__init__()
        self.gate_proj = _Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, dtype, device)
        self.up_proj = _Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, dtype, device)
        self.down_proj = _Linear(c.intermediate_size, c.hidden_size, c.mlp_bias, dtype, device)


class _Layer(nn.Module):
    def __init__(self, c: DecoderConfig, dtype, device):
        super().__init__()
        self.input_layernorm = _Norm(c.hidden_size, dtype, device)
        self.self_attn = _Attention(c, dtype, device)
        self.post_attention_layernorm = _Norm(c.hidden_size, dtype, device)
        self.mlp = _MLP(c, dtype, device)


class _Body(nn.Module):
    def __init__(self, c: DecoderConfig, dtype, device):
        super().__init__()
        self.embed_tokens = _Embedding(c.vocab_size, c.hidden_size, dtype, device)
        self.layers = nn.ModuleList(_Layer(c, dtype, device) for _ in range(c.num_layers))
        self.norm = _Norm(c.hidden_size, dtype, device)


class DecoderModel(nn.Module):
    """Parameters (torch.nn.Parameter, transformers' names) and the packed forward.

    Build with rlk_triton.models.from_hf_model / from_pretrained_dir (weights.py), or
    DecoderModel(config, dtype=..., device=...) and load_state_dict. max_positions sizes the RoPE
    tables (default: config.max_position_embeddings).
    """

    def __init__(self, config: DecoderConfig, *, dtype: torch.dtype = torch.bfloat16, device="cpu",
                 max_positions: Optional[int] = None):
        super().__init__()
        if dtype not in _DTYPES:
            raise DTypeError("dtype", f"{dtype} is not one of bfloat16, float16, float32")
        self.config = config
        self.dtype = dtype
        self.model = _Body(config, dtype, device)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = _Linear(config.hidden_size, config.vocab_size, False, dtype, device)
        P = int(max_positions or config.max_position_embeddings)
        cos, sin = rope_tables(P, config.head_dim, base=config.rope_theta, scaling=config.rope_scaling,
                               device=device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V, H]: the LM head (the embedding matrix itself when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def max_positions(self) -> int:
        return self.rope_cos.shape[0]

    def forward_packed(self, token_ids: torch.Tensor, position_ids: torch.Tensor, attend: Attend,
                       record: Optional[Record] = None) -> torch.Tensor:
        """The final (normed) hidden states [N, H] of N packed tokens, in the model dtype.

        attend does the attention of each layer (training: varlen over cu_seqlens; rollout: the paged
        cache). record(name, tensor), if given, sees every op's output with one row per token:
        "embed", "layers.{i}.input_norm", ".q_proj", ".k_proj" (raw projections, Qwen3 only), ".q",
        ".k", ".v" ([N, heads, D]; q / k after q_norm / k_norm for Qwen3), ".q_rope", ".k_rope",
        ".attn_out" ([N, Hq, D]), ".attn_lse" ([N, Hq]), ".o_proj", ".residual_attn" (the residual
        stream after the attention add), ".post_norm", ".gate", ".up", ".act", ".mlp", ".out" (the
        residual stream after layer i; recorded by the next norm, which computes it), then
        "final_norm". These are rlk_triton.probe's op names (a probe.Recording is a valid keyed
        record callback). The tensors are the live autograd values (call retain_grad to see their
        gradient rows).
        """
        c = self.config
        if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 1:
            raise ShapeError("token_ids", "must be a 1-D tensor of packed token ids")
        if not isinstance(position_ids, torch.Tensor) or tuple(position_ids.shape) != tuple(token_ids.shape):
            raise ShapeError("position_ids", f"must have token_ids' shape {tuple(token_ids.shape)}")
        rec = record if record is not None else (lambda name, t: None)
        N = token_ids.shape[0]
        x = embedding(token_ids, self.model.embed_tokens.weight)
        rec("embed", x)
        residual = None
        mlp_out = x
        for i, layer in enumerate(self.model.layers):
            p = f"layers.{i}."
            if residual is None:
                residual = x
                h = rms_norm(x, layer.input_layernorm.weight, eps=c.rms_norm_eps)
            else:
                h, residual = rms_norm(mlp_out, layer.input_layernorm.weight, eps=c.rms_norm_eps, residual=residual)
                rec(f"layers.{i - 1}.out", residual)
            rec(p + "input_norm", h)
            a = layer.self_attn
            q = a.q_proj(h).view(N, c.num_heads, c.head_dim)
            k = a.k_proj(h).view(N, c.num_kv_heads, c.head_dim)
            v = a.v_proj(h).view(N, c.num_kv_heads, c.head_dim)
            if c.qk_norm:
                rec(p + "q_proj", q)
                rec(p + "k_proj", k)
                q = rms_norm(q, a.q_norm.weight, eps=c.rms_norm_eps)
                k = rms_norm(k, a.k_norm.weight, eps=c.rms_norm_eps)
            rec(p + "q", q)
            rec(p + "k", k)
            rec(p + "v", v)
            q, k = apply_rope(q, k, self.rope_cos, self.rope_sin, position_ids, validate=False)
            rec(p + "q_rope", q)
            rec(p + "k_rope", k)
            out, lse = attend(i, q, k, v)
            rec(p + "attn_out", out)
            rec(p + "attn_lse", lse.t())
            o = a.o_proj(out.reshape(N, c.num_heads * c.head_dim))
            rec(p + "o_proj", o)
            h, residual = rms_norm(o, layer.post_attention_layernorm.weight, eps=c.rms_norm_eps, residual=residual)
            rec(p + "residual_attn", residual)
            rec(p + "post_norm", h)
            m = layer.mlp
            gate, up = m.gate_proj(h), m.up_proj(h)
            rec(p + "gate", gate)
            rec(p + "up", up)
            act = swiglu(gate, up)
            rec(p + "act", act)
            mlp_out = m.down_proj(act)
            rec(p + "mlp", mlp_out)
        if residual is None:  # no layers
            final = rms_norm(x, self.model.norm.weight, eps=c.rms_norm_eps)
        else:
            final, residual = rms_norm(mlp_out, self.model.norm.weight, eps=c.rms_norm_eps, residual=residual)
            rec(f"layers.{c.num_layers - 1}.out", residual)
        rec("final_norm", final)
        return final

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] @ lm_head.T in the model dtype (fp32 accumulation, batch-invariant rows)."""
        return matmul(hidden, self.lm_head_weight.t())
