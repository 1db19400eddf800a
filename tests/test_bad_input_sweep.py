"""The bad-input sweep over every public function: each joins by being registered in CASES (a valid
call on tiny inputs), and test_every_public_function_is_registered fails until it is.

For each registered call and each of its arguments the sweep makes one bad (or merely unusual)
variant and states what must happen:
  * a string, or None where None is not the default: a typed error (errors.RlkError) naming that
    argument;
  * a tensor of another dtype, or with an extra leading dim: the call returns, or raises a typed error
    that names one of the function's arguments; never a generic TypeError / RuntimeError /
    IndexError from deep inside;
  * a tensor with the same values but other strides: the same result bit for bit, or (float tensors
    only) a LayoutError naming it; integer index tensors must always give the same result;
  * a float tensor holding NaN / inf: the call returns or raises a typed error naming it (where a
    NaN may go is each op's own row-locality test: tests/test_bad_input_*.py);
  * the scalar values listed in the case's `bad` table: a typed error naming the scalar.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

from rlk_triton import errors

# (module, names that are not functions of tensors: constants and classes are skipped by type)
PUBLIC_MODULES = ("rlk_triton.logp", "rlk_triton.losses", "rlk_triton.advantages", "rlk_triton.attention",
                  "rlk_triton.packing", "rlk_triton.ops.rmsnorm", "rlk_triton.ops.swiglu", "rlk_triton.ops.rope",
                  "rlk_triton.ops.embedding", "rlk_triton.ops.matmul")
EXTRA_PUBLIC = {"rlk_triton.ops.matmul": ("matmul",)}  # modules without __all__


@dataclass
class Case:
    fn: str  # "module:function"
    make: Callable  # device -> kwargs of a valid call (every argument by name)
    bad: dict = field(default_factory=dict)  # scalar argument -> values that must raise naming it
    nullable: tuple = ()  # arguments without a default for which None is a documented value

    def function(self):
        mod, name = self.fn.split(":")
        return getattr(importlib.import_module(mod), name)


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _f(device, *shape, seed=0):
    return torch.randn(*shape, generator=_g(seed)).to(device)


def _i(device, hi, *shape, dtype=torch.int64, seed=1):
    return torch.randint(0, hi, shape, generator=_g(seed)).to(device, dtype)


def _cu(device, offsets):
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def _mask(device, B=3, T=6):
    m = torch.ones(B, T, dtype=torch.bool)
    m[0, 4:] = False
    return m.to(device)


def _rl(device, **extra):
    return dict(logp=-_f(device, 3, 6, seed=2).abs(), old_logp=-_f(device, 3, 6, seed=3).abs(),
                advantages=_f(device, 3, 6, seed=4), mask=_mask(device), **extra)


def _decode(device):
    from rlk_triton import configs
    from rlk_triton._runtime import arch_of
    bn = configs.lookup_decode(arch_of(device), torch.float32, 16).block_n
    return dict(q=_f(device, 2, 4, 16), k_cache=_f(device, 4, bn, 2, 16, seed=5), v_cache=_f(device, 4, bn, 2, 16, seed=6),
                block_table=_cu(device, [[0, 1], [2, 3]]), cache_seqlens=_cu(device, [bn + 3, 5]))


def _rope(device):
    from rlk_triton.ops.rope import rope_tables
    cos, sin = rope_tables(16, 16, device=device)
    return dict(q=_f(device, 5, 2, 16), k=_f(device, 5, 1, 16, seed=2), cos=cos, sin=sin,
                position_ids=_cu(device, [0, 1, 2, 0, 1]))


POSITIVE = (float("nan"), float("inf"), 0.0, -1.0, "x")
CASES = [
    Case("rlk_triton.logp:selected_logp", lambda d: dict(logits=_f(d, 3, 50), target_ids=_i(d, 50, 3)),
         bad={"temperature": POSITIVE, "ignore_index": (1.5, "x")}),
    Case("rlk_triton.logp:selected_logp_indexed",
         lambda d: dict(logits=_f(d, 5, 50), target_ids=_i(d, 50, 3), row_indices=torch.tensor([4, 0, 2], device=d)),
         bad={"temperature": POSITIVE}),
    Case("rlk_triton.logp:linear_logp",
         lambda d: dict(hidden=_f(d, 3, 16), weight=_f(d, 40, 16, seed=2) / 4, target_ids=_i(d, 40, 3)),
         bad={"temperature": POSITIVE}),
    Case("rlk_triton.losses:policy_loss", _rl, bad={"eps_low": (float("nan"), -0.1, "x"), "loss_type": ("nope", 3)}),
    Case("rlk_triton.losses:ratio_kl", lambda d: {k: v for k, v in _rl(d).items() if k != "advantages"},
         bad={"kl_estimator": ("k9",), "log_ratio_clamp": (float("nan"), -1.0)}),
    Case("rlk_triton.losses:gspo_loss", lambda d: {**_rl(d), "advantages": _f(d, 3, seed=4)},
         bad={"eps_low": (float("nan"), -0.1)}),
    Case("rlk_triton.losses:rollout_correction",
         lambda d: dict(old_logp=_rl(d)["old_logp"], rollout_logp=_rl(d)["logp"], mask=_rl(d)["mask"], is_level="token",
                        is_high=2.0, rejection={"token_k1": (0.5, 2.0), "seq_mean_k3": 0.1}),
         bad={"is_level": ("nope", 3), "is_mode": ("nope",), "is_high": (float("nan"), 0.0, -1.0, "x"),
              "is_low": (float("nan"), -1.0, 5.0, "x"), "log_ratio_clamp": (float("nan"), 0.0),
              "rejection": ({"token_k9": 1.0}, {"token_k1": 2.0}, {"seq_sum_k2": -1.0}, "x")},
         nullable=("is_level",)),
    Case("rlk_triton.advantages:masked_whiten", lambda d: dict(values=_f(d, 3, 6), mask=_mask(d)),
         bad={"eps": (float("nan"), -1.0, "x"), "eps_placement": ("nope",), "shift_mean": ("x", 1),
              "mean": (float("nan"), "x"), "var": (float("nan"), -1.0)}),
    Case("rlk_triton.advantages:gae",
         lambda d: dict(rewards=_f(d, 3, 6), values=_f(d, 3, 6, seed=2), mask=_mask(d), gamma=0.99, lam=0.95),
         bad={"gamma": (float("nan"), -0.5, 1.5), "lam": (float("nan"), -0.5, 1.5)}),
    Case("rlk_triton.advantages:group_advantages",
         lambda d: dict(scores=_f(d, 6), group_ids=_i(d, 2, 6), num_groups=2),
         bad={"num_groups": (-1, 2.5, "x"), "mode": ("nope",), "eps": (float("nan"), -1.0)}),
    Case("rlk_triton.advantages:reinforce_pp_baseline",
         lambda d: dict(scores=_f(d, 3), group_ids=_i(d, 2, 3), mask=_mask(d), num_groups=2),
         bad={"num_groups": (-1, "x"), "eps": (float("nan"), -1.0), "token_std": (float("nan"), -1.0),
              "token_mean": (float("nan"), "a")}),
    Case("rlk_triton.attention:attention",
         lambda d: dict(q=_f(d, 9, 4, 16), k=_f(d, 9, 2, 16, seed=2), v=_f(d, 9, 2, 16, seed=3), cu_seqlens=_cu(d, [0, 4, 9])),
         bad={"scale": POSITIVE, "max_seqlen": (-1, 2.5, "x")}),
    Case("rlk_triton.attention:attention_partial",
         lambda d: dict(q=_f(d, 9, 4, 16), k=_f(d, 9, 2, 16, seed=2), v=_f(d, 9, 2, 16, seed=3), cu_seqlens=_cu(d, [0, 4, 9]),
                        kv_start=0),
         bad={"kv_start": (None, 16.5, -16, "0"), "kv_end": (-1, 2.5), "scale": POSITIVE}),
    Case("rlk_triton.attention:attention_decode", _decode, bad={"scale": POSITIVE, "max_seqlen_q": (-1, "x")}),
    Case("rlk_triton.attention:merge_attention_partials",
         lambda d: dict(outs=[_f(d, 5, 2, 16), _f(d, 5, 2, 16, seed=2)], lses=[_f(d, 2, 5, seed=3), _f(d, 2, 5, seed=4)])),
    Case("rlk_triton.packing:pad", lambda d: dict(values=_f(d, 7, 3), cu_seqlens=_cu(d, [0, 2, 7]), max_seqlen=5),
         bad={"max_seqlen": (-1, 2.5, "x")}),
    Case("rlk_triton.packing:unpad", lambda d: dict(padded=_f(d, 2, 5, 3), cu_seqlens=_cu(d, [0, 2, 7]))),
    Case("rlk_triton.packing:sequence_ids", lambda d: dict(cu_seqlens=_cu(d, [0, 2, 7]), n_tokens=7),
         bad={"n_tokens": (-1, 2.5, "x")}),
    Case("rlk_triton.ops.rmsnorm:rms_norm", lambda d: dict(x=_f(d, 3, 32), weight=_f(d, 32, seed=2)),
         bad={"eps": (float("nan"), -1.0, "x")}),
    Case("rlk_triton.ops.swiglu:swiglu", lambda d: dict(gate=_f(d, 3, 32), up=_f(d, 3, 32, seed=2))),
    Case("rlk_triton.ops.rope:apply_rope", _rope, nullable=("k",)),
    Case("rlk_triton.ops.rope:rope_tables", lambda d: dict(max_positions=8, rotary_dim=16, device=d), nullable=("device",),
         bad={"max_positions": (-1, 2.5, "x"), "rotary_dim": (0, 3, -2, "x"), "base": (float("nan"), 0.0, -1.0)}),
    Case("rlk_triton.ops.rope:rope_inv_freq", lambda d: dict(rotary_dim=16),
         bad={"rotary_dim": (0, 3, -2, "x"), "base": (float("nan"), 0.0, -1.0)}),
    Case("rlk_triton.ops.rope:rope_position_ids", lambda d: dict(cu_seqlens=_cu(d, [0, 2, 7]))),
    Case("rlk_triton.ops.embedding:embedding", lambda d: dict(token_ids=_i(d, 10, 6), weight=_f(d, 10, 8)),
         bad={"padding_idx": (2.5, "x", 10)}),
    Case("rlk_triton.ops.matmul:matmul", lambda d: dict(a=_f(d, 5, 8), b=_f(d, 8, 6, seed=2))),
]
BY_NAME = {c.fn: c for c in CASES}


def test_every_public_function_is_registered():
    missing = []
    for mod_name in PUBLIC_MODULES:
        mod = importlib.import_module(mod_name)
        for name in getattr(mod, "__all__", EXTRA_PUBLIC.get(mod_name, ())):
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and f"{mod_name}:{name}" not in BY_NAME:
                missing.append(f"{mod_name}:{name}")
    assert not missing, f"public functions without a bad-input case: {missing}"


def _outputs(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _outputs(r)]
    if hasattr(result, "__dataclass_fields__"):
        return [t for f in result.__dataclass_fields__ for t in _outputs(getattr(result, f))]
    return []


def _same(a, b):
    oa, ob = _outputs(a), _outputs(b)
    return len(oa) == len(ob) and all(x.shape == y.shape and torch.equal(x.nan_to_num(), y.nan_to_num())
                                      and torch.equal(x.isnan(), y.isnan()) for x, y in zip(oa, ob))


def _strided(x):
    """The same values with other strides: every other element of a twice-longer last dim."""
    wide = torch.zeros(*x.shape, 2, dtype=x.dtype, device=x.device)
    wide[..., 0] = x
    return wide[..., 0]


def _call(case, kwargs):
    return case.function()(**kwargs)


def _typed(exc, names):
    return isinstance(exc, errors.RlkError) and any(
        getattr(exc, "argument", None) == n or str(getattr(exc, "argument", "")).startswith(n + "[") for n in names)


def _variants(case, device):
    """(label, argument, kwargs, expectation) for every argument of the valid call."""
    kwargs = case.make(device)
    sig = inspect.signature(case.function())
    for name, value in kwargs.items():
        default = sig.parameters[name].default if name in sig.parameters else inspect.Parameter.empty
        yield f"{name}=str", name, {**kwargs, name: "x"}, "named"
        if default is not None and name not in case.nullable:
            yield f"{name}=None", name, {**kwargs, name: None}, "named"
        if not isinstance(value, torch.Tensor):
            continue
        other = torch.float64 if value.is_floating_point() else torch.float32
        yield f"{name} as {other}", name, {**kwargs, name: value.to(other)}, "returns-or-any-arg"
        yield f"{name} with a leading dim", name, {**kwargs, name: value[None]}, "returns-or-any-arg"
        if value.numel() > 1:
            yield f"{name} strided", name, {**kwargs, name: _strided(value)}, "same"
        if value.is_floating_point() and value.numel():
            for bad in (float("nan"), float("inf")):
                v = value.clone()
                v.view(-1)[0] = bad
                yield f"{name} holding {bad}", name, {**kwargs, name: v}, "returns-or-named"
    for name, values in case.bad.items():
        for bad in values:
            yield f"{name}={bad!r}", name, {**kwargs, name: bad}, "named"


@pytest.mark.parametrize("fn", [c.fn for c in CASES])
def test_bad_input_sweep(fn, device):
    case = BY_NAME[fn]
    params = list(inspect.signature(case.function()).parameters)
    reference = _call(case, case.make(device))
    problems = []
    for label, name, kwargs, expect in _variants(case, device):
        try:
            result = _call(case, kwargs)
        except errors.RlkError as e:
            if expect == "same" and not (isinstance(e, errors.LayoutError) and e.argument == name
                                         and kwargs[name].is_floating_point()):
                problems.append(f"{label}: {type(e).__name__}({e}) instead of the same result")
            elif expect in ("named", "returns-or-named") and not _typed(e, (name,)):
                problems.append(f"{label}: {type(e).__name__} names {getattr(e, 'argument', None)!r}, not {name!r}")
            elif expect == "returns-or-any-arg" and not _typed(e, params):
                problems.append(f"{label}: {type(e).__name__} names {getattr(e, 'argument', None)!r}")
            continue
        except Exception as e:  # noqa: BLE001 - the defect this sweep looks for
            problems.append(f"{label}: generic {type(e).__name__}: {str(e)[:160]}")
            continue
        if expect == "named":
            problems.append(f"{label}: accepted")
        elif expect == "same" and not _same(result, reference):
            problems.append(f"{label}: a different result from the same values")
    assert not problems, "\n".join(problems)
