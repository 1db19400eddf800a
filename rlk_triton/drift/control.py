"""The control group: rollout vs training log-probs of a transformers model on its stock kernels.

Rollout: one batched `model.generate()` over all prompts, LEFT padded, with a KV cache (a prefill of
the padded prompts, then one token per sequence per step), sampling with a seed (or greedy).
Training: teacher-forced forwards over prompt + completion, (a) each sequence alone (batch 1, no
padding) and (b) all sequences as one RIGHT-padded batch with an attention_mask, as a trainer runs them.

The distribution (both sides, the same function): for the token at position p of a sequence,

    logp = log_softmax(float32(logits[p - 1]) / T)[token p]      over the FULL vocabulary

from the raw logits: `generate(output_logits=True)` on the rollout side, the forward's logits on the
training side. This is what a trainer computes at temperature T. Sampling uses the same distribution:
generate runs with top_k=0 and top_p=1.0, so the processed scores it samples from are exactly
logits / T (no truncation that the trainer would not see). Greedy decoding takes the argmax and the
logp is still reported at temperature T.

Rows are aligned by (sequence index, position): the position of the scored token in its own unpadded
prompt + completion, so it does not depend on the padding of either side. A completion ends at its
first EOS (included); later tokens are padding and are not scored.

What differs between the sides is only how the model is executed: batch composition and padding,
a one-token decode against a cached K/V versus a full causal forward, so matmul shapes, SDPA paths
and reduction orders differ (docs/drift.md). The weights, tokens and logp function are the same.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from ..errors import InputError, TemperatureError
from ..probe import ProbeResult, Recording, TransformersRecorder, compare


@dataclass
class ControlResult:
    """Per-token arrays aligned by row: row i is the token keys[i] = (sequence, position)."""
    keys: torch.Tensor  # [N, 2] int64 (sequence, position in prompt + completion), sorted
    tokens: torch.Tensor  # [N] int64: the sampled token at that position
    rollout_logp: torch.Tensor  # [N] float32: generate's logits
    train_alone_logp: torch.Tensor  # [N] float32: teacher forcing, one sequence per forward
    train_batched_logp: torch.Tensor  # [N] float32: teacher forcing, one right-padded batch
    sequences: list  # prompt + completion ids per sequence
    prompt_lens: list
    temperature: float
    greedy: bool
    seed: int
    dtype: torch.dtype
    recordings: dict = field(default_factory=dict)  # "rollout", "train_alone", "train_batched" when probed

    @property
    def tokens_scored(self) -> int:
        return int(self.keys.shape[0])

    def probe(self, train: str = "train_batched", *, decode_only: bool = False) -> ProbeResult:
        """The layer-wise probe of the rollout against a training execution ('train_batched' or
        'train_alone'), over the tokens both ran; decode_only keeps the completion tokens' rows (the
        rows generate computed in one-token decode steps), leaving out the prompt's prefill rows."""
        if not self.recordings:
            raise InputError("probe", "run_control(..., probe=True) records the executions")
        if train not in ("train_batched", "train_alone"):
            raise InputError("train", f"must be 'train_batched' or 'train_alone', got {train!r}")
        keys = None
        if decode_only:
            keys = [(b, p) for b, (seq, n) in enumerate(zip(self.sequences, self.prompt_lens))
                    for p in range(n, len(seq))]
        return compare(self.recordings["rollout"], self.recordings[train], keys=keys)


