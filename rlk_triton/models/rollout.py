"""The rollout path: a paged KV cache, chunked prefill, continuous batching and seeded sampling.

    engine = RolloutEngine(model, max_num_seqs=4, chunk_size=8, page_seed=0)
    results = engine.generate(prompts, SamplingParams(temperature=0.8, top_p=0.9, seed=1),
                              max_new_tokens=16)
    tokens, cu_seqlens, rows = to_training_batch(results)     # the trainer's batch for the same tokens
    # train_forward(model, tokens, cu_seqlens, temperature=0.8)[rows] == cat(r.logp)  (bitwise)

Each engine step packs, for every running request, its next min(chunk_size, uncached) tokens (a
prefill chunk, or the one token sampled last step), writes their k / v into the request's pages and
runs attention_decode over the cache. A request whose tokens are all cached after the step samples
its next token from its last row. Requests join when a slot and their worst-case pages are free and
leave at their eos or max_new_tokens, so the batch changes from step to step.

Why a token's logp is bitwise the trainer's: every op of decoder.forward_packed is row-wise
batch-invariant and attention_decode is bitwise the training attention for any page layout (pages
come from a seeded shuffle) and any chunking; the logp itself is computed by the same kernel on the
same final hidden row (linear_logp for "raw"; selected_logp on the same logits rows otherwise),
called with the same Python-scalar temperature (rows are grouped by their sampling parameters).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch

from .. import configs
from .._runtime import arch_of
from ..attention import attention_decode
from ..errors import InputError, LayoutError, ShapeError
from ..logp import linear_logp
from .decoder import DecoderModel
from .sampling import LOGP_MODES, SamplingParams, sample_tokens
from .training import score_logits

__all__ = ["RolloutEngine", "RolloutResult", "to_training_batch", "KVCacheFullError"]


class KVCacheFullError(InputError):
    """A request can never fit the cache (its worst-case pages exceed num_pages)."""


@dataclass
class RolloutResult:
    request_id: int
    prompt: list
    tokens: list                      # the sampled tokens (eos included when it ended the request)
    logp: torch.Tensor                # float32 [len(tokens)], of logp_mode's distribution
    finish_reason: str                # "eos" or "length"
    logp_mode: str = "raw"
    sampling: Optional[SamplingParams] = None


@dataclass
class _Request:
    id: int
    prompt: list
    params: SamplingParams
    max_new_tokens: int
    eos: frozenset
    tokens: list = field(default_factory=list)   # prompt + generated
    n_cached: int = 0
    pages: list = field(default_factory=list)
    logps: list = field(default_factory=list)
    worst_pages: int = 0

    @property
    def generated(self):
        return self.tokens[len(self.prompt):]


def to_training_batch(results: Sequence[RolloutResult], device=None):
    """(tokens int64 [N], cu_seqlens int32 [S + 1], rows int64 [sum len(r.tokens)]): the trainer's
    packed batch of prompt + completion per result (in the given order) and the row of each sampled
    token's logp in train_forward's output (row t scores token t + 1)."""
    toks, cu, rows = [], [0], []
    for r in results:
        seq = list(r.prompt) + list(r.tokens)
        start = cu[-1]
        rows.extend(start + len(r.prompt) - 1 + j for j in range(len(r.tokens)))
        toks.extend(seq)
        cu.append(start + len(seq))
    return (torch.tensor(toks, dtype=torch.int64, device=device),
            torch.tensor(cu, dtype=torch.int32, device=device),
            torch.tensor(rows, dtype=torch.int64, device=device))


class RolloutEngine:
    """Continuous-batching generation over a paged KV cache, with the trainer's bits.

    Args:
        model: a DecoderModel.
        max_num_seqs: requests running at once (the rest wait, FIFO).
        chunk_size: prefill tokens per request per step.
        page_size: tokens per KV page; a multiple of the attention kernel's locked block_n
            (default: block_n itself).
        num_pages: pages per layer (default: enough for max_num_seqs requests of max_model_len).
        page_seed: seeds the shuffled order in which pages are handed out.
        logp_mode: "raw", "logits" or "processed" (sampling.py says what each is).
        max_model_len: longest prompt + completion (default: the model's RoPE table length).
    """

    def __init__(self, model: DecoderModel, *, max_num_seqs: int = 8, chunk_size: int = 256,
                 page_size: Optional[int] = None, num_pages: Optional[int] = None, page_seed: int = 0,
                 logp_mode: str = "raw", max_model_len: Optional[int] = None):
        c = model.config
        self.model = model
        if logp_mode not in LOGP_MODES:
            raise InputError("logp_mode", f"{logp_mode!r} is not one of {LOGP_MODES}")
        for name, v in (("max_num_seqs", max_num_seqs), ("chunk_size", chunk_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(name, f"must be an int >= 1, got {v!r}")
        self.logp_mode = logp_mode
        self.max_num_seqs = max_num_seqs
        self.chunk_size = chunk_size
        dev = model.device
        block_n = configs.lookup_decode(arch_of(dev), model.dtype, c.head_dim).block_n
        self.page_size = block_n if page_size is None else int(page_size)
        if self.page_size < 1 or self.page_size % block_n:
            raise LayoutError("page_size", f"{self.page_size} must be a multiple of the attention block_n = {block_n}")
        self.max_model_len = int(max_model_len or model.max_positions)
        if self.max_model_len > model.max_positions:
            raise InputError("max_model_len", f"{self.max_model_len} exceeds the RoPE tables ({model.max_positions})")
        self.max_pages_per_seq = math.ceil(self.max_model_len / self.page_size)
        self.num_pages = int(num_pages or max_num_seqs * self.max_pages_per_seq)
        shape = (self.num_pages, self.page_size, c.num_kv_heads, c.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=model.dtype, device=dev) for _ in range(c.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=model.dtype, device=dev) for _ in range(c.num_layers)]
        g = torch.Generator().manual_seed(int(page_seed))
        self.free_pages = torch.randperm(self.num_pages, generator=g).tolist()
        self.reserved = 0
        self.waiting: list[_Request] = []
        self.running: list[_Request] = []
        self.finished: dict[int, RolloutResult] = {}
        self._next_id = 0
        self.steps = 0

    # ---- requests ----

    def add_request(self, prompt: Sequence[int], *, max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                    request_id: Optional[int] = None, eos_token_id: Union[None, int, Sequence[int]] = None) -> int:
        """Queue a request; returns its id (the draw's request id: its randomness depends on it)."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ShapeError("prompt", "must hold at least one token")
        V = self.model.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= V:
            raise InputError("prompt", f"token ids must lie in [0, {V})")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError("max_new_tokens", f"must be an int >= 1, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > self.max_model_len:
            raise InputError("max_new_tokens", f"prompt {len(prompt)} + {max_new_tokens} exceeds max_model_len "
                             f"{self.max_model_len}")
        if not isinstance(sampling, SamplingParams):
            raise InputError("sampling", f"expected SamplingParams, got {type(sampling).__name__}")
        rid = self._next_id if request_id is None else int(request_id)
        if rid in self.finished or any(r.id == rid for r in self.waiting + self.running):
            raise InputError("request_id", f"{rid} is already in use")
        self._next_id = max(self._next_id, rid + 1)
        eos = self.model.config.eos_token_id if eos_token_id is None else \
            (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
        # the prompt and every token but the last sampled one pass through the cache
        worst = math.ceil((len(prompt) + max_new_tokens - 1) / self.page_size)
        if worst > self.num_pages:
            raise KVCacheFullError("max_new_tokens", f"needs {worst} pages, the cache has {self.num_pages}")
        self.waiting.append(_Request(rid, prompt, sampling, max_new_tokens, frozenset(int(e) for e in eos),
                                     tokens=list(prompt), worst_pages=worst))
        return rid

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self):
        while self.waiting and len(self.running) < self.max_num_seqs \
                and self.reserved + self.waiting[0].worst_pages <= self.num_pages:
            r = self.waiting.pop(0)
            self.reserved += r.worst_pages
            self.running.append(r)

    def _finish(self, r: _Request, reason: str):
        self.free_pages.extend(r.pages)
        self.reserved -= r.worst_pages
        r.pages = []
        self.running.remove(r)
        self.finished[r.id] = RolloutResult(r.id, r.prompt, r.generated, torch.tensor(r.logps, dtype=torch.float32),
                                            reason, self.logp_mode, r.params)

    # ---- one engine step ----

    @torch.no_grad()
    def step(self, record: Optional[Callable] = None) -> list[RolloutResult]:
        """Run one packed forward over the running requests; returns the requests finished by it.

        record(name, tensor, keys), if given, sees every op's output of this step (decoder names,
        plus "logits" and "logp" for the sampled rows) with keys int64 [rows, 2] = (request id, position)."""
        self._admit()
        if not self.running:
            return []
        m, c, dev, ps = self.model, self.model.config, self.model.device, self.page_size
        batch = list(self.running)
        ids, pos, cu, slots, lens = [], [], [0], [], []
        for r in batch:
            n = min(self.chunk_size, len(r.tokens) - r.n_cached)
            end = r.n_cached + n
            while len(r.pages) * ps < end:
                r.pages.append(self.free_pages.pop(0))
            for p in range(r.n_cached, end):
                ids.append(r.tokens[p])
                pos.append(p)
                slots.append(r.pages[p // ps] * ps + p % ps)
            cu.append(cu[-1] + n)
            lens.append(end)
        width = max(len(r.pages) for r in batch)
        table = torch.zeros((len(batch), width), dtype=torch.int32)
        for b, r in enumerate(batch):
            table[b, :len(r.pages)] = torch.tensor(r.pages, dtype=torch.int32)
        token_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        position_ids = torch.tensor(pos, dtype=torch.int64, device=dev)
        # a plain decode step (one new token per sequence) needs no offsets: attention_decode takes
        # token b for sequence b, the same bits
        plain = all(cu[b + 1] - cu[b] == 1 for b in range(len(batch)))
        cu_q = None if plain else torch.tensor(cu, dtype=torch.int32, device=dev)
        cache_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        table = table.to(dev)
        slot_ids = torch.tensor(slots, dtype=torch.int64, device=dev)
        max_q = max(cu[b + 1] - cu[b] for b in range(len(batch)))

        def attend(i, q, k, v):
            self.k_cache[i].view(-1, c.num_kv_heads, c.head_dim)[slot_ids] = k
            self.v_cache[i].view(-1, c.num_kv_heads, c.head_dim)[slot_ids] = v
            return attention_decode(q, self.k_cache[i], self.v_cache[i], table, cache_lens, cu_q,
                                    max_seqlen_q=max_q, validate=False)

        if record is not None:
            keys = torch.stack([torch.repeat_interleave(torch.tensor([r.id for r in batch]),
                                                        torch.tensor(cu).diff()),
                                torch.tensor(pos)], dim=1)

        def record_keyed(name, t):  # the probe's record with each token's (request id, position)
            record(name, t, keys)

        hidden = m.forward_packed(token_ids, position_ids, attend,
                                  record=record_keyed if record is not None else None)
        for b, r in enumerate(batch):
            r.n_cached = lens[b]
        samplers = [b for b, r in enumerate(batch) if r.n_cached == len(r.tokens)]
        done = []
        if samplers:
            rows = torch.tensor([cu[b + 1] - 1 for b in samplers], dtype=torch.int64, device=dev)
            h = hidden.index_select(0, rows)
            logits = m.logits(h)
            reqs = [batch[b] for b in samplers]
            tokens, _ = sample_tokens(logits, [r.params for r in reqs], [r.id for r in reqs],
                                      [len(r.generated) for r in reqs])
            logp = self._logp(h, logits, tokens, [r.params for r in reqs])
            if record is not None:
                skeys = torch.tensor([[r.id, r.n_cached - 1] for r in reqs], dtype=torch.int64)
                record("logits", logits, skeys)
                record("logp", logp, skeys)
            # one device-to-host copy per step for each, not two syncs per request
            for r, t, lp in zip(reqs, tokens.tolist(), logp.tolist()):
                r.tokens.append(t)
                r.logps.append(lp)
                if t in r.eos:
                    done.append((r, "eos"))
                elif len(r.generated) >= r.max_new_tokens:
                    done.append((r, "length"))
        for r, reason in done:
            self._finish(r, reason)
        self.steps += 1
        return [self.finished[r.id] for r, _ in done]

    def _logp(self, h, logits, tokens, params):
        """The logp of each sampled token, by the trainer's kernel for the mode, one call per group of
        rows that share their sampling parameters (Python-scalar temperature, as the trainer passes)."""
        out = torch.empty(len(params), dtype=torch.float32, device=h.device)
        groups: dict = {}
        for j, sp in enumerate(params):
            key = (sp.logp_temperature,) if self.logp_mode == "raw" else (sp.logp_temperature, sp.top_k, sp.top_p)
            groups.setdefault(key, []).append(j)
        for key, js in groups.items():
            idx = torch.tensor(js, dtype=torch.int64, device=h.device)
            if self.logp_mode == "raw":
                val = linear_logp(h.index_select(0, idx), self.model.lm_head_weight, tokens.index_select(0, idx),
                                  temperature=key[0])
            else:
                val = score_logits(logits.index_select(0, idx), tokens.index_select(0, idx), logp_mode=self.logp_mode,
                                   temperature=key[0], top_k=key[1], top_p=key[2])
            out[idx] = val
        return out

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Union[SamplingParams, Sequence[SamplingParams]]
                 = SamplingParams(), *, max_new_tokens: Union[int, Sequence[int]] = 16,
                 eos_token_id=None, request_ids: Optional[Sequence[int]] = None,
                 record: Optional[Callable] = None) -> list[RolloutResult]:
        """Queue every prompt, step until all finish; results in the prompts' order."""
        n = len(prompts)
        sps = [sampling] * n if isinstance(sampling, SamplingParams) else list(sampling)
        mnt = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(sps) != n or len(mnt) != n:
            raise ShapeError("sampling", "need one SamplingParams and one max_new_tokens per prompt")
        rids = [self.add_request(p, max_new_tokens=mnt[i], sampling=sps[i], eos_token_id=eos_token_id,
                                 request_id=None if request_ids is None else request_ids[i])
                for i, p in enumerate(prompts)]
        while self.has_unfinished():
            self.step(record=record)
        return [self.finished.pop(rid) for rid in rids]
