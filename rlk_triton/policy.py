"""The fast / consistency mode policy: which backend runs an operator, as a structured decision.

Two orthogonal switches, from arguments or else the environment, else "off":
  fast         off | auto | strict      (RLK_FAST)         may rlk_triton run the op, and must it?
  consistency  off | audit | strict     (RLK_CONSISTENCY)  are rollout/trainer diagnostics on, must they hold?
and an operator allowlist (argument, else RLK_OPS="selected_logp,..."; unset or "*" = every op). A
string allowlist is one name or a comma list (never its characters); an entry that names no operator
raises InputError under fast=strict, and under fast=auto is warned (RlkFallbackWarning) and recorded
in the decision (requested.allowlist_unknown).

| fast   | consistency | behaviour |
|--------|-------------|-----------|
| off    | off         | the caller's native path; rlk_triton only answers queries |
| auto   | off         | the fastest available optimized backend; else warn and fall back to native |
| strict | off         | an optimized backend is required; error when none is available |
| off    | audit       | the caller's native path; diagnostics on |
| off    | strict      | the caller's native path; a contract row is required and checks must pass |
| auto   | audit       | as auto/off, diagnostics on |
| auto   | strict      | the fastest strict-eligible optimized backend, else the reference backend (warned), else error |
| strict | strict      | a strict-eligible optimized backend is required; error otherwise (no reference fallback) |

Precedence: (1) an argument beats the environment, which beats the default "off"; (2) an op outside
the allowlist is treated as fast=off (rlk_triton never runs it) while its consistency mode still
applies; (3) consistency audit/strict first requires the op's contract row for the dtype: a missing
row fails closed, whatever fast says; (4) then fast picks among the backends, fastest first.

"Fastest" is each backend's speed_rank, unless the caller says how the call runs: `rows` (the call's
rows: tokens, or sequences at decode) with `call="eager"` (the default) uses a backend's measured rank
for eager calls of at most that many rows (operators.RowsRank: the native kernels, whose launches
cost less host time, rank first for decode-sized calls). Under `call="cuda_graph"` host time is not
paid per call, so the plain ranks apply; under `call="compile"` backends that are eager only are not
eligible. Without `rows` nothing changes: the plain ranks.

Every resolution yields a Decision (JSON-serializable); a failed one raises PolicyError carrying it.

`dtype` is the dtype of the op's floating-point input: the logits for selected_logp; for the RL ops
(ratio_kl, policy_loss, gae, group_advantages) the per-token logp / rewards / scores, which are
float32 only: their contracts have a float32 row only and their backends declare float32 only. So
for an RL op with any other dtype (e.g. the model's bf16 passed by mistake), consistency audit/strict
fails closed (no contract row), fast=strict raises, and fast=auto falls back to the native path with
a warning; every candidate's reason says "dtype bfloat16 not supported (supports float32)".
Fallbacks are never silent: they are recorded in the decision and warned with RlkFallbackWarning.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Optional

import torch

from . import contracts, registry
from ._runtime import arch_of, dtype_name
from .errors import ContractError, DeviceError, InputError, PolicyError, RlkFallbackWarning

FAST_MODES = ("off", "auto", "strict")
CONSISTENCY_MODES = ("off", "audit", "strict")
CALLS = ("eager", "cuda_graph", "compile")  # how the op's calls will run (`call=`)
NATIVE = "native"


@dataclass
class Decision:
    op: str
    dtype: str
    device: str
    arch: Optional[str]  # None: this machine has no such device
    requested: dict
    candidates: list = field(default_factory=list)
    chosen: str = NATIVE
    contract_id: Optional[str] = None
    fallback: dict = field(default_factory=lambda: {"used": False, "reason": None})
    diagnostics: bool = False  # consistency audit/strict: compute rlk_triton.audit reports
    contract_checks_required: bool = False  # consistency strict: a failed audit is an error
    status: str = "ok"
    error: Optional[str] = None

    @property
    def uses_rlk(self) -> bool:
        return self.chosen != NATIVE

    @property
    def backend(self) -> Optional[str]:
        """The backend name to pass as `backend=` to the op, or None for the caller's native path."""
        return self.chosen.split(".", 1)[1] if self.uses_rlk else None

    @property
    def bits(self) -> str:
        """Whose bits the call gives: an admitted native kernel gives its op's Triton kernel's (its gate
        required torch.equal), so a rollout on one and a training step on the other compare as one build."""
        op, _, name = self.chosen.partition(".")
        return f"{op}.triton" if name == "cuda_native" else self.chosen

    def to_dict(self) -> dict:
        return asdict(self)


class DecisionLog:
    """Collects decision records, e.g. per training step: log.records() -> list of dicts."""

    def __init__(self):
        self._records = []

    def append(self, decision: Decision) -> None:
        self._records.append(decision.to_dict())

    def records(self) -> list:
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()


