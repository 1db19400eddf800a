"""The layer-wise probe: where do two executions of the same model on the same tokens part ways?

Two executions (a rollout with a KV cache and a teacher-forced training forward, or any two runs)
each fill a `Recording` with the activations after every op, one row per token, keyed by the token
(typically `(sequence, position)`). `compare(a, b)` matches rows by key and reports, op by op in
execution order, whether the bits are equal and how large the difference is; the first op whose bits
differ is where the two executions started to disagree, and the per-layer maxima show how the
difference grows through the model.

Feeding a Recording (the interface a model implements)
------------------------------------------------------
A model calls ``record(name, rows, keys)`` after each op, in execution order::

    rec = Recording("rollout")
    rec.record("layers.0.q", q_rows, keys)    # or rec("layers.0.q", q_rows, keys): a Recording is callable
    record = rec.bound(keys)                  # a record(name, rows) callback for one call's tokens
    record("layers.0.q", q_rows)

- ``name``: the op, from the naming scheme below. An op may be recorded many times (once per decode
  step, once per micro-batch); its rows accumulate. The execution order is the order in which names
  are first recorded.
- ``rows``: a tensor whose first dim is one row per token, any trailing shape (``[n, H]``,
  ``[n, heads, head_dim]``); it is detached and cloned, so a buffer reused later does no harm.
  Record it in the dtype the op produced: bitwise means `torch.equal` in that dtype.
- ``keys``: one key per row, identifying the token across executions: an int tensor ``[n, k]`` or a
  sequence of int tuples, e.g. ``(sequence index, position in prompt + completion)``. A key may
  appear once per op per recording (a second time raises InputError: two rows for one token would
  make the comparison ambiguous).

Op names (the transformers recorder below emits them, and rlk_triton.models emits the same):

    embed                  token embedding
    layers.{i}.input_norm  RMSNorm before attention
    layers.{i}.q / .k / .v q, k, v as they enter RoPE: after the per-head q_norm / k_norm where the
                           model has them (Qwen3), else the projections' outputs (Llama)
    layers.{i}.q_proj      the q / k projections' raw outputs, before q_norm / k_norm: only where
    layers.{i}.k_proj      the model has those norms (extra rows a model may leave out)
    layers.{i}.attn_out    attention output, heads merged, before o_proj (o_proj's input)
    layers.{i}.o_proj      o_proj's output
    layers.{i}.post_norm   RMSNorm before the MLP (post_attention_layernorm)
    layers.{i}.mlp         the MLP's output
    layers.{i}.out         the decoder layer's output (the residual stream after layer i)
    final_norm             the final RMSNorm
    logits                 the LM head's output

`compare` only compares ops present in both recordings (the others are listed in `missing`), and only
rows whose key is in both (a rollout has no row for the last sampled token, which is never fed back).

`TransformersRecorder(model, recording)` fills a Recording from forward hooks on a Llama / Qwen3-style
transformers model, for `generate()` with a left-padded batch and a KV cache (the prefill step and
decode steps of one token per sequence) as well as for a teacher-forced forward, left or right padded:
it reads each step's 2D attention_mask and keys a row by ``(sequence, number of real tokens before
it)``, the position the token has in its own unpadded sequence.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from .errors import InputError, ShapeError

_LAYER = re.compile(r"^layers\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The layer index in an op name like 'layers.3.attn_out'; None for embed, final_norm, logits."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def stage_of(name: str) -> str:
    """The group an op is charted in: 'embed', 'layers.{i}', 'final_norm', 'logits' (or the name)."""
    i = layer_of(name)
    return f"layers.{i}" if i is not None else name


def _as_keys(keys, n: int) -> torch.Tensor:
    if torch.is_tensor(keys):
        if keys.is_floating_point() or keys.is_complex() or keys.dtype == torch.bool:
            raise InputError("keys", f"must be an integer tensor, got {keys.dtype}")
        k = keys.detach().to("cpu", torch.int64)
        if k.dim() == 1:
            k = k[:, None]
    else:
        try:
            k = torch.tensor([tuple(x) if isinstance(x, (tuple, list)) else (x,) for x in keys], dtype=torch.int64)
        except (TypeError, ValueError) as e:
            raise InputError("keys", f"must be int tuples or an int tensor [n, k]: {e}") from e
        if k.numel() == 0:
            k = k.reshape(0, 1)
    if k.dim() != 2 or k.shape[0] != n:
        raise ShapeError("keys", f"needs one key per row ({n}), got shape {tuple(k.shape)}")
    return k


class Recording:
    """Per-op rows of one execution, keyed by token. See the module docstring for the interface."""

    def __init__(self, label: str = ""):
        self.label = label
        self._parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # insertion order = execution order
        self._seen: dict[str, set] = {}
        self._cat: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(self, name: str, rows: torch.Tensor, keys) -> None:
        """Add rows (first dim: one per token) of op `name` under `keys` (one per row)."""
        if not isinstance(name, str) or not name:
            raise InputError("name", f"must be a non-empty str, got {name!r}")
        if not torch.is_tensor(rows) or rows.dim() < 1:
            raise InputError("rows", f"{name}: must be a tensor with one row per token")
        k = _as_keys(keys, rows.shape[0])
        seen = self._seen.setdefault(name, set())
        width = None
        for prev_k, prev_r in self._parts.get(name, ())[:1]:
            width = (prev_k.shape[1], prev_r.shape[1:])
        flat = rows.detach().reshape(rows.shape[0], -1).clone()
        if width is not None and (k.shape[1], flat.shape[1:]) != width:
            raise ShapeError("rows", f"{name}: rows {tuple(flat.shape[1:])} / keys of {k.shape[1]} ints do not "
                                     f"match the earlier {tuple(width[1])} / {width[0]}")
        for t in map(tuple, k.tolist()):
            if t in seen:
                raise InputError("keys", f"{name}: key {t} recorded twice")
            seen.add(t)
        self._parts.setdefault(name, []).append((k, flat))
        self._cat.pop(name, None)

    __call__ = record

    def bound(self, keys):
        """A ``record(name, rows)`` callback for one call whose rows are the tokens `keys`, in row order
        (a packed forward: every token's (sequence, position); a decode step: one per running sequence)."""
        k = _as_keys(keys, len(keys))
        return lambda name, rows: self.record(name, rows, k)

    @property
    def ops(self) -> list[str]:
        """Op names in execution order (order of first record)."""
        return list(self._parts)

    def rows(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys [N, k] int64 on the CPU, rows [N, D]) of one op, in record order."""
        if name not in self._parts:
            raise InputError("name", f"op {name!r} was not recorded in {self.label or 'this recording'}")
        if name not in self._cat:
            parts = self._parts[name]
            self._cat[name] = (torch.cat([k for k, _ in parts]), torch.cat([r for _, r in parts]))
        return self._cat[name]

    def __len__(self) -> int:
        return len(self._parts)


@dataclass(frozen=True)
class OpDiff:
    """One op compared over the tokens both executions have. Differences are float64."""
    name: str
    layer: int | None
    tokens: int  # rows compared
    rows_differ: int  # rows with any bit different
    bitwise: bool  # torch.equal over the compared rows (same dtype, same bits)
    max_abs_diff: float  # inf where one side is not finite and the other is, or both NaN
    mean_abs_diff: float
    max_abs_value: float  # max |a| over the compared rows: the op's scale, to read the diff against
    worst_key: tuple | None  # the key of the row holding max_abs_diff (None when bitwise)

    def to_dict(self) -> dict:
        return {k: (_jf(v) if isinstance(v, float) else (list(v) if isinstance(v, tuple) else v))
                for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class LayerDiff:
    """One stage (embed, layers.{i}, final_norm, logits): the max |diff| over its ops, and the average
    over its ops of each op's mean |diff| (every op counts once, whatever its width)."""
    stage: str
    layer: int | None
    max_abs_diff: float
    mean_abs_diff: float
    bitwise: bool
    first_divergent_op: str | None

    def to_dict(self) -> dict:
        return {k: (_jf(v) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ProbeResult:
    """`compare(a, b)`: per-op differences in execution order, the first op whose bits differ, and the
    per-stage growth."""
    label_a: str
    label_b: str
    ops: tuple  # OpDiff, in a's execution order
    stages: tuple  # LayerDiff: embed, layers.0 .. layers.{L-1}, final_norm, logits (those present)
    missing: dict = field(default_factory=dict)  # {"only_a": [...], "only_b": [...]}

    @property
    def bitwise(self) -> bool:
        return all(o.bitwise for o in self.ops)

    @property
    def first_divergent(self) -> OpDiff | None:
        return next((o for o in self.ops if not o.bitwise), None)

    @property
    def first_divergent_op(self) -> str | None:
        o = self.first_divergent
        return o.name if o else None

    @property
    def per_layer(self) -> list[LayerDiff]:
        """Only the decoder layers, in layer order: how the difference grows layer by layer."""
        return [s for s in self.stages if s.layer is not None]

    def op(self, name: str) -> OpDiff:
        for o in self.ops:
            if o.name == name:
                return o
        raise InputError("name", f"op {name!r} was not compared")

    def to_dict(self) -> dict:
        first = self.first_divergent
        return {"a": self.label_a, "b": self.label_b, "bitwise": self.bitwise,
                "first_divergent_op": self.first_divergent_op,
                "first_divergent_key": list(first.worst_key) if first and first.worst_key else None,
                "ops": [o.to_dict() for o in self.ops], "stages": [s.to_dict() for s in self.stages],
                "missing": self.missing}

    def summary(self) -> str:
        if not self.ops:
            return f"probe {self.label_a} vs {self.label_b}: no common ops"
        if self.bitwise:
            return f"probe {self.label_a} vs {self.label_b}: all {len(self.ops)} ops bitwise equal"
        f = self.first_divergent
        growth = ", ".join(f"{s.stage} {s.max_abs_diff:.2e}" for s in self.stages)
        return (f"probe {self.label_a} vs {self.label_b}: first divergent op {f.name} "
                f"({f.rows_differ}/{f.tokens} rows, max |diff| {f.max_abs_diff:.3g}); max |diff| by stage: {growth}")


def compare(a: Recording, b: Recording, *, keys=None) -> ProbeResult:
    """Compare the ops both recordings hold, on the keys both hold (restricted to `keys`, an int tensor
    [n, k] or int tuples, when given), in a's execution order."""
    for arg, r in (("a", a), ("b", b)):
        if not isinstance(r, Recording):
            raise InputError(arg, f"must be a Recording, got {type(r).__name__}")
    allowed = None if keys is None else {tuple(t) for t in _as_keys(keys, len(keys)).tolist()}
    ops = []
    for name in a.ops:
        if name not in b.ops:
            continue
        ka, ra = a.rows(name)
        kb, rb = b.rows(name)
        if ka.shape[1] != kb.shape[1]:
            raise ShapeError("b", f"{name}: keys of {kb.shape[1]} ints, a's have {ka.shape[1]}")
        if ra.shape[1:] != rb.shape[1:]:
            raise ShapeError("b", f"{name}: rows of {tuple(rb.shape[1:])}, a's are {tuple(ra.shape[1:])}")
        index_b = {t: i for i, t in enumerate(map(tuple, kb.tolist()))}
        ia, ib = [], []
        for i, t in enumerate(map(tuple, ka.tolist())):
            j = index_b.get(t)
            if j is not None and (allowed is None or t in allowed):
                ia.append(i)
                ib.append(j)
        ops.append(_op_diff(name, ka, ra, rb, ia, ib))
    return ProbeResult(label_a=a.label, label_b=b.label, ops=tuple(ops), stages=tuple(_stages(ops)),
                       missing={"only_a": [n for n in a.ops if n not in b.ops],
                                "only_b": [n for n in b.ops if n not in a.ops]})


def _op_diff(name, ka, ra, rb, ia, ib) -> OpDiff:
    layer = layer_of(name)
    if not ia:
        return OpDiff(name, layer, 0, 0, True, 0.0, 0.0, 0.0, None)
    ia_t = torch.tensor(ia, device=ra.device)
    xa = ra.index_select(0, ia_t)
    xb = rb.to(ra.device).index_select(0, torch.tensor(ib, device=ra.device))
    same_dtype = xa.dtype == xb.dtype
    bitwise = same_dtype and torch.equal(xa, xb)
    if bitwise:
        return OpDiff(name, layer, len(ia), 0, True, 0.0, 0.0, _finite_max(xa), None)
    da, db = xa.double(), xb.double()
    # Equal values (equal infinities included) differ by 0; a NaN or a one-sided infinity by inf.
    diff = torch.where(da == db, 0.0, (da - db).abs())
    diff = torch.where(torch.isfinite(diff), diff, math.inf)
    row_max = diff.amax(1) if diff.shape[1] else torch.zeros(diff.shape[0], dtype=torch.float64)
    differ = (row_max > 0) if same_dtype else torch.ones_like(row_max, dtype=torch.bool)
    worst = int(row_max.argmax())
    return OpDiff(name, layer, len(ia), int(differ.sum()), False, float(row_max[worst]),
                  float(diff.mean()) if diff.numel() else 0.0, _finite_max(xa),
                  tuple(ka[ia[worst]].tolist()))


def _finite_max(x: torch.Tensor) -> float:
    x = x.double().abs()
    x = x[torch.isfinite(x)]
    return float(x.max()) if x.numel() else 0.0


def _stages(ops: list[OpDiff]) -> list[LayerDiff]:
    groups: dict[str, list[OpDiff]] = {}
    for o in ops:
        groups.setdefault(stage_of(o.name), []).append(o)
    def rank(s):  # embed, the layers in index order, final_norm, logits, anything else
        i = layer_of(s + ".")
        return (1, i) if i is not None else ({"embed": 0, "final_norm": 2, "logits": 3}.get(s, 4), 0)

    order = sorted(groups, key=rank)
    out = []
    for s in order:
        g = groups[s]
        first = next((o.name for o in g if not o.bitwise), None)
        compared = [o for o in g if o.tokens]
        mean = sum(o.mean_abs_diff for o in compared) / len(compared) if compared else 0.0
        out.append(LayerDiff(s, layer_of(s + "."), max((o.max_abs_diff for o in g), default=0.0), mean,
                             first is None, first))
    return out


def _jf(v: float):
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


# ---- transformers recorder ----

class TransformersRecorder:
    """Forward hooks on a Llama / Qwen3-style transformers model that fill `recording` with the op
    names of the module docstring. Use as a context manager around `generate()` or a forward::

        rec = Recording("rollout")
        with TransformersRecorder(model, rec):
            model.generate(input_ids, attention_mask=mask, ...)

    Every step must pass a 2D attention_mask (generate does with a DynamicCache; a forward without
    one counts every token as real). Row b of a step is keyed ``(seq_ids[b], position)`` where the
    position counts the real tokens before it; set `seq_ids` before a forward of a subset of the
    sequences (e.g. one sequence alone).
    """

    def __init__(self, model, recording: Recording, seq_ids=None):
        if not isinstance(recording, Recording):
            raise InputError("recording", f"must be a Recording, got {type(recording).__name__}")
        base = getattr(model, "model", None)
        if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm")):
            raise InputError("model", "needs a Llama / Qwen3-style CausalLM (model.model.embed_tokens, .layers, .norm)")
        self.model, self.base, self.recording = model, base, recording
        self.lm_head = model.get_output_embeddings()
        self.seq_ids = seq_ids
        self._handles: list = []
        self._pos = self._valid = None

    # Each step: which rows are real tokens and their positions, from the 2D attention mask.
    def _step(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        B, T = ids.shape[:2]
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones(B, T, dtype=torch.long, device=ids.device)
        if not torch.is_tensor(mask) or mask.dim() != 2:
            raise InputError("attention_mask", "the recorder needs each step's 2D padding mask (a DynamicCache, "
                                               "not a compiled static cache's 4D mask)")
        m = mask.detach().to("cpu", torch.long) != 0
        self._pos = (m.long().cumsum(-1) - 1)[:, -T:]
        self._valid = m[:, -T:]
        seq = torch.arange(B) if self.seq_ids is None else torch.as_tensor(self.seq_ids, dtype=torch.long)
        if seq.shape != (B,):
            raise ShapeError("seq_ids", f"needs one id per batch row ({B}), got {tuple(seq.shape)}")
        self._seq = seq

    def _emit(self, name, t):
        if isinstance(t, (tuple, list)):
            t = t[0]
        B, T = t.shape[:2]
        valid, pos = self._valid[:, -T:], self._pos[:, -T:]  # the LM head may see only the last positions
        if valid.shape != (B, T):
            raise ShapeError("attention_mask", f"{name}: output [{B}, {T}] does not fit the step's mask {tuple(valid.shape)}")
        rows = t.reshape(B, T, -1)[valid.to(t.device)]
        b_idx, t_idx = valid.nonzero(as_tuple=True)
        keys = torch.stack([self._seq[b_idx], pos[b_idx, t_idx]], 1)
        self.recording.record(name, rows, keys)

    def _out(self, name):
        return lambda mod, args, out: self._emit(name, out)

    def _in(self, name):
        return lambda mod, args: self._emit(name, args[0])

    def __enter__(self):
        h = self._handles
        h.append(self.model.register_forward_pre_hook(self._step, with_kwargs=True))
        h.append(self.base.embed_tokens.register_forward_hook(self._out("embed")))
        for i, layer in enumerate(self.base.layers):
            p, attn = f"layers.{i}.", layer.self_attn
            h.append(layer.input_layernorm.register_forward_hook(self._out(p + "input_norm")))
            for x in ("q", "k"):  # "q" / "k" is what enters RoPE: after the head norm where there is one
                proj, norm = getattr(attn, f"{x}_proj"), getattr(attn, f"{x}_norm", None)
                if norm is None:
                    h.append(proj.register_forward_hook(self._out(p + x)))
                else:
                    h.append(proj.register_forward_hook(self._out(p + f"{x}_proj")))
                    h.append(norm.register_forward_hook(self._out(p + x)))
            h.append(attn.v_proj.register_forward_hook(self._out(p + "v")))
            h.append(attn.o_proj.register_forward_pre_hook(self._in(p + "attn_out")))
            h.append(attn.o_proj.register_forward_hook(self._out(p + "o_proj")))
            h.append(layer.post_attention_layernorm.register_forward_hook(self._out(p + "post_norm")))
            h.append(layer.mlp.register_forward_hook(self._out(p + "mlp")))
            h.append(layer.register_forward_hook(self._out(p + "out")))
        h.append(self.base.norm.register_forward_hook(self._out("final_norm")))
        h.append(self.lm_head.register_forward_hook(self._out("logits")))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return False
