"""Seeded sampling whose randomness does not depend on the batch, and the logp of what was sampled.

A draw for (seed, request_id, step) comes from its own torch.Generator (CPU, seeded from those three
numbers), so a request samples the same tokens whatever else runs in its batch, in whatever order,
on whichever step of the engine. Sampling is Gumbel-max over the processed logits:

    z = fp32(logits) / T;  top-k then top-p cut z (vLLM's order);  token = argmax(z_kept + g)
    g = -log(-log(u)), u ~ U[0, 1)^V fp32 from the request's generator

which draws exactly from softmax over the kept set. T = 0 is greedy (argmax of the logits).

logp modes (what the returned logp is the log-probability of; the trainer computes each one with
the same kernel on the same bits, rlk_triton.models.training):
  "raw"        log softmax((h W^T) / T) over the full vocab, by linear_logp on the token's final
               hidden state h (fp32 logits inside the kernel; the trainer's default path).
  "logits"     log softmax(logits / T) over the full vocab by selected_logp, on the model-dtype
               logits the draw used (the trainer's use_logits=True path).
  "processed"  log softmax over the top-k / top-p kept set of logits / T (renormalized), by
               selected_logp on the logits with the rest masked to -inf.
Greedy requests report their logp at T = 1.
The draw reads the model-dtype logits (as vLLM does); "raw" therefore scores the token under the
unrounded fp32 logits, which differ from the drawn-from ones by the logits' rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InputError

__all__ = ["SamplingParams", "keep_mask", "draw_seed", "sample_tokens", "LOGP_MODES"]

LOGP_MODES = ("raw", "logits", "processed")
_MASK = 0x7FFF_FFFF_FFFF_FFFF


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling: temperature (0 = greedy), top_k (0 = off), top_p (1 = off), seed."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise InputError("temperature", f"must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InputError("top_k", f"must be an int >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InputError("top_p", f"must be in (0, 1], got {p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InputError("seed", f"must be an int, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logp_temperature(self) -> float:
        return 1.0 if self.greedy else float(self.temperature)


def draw_seed(seed: int, request_id: int, step: int) -> int:
    """A 63-bit generator seed from (seed, request id, step): splitmix64 of the three, chained."""
    x = 0
    for v in (seed, request_id, step):
        x = (x ^ (int(v) & 0xFFFF_FFFF_FFFF_FFFF)) & 0xFFFF_FFFF_FFFF_FFFF
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFF_FFFF_FFFF_FFFF
        x = z ^ (z >> 31)
    return x & _MASK


def keep_mask(logits: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """bool [N, V]: the tokens top-k then top-p keep from softmax(fp32(logits) / T), row by row.

    temperature, top_k, top_p: a number or a per-row tensor [N] (top_k 0 = all, top_p 1 = all,
    temperature 0 treated as 1). The cut is by rank in a stable descending sort, so ties at the
    boundary resolve by token id; the most likely token is always kept. Each row's result depends on
    that row only (row-wise sort, softmax and cumsum), so the trainer and the rollout agree.
    """
    if logits.dim() != 2:
        raise InputError("logits", f"must be [N, V], got {tuple(logits.shape)}")
    N, V = logits.shape
    dev = logits.device

    def per_row(x, dtype):
        t = torch.as_tensor(x, dtype=dtype, device=dev)
        return t.expand(N).contiguous() if t.dim() == 0 else t

    T = per_row(temperature, torch.float32)
    T = torch.where(T == 0, torch.ones_like(T), T)
    k = per_row(top_k, torch.int64)
    k = torch.where(k <= 0, torch.full_like(k, V), k.clamp_max(V))
    p = per_row(top_p, torch.float32)
    with torch.no_grad():
        z = logits.float() / T[:, None]
        zs, idx = torch.sort(z, dim=-1, descending=True, stable=True)
        ranks = torch.arange(V, device=dev)
        keep_sorted = ranks[None, :] < k[:, None]
        if bool((p < 1).any()):
            zk = torch.where(keep_sorted, zs, torch.full_like(zs, float("-inf")))
            probs = torch.softmax(zk, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs
            keep_sorted &= (before < p[:, None]) | (p[:, None] >= 1)
        keep_sorted[:, 0] = True
        return torch.zeros_like(keep_sorted).scatter(1, idx, keep_sorted)


def sample_tokens(logits: torch.Tensor, params: list[SamplingParams], request_ids: list[int],
                  steps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [N], keep bool [N, V]): one draw per row from its own generator."""
    N, V = logits.shape
    T = [sp.temperature for sp in params]
    keep = keep_mask(logits, torch.tensor(T), torch.tensor([sp.top_k for sp in params]),
                     torch.tensor([sp.top_p for sp in params]))
    tokens = torch.empty(N, dtype=torch.int64, device=logits.device)
    with torch.no_grad():
        for r in range(N):
            sp = params[r]
            if sp.greedy:
                tokens[r] = torch.argmax(logits[r].float())
                continue
            g = torch.Generator(device="cpu").manual_seed(draw_seed(sp.seed, request_ids[r], steps[r]))
            u = torch.rand(V, generator=g, dtype=torch.float32).to(logits.device)
            gumbel = -torch.log(-torch.log(u))
            z = logits[r].float() / sp.temperature
            z = torch.where(keep[r], z, torch.full_like(z, float("-inf")))
            tokens[r] = torch.argmax(z + gumbel)
    return tokens, keep