def _mode(value, env_name, allowed, env) -> tuple[str, str]:
    if value is not None:
        source, mode = "argument", value
    elif env.get(env_name):
        source, mode = f"env {env_name}", env[env_name]
    else:
        source, mode = "default", "off"
    mode = str(mode).strip().lower()
    if mode not in allowed:
        name = env_name if source.startswith("env") else env_name.removeprefix("RLK_").lower()
        raise InputError(name, f"{mode!r} is not one of {', '.join(allowed)} (from {source})")
    return mode, source


def _allowlist(allowlist, env) -> tuple[Optional[list], str]:
    """(sorted operator names, or None for every op; the argument or env var they came from).

    A string (the argument or RLK_OPS) is one name or a comma list, never its characters; empty or
    "*" means every op. Otherwise an iterable of names ("*" among them: every op)."""
    source, raw = ("allowlist", allowlist) if allowlist is not None else ("RLK_OPS", env.get("RLK_OPS", ""))
    if isinstance(raw, str):
        names = [x.strip() for x in raw.split(",") if x.strip()]
        if not names:
            return None, source
    else:
        try:
            names = list(raw)
        except TypeError:
            names = None
        if names is None or not all(isinstance(x, str) for x in names):
            raise InputError(source, f"must be an operator name, a comma list of names or an iterable of names, "
                                     f"got {raw!r}")
        names = [x.strip() for x in names]
    return (None if "*" in names else sorted(set(names))), source


def _rows_rank(backend: registry.Backend, rows: Optional[int], call: str):
    """The backend's measured rank (operators.RowsRank) for an eager call of `rows` rows, or None."""
    if rows is None or call != "eager":
        return None
    return next((r for r in backend.speed_rank_by_rows if rows <= r.max_rows), None)


