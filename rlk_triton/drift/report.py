"""Metrics, JSON layout and the stdout table of `rlk-triton drift`.

A group is one pair of executions of the same tokens: rollout logp and training logp per token,
aligned by key (sequence, position), plus optionally the layer-wise probe of the same two executions.
`measure_group` takes plain inputs, so any engine plugs in:

    rlk = measure_group("rlk", rollout_logp, train_logp, keys, dtype=torch.bfloat16, probe=probe_result)
    control = control_group(run_control(model, prompts, probe=True))
    report = build_report(control=control, rlk=rlk, model=describe_model(model), device=device_name(dev),
                          dtype=torch.bfloat16, seed=0)
    print(format_table(report)); json.dumps(report, allow_nan=False)

Every group is judged with rlk_triton.audit against the contract's bitwise law
(selected_logp / forward_invariance at the model's dtype): the question the command answers is
whether the two sides agree bit for bit, and the audit supplies the metrics (max / mean / p50-p99
|dlogp|, ratio0, clipfrac0, approx_kl0, the worst token).
"""
from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import audit
from ..errors import DTypeError, InputError, ShapeError
from ..probe import ProbeResult

SCHEMA_VERSION = 1


@dataclass
class GroupResult:
    """One group: the aligned per-token logps, their audit report, the probe, and extra comparisons."""
    name: str
    keys: torch.Tensor  # [N, 2] int64 (sequence, position)
    rollout_logp: torch.Tensor  # [N] on the CPU
    train_logp: torch.Tensor  # [N]
    report: audit.LogpAuditReport
    probe: ProbeResult | None = None
    variants: dict = field(default_factory=dict)  # {label: LogpAuditReport} of other pairs of executions

    @property
    def abs_dlogp(self) -> np.ndarray:
        """|train - rollout| per token, float64 (equal values, equal infinities included, give 0)."""
        t, r = self.train_logp.double().numpy(), self.rollout_logp.double().numpy()
        with np.errstate(invalid="ignore"):
            return np.where(t == r, 0.0, np.abs(t - r))

    @property
    def bitwise(self) -> bool:
        return bool(self.report.active) and self.report.exact == self.report.active

    def to_dict(self) -> dict:
        r = self.report
        return {
            **_block(r),
            "first_divergent_op": self.probe.first_divergent_op if self.probe else None,
            "ratio0": _jf(r.ratio0), "clipfrac0": _jf(r.clipfrac0), "approx_kl0": _jf(r.approx_kl0),
            "worst_token": r.worst.to_dict() if r.worst else None,
            "status": r.status,
            "variants": {k: _block(v) for k, v in self.variants.items()},
            "probe": self.probe.to_dict() if self.probe else None,
            "audit": r.to_dict(per_sample=False),
        }


def _block(r: audit.LogpAuditReport) -> dict:
    pct = r.percentiles or {}
    return {"tokens": r.active, "exact_tokens": r.exact, "bitwise": bool(r.active) and r.exact == r.active,
            "max_abs_dlogp": _jf(r.abs_max if r.abs_max is not None else None),
            "mean_abs_dlogp": _jf(r.abs_mean), "dlogp_mean": _jf(r.dlogp_mean),
            **{f"p{round(q * 100)}_abs_dlogp": _jf(pct.get(q)) for q in audit.QUANTILES}}