def run_control(model, prompts, *, max_new_tokens: int = 16, temperature: float = 1.0, greedy: bool = False,
                seed: int = 0, probe: bool = False, pad_id: int | None = None) -> ControlResult:
    """The control group on `model` (a transformers CausalLM in eval mode, on its device and dtype).

    prompts: list of non-empty lists of token ids. Returns a ControlResult whose three logp arrays
    are float32 and aligned by (sequence, position). probe=True also records every op's activations
    of the rollout and both training executions (rlk_triton.probe) for ControlResult.probe().
    """
    prompts = _check_prompts(prompts, model)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise InputError("max_new_tokens", f"must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 < temperature < float("inf"):
        raise TemperatureError("temperature", f"must be finite and > 0, got {temperature!r}")
    temperature = float(temperature)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    gen_cfg = model.generation_config
    if pad_id is None:
        pad_id = _first(gen_cfg.pad_token_id) if gen_cfg.pad_token_id is not None else _first(gen_cfg.eos_token_id)
        pad_id = 0 if pad_id is None else pad_id
    eos = gen_cfg.eos_token_id
    eos = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    recs = {k: Recording(k) for k in ("rollout", "train_alone", "train_batched")} if probe else {}

    def hooks(name, seq_ids=None):
        return TransformersRecorder(model, recs[name], seq_ids=seq_ids) if probe else nullcontext()

    # ---- rollout: one left-padded batch through generate() with a KV cache ----
    B, L = len(prompts), max(map(len, prompts))
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    # A fresh GenerationConfig: a checkpoint's own (top_k, top_p, repetition_penalty, ...) would make
    # the sampled distribution differ from the logits / T both sides report. Only EOS and pad are kept.
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=pad_id,
                           eos_token_id=sorted(eos) or None, output_logits=True, return_dict_in_generate=True,
                           **({} if greedy else {"temperature": temperature, "top_k": 0, "top_p": 1.0}))
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), hooks("rollout"):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen)
    generated = out.sequences[:, L:].cpu()
    step_logits = out.logits  # per step [B, V], the raw (unprocessed) logits

    sequences, keys, tokens, rollout = [], [], [], []
    for b, p in enumerate(prompts):
        comp = []
        for s in range(generated.shape[1]):
            tok = int(generated[b, s])
            comp.append(tok)
            if tok in eos:
                break
        seq = list(p) + comp
        sequences.append(seq)
        for s, tok in enumerate(comp):
            keys.append((b, len(p) + s))
            tokens.append(tok)
        steps = torch.stack([step_logits[s][b] for s in range(len(comp))])
        rollout.append(_logp(steps, torch.tensor(comp, device=steps.device), temperature))
    rollout_logp = torch.cat(rollout).cpu()
    keys_t = torch.tensor(keys, dtype=torch.long)

    # ---- training (a): each sequence alone, batch 1, no padding ----
    alone = []
    with torch.no_grad():
        for b, seq in enumerate(sequences):
            x = torch.tensor([seq], device=device)
            with hooks("train_alone", seq_ids=[b]):
                logits = model(input_ids=x).logits[0]
            n = len(prompts[b])
            alone.append(_logp(logits[n - 1:len(seq) - 1], x[0, n:], temperature))
    # ---- training (b): one right-padded batch with an attention_mask ----
    T = max(map(len, sequences))
    ids2 = torch.full((B, T), pad_id, dtype=torch.long)
    mask2 = torch.zeros((B, T), dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids2[b, :len(seq)] = torch.tensor(seq)
        mask2[b, :len(seq)] = 1
    with torch.no_grad(), hooks("train_batched"):
        logits = model(input_ids=ids2.to(device), attention_mask=mask2.to(device)).logits
    batched = [_logp(logits[b, len(prompts[b]) - 1:len(seq) - 1], ids2[b, len(prompts[b]):len(seq)].to(device),
                     temperature) for b, seq in enumerate(sequences)]

    return ControlResult(keys=keys_t, tokens=torch.tensor(tokens, dtype=torch.long), rollout_logp=rollout_logp,
                         train_alone_logp=torch.cat(alone).cpu(), train_batched_logp=torch.cat(batched).cpu(),
                         sequences=sequences, prompt_lens=[len(p) for p in prompts], temperature=temperature,
                         greedy=greedy, seed=seed, dtype=dtype, recordings=recs)


def _logp(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(float32(logits) / T) over the full vocab at the targets: [n, V], [n] -> [n] float32.
    The one function both sides use, so only the logits can make them differ."""
    lp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return lp.gather(-1, targets.long().to(lp.device)[:, None])[:, 0]


def _first(x):
    return x[0] if isinstance(x, (list, tuple)) else x


def _check_prompts(prompts, model) -> list:
    vocab = model.get_output_embeddings().weight.shape[0]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InputError("prompts", "must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        p = p.tolist() if torch.is_tensor(p) else p
        if not isinstance(p, (list, tuple)) or not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise InputError("prompts", f"prompt {i} must be a non-empty list of ints")
        if not all(0 <= t < vocab for t in p):
            raise InputError("prompts", f"prompt {i} has ids outside [0, {vocab})")
        out.append(list(p))
    return out