def resolve(
    op: str,
    *,
    dtype,
    device=None,
    fast: Optional[str] = None,
    consistency: Optional[str] = None,
    allowlist: Optional[Iterable[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    log: Optional[DecisionLog] = None,
    rows: Optional[int] = None,
    call: str = "eager",
) -> Decision:
    """Decide which backend runs `op` for inputs of `dtype` (the logits' for selected_logp; float32 for
    the RL ops) on `device`. Raises PolicyError on failure.

    `dtype`: a torch.dtype or a name ('bfloat16', 'bf16', 'torch.bfloat16', 'half', ...), else DTypeError.
    `allowlist`: a name or comma list (a string, parsed like RLK_OPS), or an iterable of names; None
    reads RLK_OPS. Entries naming no operator: InputError under fast=strict, warned and recorded
    (requested.allowlist_unknown) otherwise.
    `device`: a string or torch.device (default: cuda if present, else cpu). A CUDA device this machine
    lacks resolves like any unavailable backend (every candidate says why), and consistency
    audit/strict fail closed on it: without the device its arch, hence its contract rows, are unknown.
    `rows`: the call's rows (an int >= 0), or None (unknown: the plain speed ranks). `call`: "eager"
    (default), "cuda_graph" (captured and replayed: host time is not paid per call) or "compile"
    (torch.compile: eager-only backends are not eligible)."""
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise InputError("rows", f"must be None or an int >= 0, got {rows!r}")
    if call not in CALLS:
        raise InputError("call", f"{call!r} is not one of {', '.join(CALLS)}")
    env = os.environ if env is None else env
    if not isinstance(env, Mapping):
        raise InputError("env", f"must be a mapping of environment variables, got {type(env).__name__}")
    if log is not None and not callable(getattr(log, "append", None)):
        raise InputError("log", f"must be a policy.DecisionLog (or have .append), got {type(log).__name__}")
    device = registry.device_str(device if device is not None else registry.default_device())
    fast_mode, fast_src = _mode(fast, "RLK_FAST", FAST_MODES, env)
    cons_mode, cons_src = _mode(consistency, "RLK_CONSISTENCY", CONSISTENCY_MODES, env)
    allowed, allow_src = _allowlist(allowlist, env)
    entry = registry.operator(op)
    known = {o.name for o in registry.operators()}
    unknown = [x for x in (allowed or ()) if x not in known]
    if unknown and fast_mode == "strict":  # a typo must not turn fast=strict into a silent native path
        raise InputError(allow_src, f"{unknown} name no operator (have: {sorted(known)}); fast=strict")
    dt = dtype_name(dtype)
    arch, no_device = None, None
    try:
        arch = arch_of(torch.device(device))
    except DeviceError as ex:  # a CUDA device this machine lacks resolves; other devices are errors
        if not device.startswith("cuda"):
            raise
        no_device = str(ex).removeprefix(f"{ex.argument}: ")
    d = Decision(op, dt, device, arch, requested={
        "fast": fast_mode, "consistency": cons_mode, "source": {"fast": fast_src, "consistency": cons_src},
        "allowlist": allowed, "rows": rows, "call": call})
    d.diagnostics = cons_mode != "off"
    d.contract_checks_required = cons_mode == "strict"
    if unknown:  # fast=auto / off: recorded, and warned under auto
        d.requested["allowlist_unknown"] = unknown
        if fast_mode == "auto":
            warnings.warn(f"rlk_triton {allow_src}: {unknown} name no operator (have: {sorted(known)}); "
                          "ignored, so the ops they meant run the native path", RlkFallbackWarning, stacklevel=2)
    effective_fast = fast_mode
    if allowed is not None and op not in allowed:
        effective_fast = "off"
        d.requested["allowlisted"] = False

    def fail(reason):
        d.status, d.error = "error", reason
        if log is not None:
            log.append(d)
        raise PolicyError(f"{op} ({dt} on {device}, fast={fast_mode}, consistency={cons_mode}): {reason}",
                          d.to_dict())

    if cons_mode != "off" and arch is None:
        fail(f"consistency={cons_mode} needs a contract row for the device's arch: {no_device}")
    if cons_mode != "off":
        try:
            d.contract_id = contracts.contract_id(entry.contract, dt, arch)
        except ContractError as ex:
            fail(f"consistency={cons_mode} needs a contract row: {ex}")
    else:
        try:  # without the device its arch overrides are unknown: no contract id
            d.contract_id = contracts.contract_id(entry.contract, dt, arch) if arch else None
        except ContractError:
            d.contract_id = None

    # each backend's static descriptor and what this process measured of it (registry.measured: the
    # policy does not need describe()'s contract ids and fingerprint, which cost most of a decision)
    backends = [(b, registry.measured(b, device), _rows_rank(b, rows, call)) for b in entry.backends]
    backends.sort(key=lambda x: x[2].rank if x[2] else x[0].speed_rank)
    need_strict = cons_mode == "strict"
    chosen, reasons = None, {}
    for b, m, rank in backends:
        bid = b.backend_id
        if effective_fast == "off":
            reasons[bid] = "not taken: fast=off, the caller's native path runs" + (
                " (op not in the allowlist)" if fast_mode != "off" else "") + (
                "" if m["available"] else f"; unavailable here: {m['unavailable_reason']}")
        elif not m["available"]:
            reasons[bid] = f"unavailable: {m['unavailable_reason']}"
        elif dt not in b.dtypes:
            reasons[bid] = f"dtype {dt} not supported (supports {', '.join(b.dtypes)})"
        elif need_strict and not m["strict_eligible"]:
            reasons[bid] = "not strict-eligible"
        elif not m["optimized"]:
            reasons[bid] = "not an optimized backend" + (f" ({m['notes']})" if m["notes"] else "")
        elif call == "compile" and b.eager_only:
            reasons[bid] = "eager only: not for call='compile' (torch.compile raises BackendError)"
        elif chosen is None:
            chosen = bid
            reasons[bid] = "taken: fastest eligible backend" + (
                f" for eager calls of at most {rank.max_rows} rows ({rank.report}: {rank.measured})" if rank else "")
        else:
            reasons[bid] = f"not taken: {chosen} is faster"
    if chosen is None and effective_fast == "auto" and need_strict:
        # auto/strict: the contract-preserving reference backend is the declared fallback
        for b, m, _ in backends:
            bid = b.backend_id
            if b.backend_class == "reference" and m["available"] and m["strict_eligible"] and dt in b.dtypes:
                chosen = bid
                reasons[bid] = "taken: contract-preserving reference fallback"
                d.fallback = {"used": True, "reason": "no strict-eligible optimized backend is available"}
                break
    d.candidates = [{"backend_id": b.backend_id, "class": b.backend_class, "available": m["available"],
                     "taken": b.backend_id == chosen, "reason": reasons[b.backend_id]} for b, m, _ in backends]
    if effective_fast != "off" and chosen is None:
        why = "; ".join(f"{c['backend_id']}: {c['reason']}" for c in d.candidates)
        if effective_fast == "strict" or need_strict:
            fail(f"no backend satisfies fast={fast_mode}, consistency={cons_mode}: {why}")
        d.fallback = {"used": True, "reason": f"no optimized backend is available; the caller's native path runs ({why})"}
    d.chosen = chosen or NATIVE
    if d.fallback["used"]:
        warnings.warn(f"rlk_triton {op}: {d.fallback['reason']} -> {d.chosen}", RlkFallbackWarning, stacklevel=2)
    if log is not None:
        log.append(d)
    return d