def _check_group_inputs(rollout_logp, train_logp, keys):
    for arg, x in (("rollout_logp", rollout_logp), ("train_logp", train_logp)):
        if not torch.is_tensor(x) or x.dtype not in (torch.float32, torch.float64):
            raise DTypeError(arg, f"must be a float32 (or float64) tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() != 1:
            raise ShapeError(arg, f"must be [N], one logp per token, got {tuple(x.shape)}")
    if train_logp.shape != rollout_logp.shape:
        raise ShapeError("train_logp", f"shape {tuple(train_logp.shape)} != rollout_logp's {tuple(rollout_logp.shape)}")
    if not torch.is_tensor(keys) or keys.is_floating_point() or keys.dtype == torch.bool:
        raise DTypeError("keys", "must be an integer tensor [N, 2] of (sequence, position)")
    if keys.shape != (rollout_logp.shape[0], 2):
        raise ShapeError("keys", f"must be [{rollout_logp.shape[0]}, 2], got {tuple(keys.shape)}")
    if keys.numel() and int(keys.min()) < 0:
        raise InputError("keys", "sequence and position must be >= 0")
    if len({tuple(k) for k in keys.tolist()}) != keys.shape[0]:
        raise InputError("keys", "a (sequence, position) appears twice")


def _grid(keys, *values):
    """[N] values on keys (sequence, position) -> [S, P] grids and the mask of the filled cells, so the
    audit's worst token reads as (sample = sequence, position)."""
    S = int(keys[:, 0].max()) + 1 if keys.numel() else 0
    P = int(keys[:, 1].max()) + 1 if keys.numel() else 0
    mask = torch.zeros(S, P, dtype=torch.bool)
    mask[keys[:, 0], keys[:, 1]] = True
    grids = []
    for v in values:
        g = torch.zeros(S, P, dtype=torch.float64)
        g[keys[:, 0], keys[:, 1]] = v.double()
        grids.append(g)
    return mask, grids


def _audit(rollout_logp, train_logp, keys, dtype, clip_range):
    mask, (t, r) = _grid(keys.long().cpu(), train_logp.cpu(), rollout_logp.cpu())
    return audit.compare_logp(t, r, mask, op="selected_logp", dtype=dtype, clip_range=clip_range,
                              expect_bitwise=True)


def measure_group(name: str, rollout_logp: torch.Tensor, train_logp: torch.Tensor, keys: torch.Tensor, *,
                  dtype, probe: ProbeResult | None = None, clip_range=0.2, variants: dict | None = None) -> GroupResult:
    """A group from plain inputs: rollout_logp, train_logp [N] float32, keys [N, 2] (sequence, position),
    dtype the model's (picks the contract row), probe the layer-wise ProbeResult of the same two
    executions or None. variants: {label: (rollout_or_other_logp, train_logp)} on the same keys,
    reported beside the main pair (e.g. the trainer alone vs batched)."""
    if not isinstance(name, str) or not name:
        raise InputError("name", f"must be a non-empty str, got {name!r}")
    _check_group_inputs(rollout_logp, train_logp, keys)
    if probe is not None and not isinstance(probe, ProbeResult):
        raise InputError("probe", f"must be a ProbeResult or None, got {type(probe).__name__}")
    keys = keys.long().cpu()
    extra = {}
    for label, pair in (variants or {}).items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise InputError("variants", f"{label}: must be a (rollout-side logp, train-side logp) pair")
        _check_group_inputs(pair[0], pair[1], keys)
        extra[label] = _audit(pair[0], pair[1], keys, dtype, clip_range)
    return GroupResult(name=name, keys=keys, rollout_logp=rollout_logp.detach().cpu(),
                       train_logp=train_logp.detach().cpu(),
                       report=_audit(rollout_logp, train_logp, keys, dtype, clip_range), probe=probe,
                       variants=extra)


def control_group(result, *, train: str = "train_batched", clip_range=0.2) -> GroupResult:
    """The control group from drift.control.run_control's result: rollout vs `train` ('train_batched',
    the trainer's usual batch, or 'train_alone'), with the other training execution as variants and the
    probe when the run recorded one."""
    if train not in ("train_batched", "train_alone"):
        raise InputError("train", f"must be 'train_batched' or 'train_alone', got {train!r}")
    other = "train_alone" if train == "train_batched" else "train_batched"
    t, o = getattr(result, f"{train}_logp"), getattr(result, f"{other}_logp")
    return measure_group("control", result.rollout_logp, t, result.keys, dtype=result.dtype,
                         probe=result.probe(train) if result.recordings else None, clip_range=clip_range,
                         variants={f"rollout_vs_{other}": (result.rollout_logp, o),
                                   f"{other}_vs_{train}": (o, t)})


# ---- context ----

def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for mod in ("triton", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    from .. import __version__ as rlk_version  # noqa: PLC0415

    out["rlk_triton"] = rlk_version
    return out


def describe_model(model, name: str | None = None) -> dict:
    """The model's identity for the report: its name (or path) and shape."""
    cfg = model.config
    return {"name": name or getattr(cfg, "name_or_path", None) or type(model).__name__,
            "architecture": type(model).__name__, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
            "q_heads": cfg.num_attention_heads, "kv_heads": getattr(cfg, "num_key_value_heads", None),
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "attn_implementation": getattr(cfg, "_attn_implementation", None)}


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def build_report(*, control: GroupResult, rlk: GroupResult | None, model, device: str, dtype, seed: int,
                 settings: dict | None = None) -> dict:
    """The JSON document: top-level model, device, dtype, seed, versions, config fingerprint, settings
    (temperature, max_new_tokens, ...), and a `control` and an `rlk` block (rlk None: not run)."""
    from .. import configs
    from .._runtime import default_arch

    if not isinstance(control, GroupResult):
        raise InputError("control", f"must be a GroupResult, got {type(control).__name__}")
    if rlk is not None and not isinstance(rlk, GroupResult):
        raise InputError("rlk", f"must be a GroupResult or None, got {type(rlk).__name__}")
    arch = default_arch()
    out = {
        "schema_version": SCHEMA_VERSION,
        "model": model, "device": device, "dtype": str(dtype).replace("torch.", ""), "seed": seed,
        "arch": arch, "config_fingerprint": configs.fingerprint(arch), "versions": versions(),
        "settings": settings or {},
        "distribution": "log_softmax(float32(logits) / T) over the full vocabulary at the sampled token",
        "control": control.to_dict(),
        "rlk": rlk.to_dict() if rlk is not None else None,
    }
    json.dumps(out, allow_nan=False)  # strict JSON, or fail here rather than in the caller's writer
    return out


# ---- stdout ----

def format_table(report: dict) -> str:
    """The report as a small fixed-width table, one row per group and comparison."""
    head = ("group", "comparison", "tokens", "bitwise", "max|dlogp|", "mean|dlogp|", "p99|dlogp|", "first divergent op")
    rows = []
    for name in ("control", "rlk"):
        g = report.get(name)
        if g is None:
            rows.append((name, "(not run)", "", "", "", "", "", ""))
            continue
        rows.append((name, "rollout vs train", str(g["tokens"]), "yes" if g["bitwise"] else "no",
                     _num(g["max_abs_dlogp"]), _num(g["mean_abs_dlogp"]), _num(g["p99_abs_dlogp"]),
                     g["first_divergent_op"] or ("-" if g["bitwise"] or g["probe"] is None else "(none)")))
        for label, v in g.get("variants", {}).items():
            rows.append(("", label.replace("_vs_", " vs ").replace("_", " "), str(v["tokens"]),
                         "yes" if v["bitwise"] else "no", _num(v["max_abs_dlogp"]), _num(v["mean_abs_dlogp"]),
                         _num(v["p99_abs_dlogp"]), ""))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    model = report["model"]
    title = (f"drift: {model.get('name') if isinstance(model, dict) else model} | {report['device']} | "
             f"{report['dtype']} | seed {report['seed']} | T {report['settings'].get('temperature', '?')}")
    out = [title, line(head), line(tuple("-" * w for w in widths)), *map(line, rows)]
    c = report["control"]
    if c.get("probe"):
        stages = ", ".join(f"{s['stage']} {_num(s['max_abs_diff'])}" for s in c["probe"]["stages"])
        out.append(f"control probe (max |diff| by stage): {stages}")
    return "\n".join(out)


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return "0" if v == 0 else f"{v:.3g}"


def _jf(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v
