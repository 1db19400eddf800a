"""What each operator is: its name, the contract that judges it, and its backends with what each
claims (dtypes, devices, autograd, invariance, determinism, speed rank). One table, the library's
own statement; the registry adds what it measures here (availability, the build fingerprint,
contract ids), the test harness (rlk_triton.testing.harness) adds how to check each claim.

Stable backend ids are "<op>.<backend>" ("selected_logp.triton", "selected_logp.torch_reference",
"rmsnorm.cuda_native"). Imports point one way: ops <- this table <- registry / policy <- testing <- cli.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

# native: a hand-written CUDA kernel, available only where `rlk-triton native admit` recorded it bitwise
# equal to the Triton kernel under this process's fingerprint (rlk_triton/native.py); strict-eligible
# exactly then; ranked ahead of the Triton kernel only where a report measures it faster (RowsRank).
BACKEND_CLASSES = ("production", "reference", "deterministic", "native")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class RowsRank:
    """A speed rank measured for eager calls of at most `max_rows` rows, which replaces the backend's
    `speed_rank` there: `report` is the committed report whose public-call rows show it (a test reads
    them), `measured` says what they show."""
    max_rows: int
    rank: int
    report: str
    measured: str


@dataclass(frozen=True)
class Backend:
    op: str
    name: str  # the backend's id inside its op; the stable id is f"{op}.{name}"
    implementation: str
    backend_class: str  # production | reference | deterministic
    strict_eligible: bool  # meets every judgment of its contract, invariance included
    optimized: bool  # counts as an optimized backend for fast=auto/strict
    speed_rank: int  # lower is faster (from docs/reports); orders candidates
    dtypes: tuple
    devices: str
    autograd: bool
    parallel_modes: tuple
    shape_ranges: dict
    batch_invariant: bool
    bitwise_deterministic: bool
    notes: str = ""
    # what the backward may keep (linear_logp's saved=): policy -> the parallel modes that support it;
    # empty where the op has no such choice. Anything else fails with a typed error naming `saved`.
    saved_state: tuple = ()
    # measured ranks for small eager calls (RowsRank, by increasing max_rows); the policy uses them when
    # told the call's rows and that it runs eagerly (host time counts: not under a CUDA graph)
    speed_rank_by_rows: tuple = ()
    eager_only: bool = False  # torch.compile raises BackendError: the policy never picks it for compiled calls

    @property
    def backend_id(self) -> str:
        return f"{self.op}.{self.name}"


@dataclass(frozen=True)
class Operator:
    name: str
    contract: str  # the contracts/<contract>.yaml that judges it
    backends: tuple


def _triton(op, kernels, devices, **claims) -> Backend:
    """The production Triton backend of op: strict-eligible, fastest, autograd, data-parallel unless told."""
    claims.setdefault("parallel_modes", ("data",))
    claims.setdefault("dtypes", DTYPES)
    return Backend(op, "triton", f"Triton {kernels}", "production", strict_eligible=True, optimized=True,
                   speed_rank=0, devices=devices, autograd=claims.pop("autograd", True),
                   batch_invariant=True, bitwise_deterministic=True, **claims)


NATIVE_SPEED_REPORT = "docs/reports/h200-native-2026-12-06.json"


def _native(op, kernels, shape_ranges, notes, faster_rows: RowsRank, passes="forward and backward") -> Backend:
    """The native CUDA backend of op: the Triton kernels' bits where admitted (docs/native.md);
    strict-eligible only then (the registry decides); ranked behind Triton but for the small eager
    calls where a report measured it faster."""
    return Backend(op, "cuda_native", f"CUDA {kernels} ({passes})", "native",
                   strict_eligible=False, optimized=True, speed_rank=1, dtypes=DTYPES,
                   devices="cuda sm90 with nvcc and a source checkout, after `rlk-triton native admit`",
                   autograd=True, parallel_modes=("data",), shape_ranges=shape_ranges, batch_invariant=True,
                   bitwise_deterministic=True, notes=f"the Triton kernels' bits where admitted (docs/native.md); {notes}",
                   speed_rank_by_rows=(faster_rows,), eager_only=True)


def _selected_logp() -> Operator:
    shapes = {"V": [1, 262144], "leading_dims": "any (up to two without a copy)", "rows": "any"}
    return Operator("selected_logp", "selected_logp", (
        _triton("selected_logp", "kernels, rlk_triton/ops/selected_logp.py",
                "cuda (tuned for sm90); cpu only under the Triton interpreter", shape_ranges=shapes),
        Backend("selected_logp", "torch_reference", "float64 torch, rlk_triton/ops/selected_logp_torch.py",
                "reference", strict_eligible=True, optimized=False, speed_rank=100, dtypes=DTYPES,
                devices="any torch device", autograd=True, parallel_modes=("data",), shape_ranges=shapes,
                batch_invariant=True, bitwise_deterministic=True,
                notes="slow; fixed 16-row chunks make every row's reductions one shape"),
        _native("selected_logp", "kernels native/selected_logp_kernels.cu",
                {"V": "1 .. 64 vocab chunks (524288 for 2-byte logits, 262144 for float32)",
                 "leading_dims": "any that view as [N, V] (dense row strides)", "rows": "any"}, "eager only; the indexed variant too",
                RowsRank(64, -1, NATIVE_SPEED_REPORT, "selected_logp(backend=...), bf16 V 151936, 1-64 rows: 36-37 "
                         "against Triton's 69-71 us wall; at 4096 rows 442 against 434 us")),
    ))


def _linear_logp() -> Operator:
    return Operator("linear_logp", "linear_logp", (_triton(
        "linear_logp", "kernels, rlk_triton/ops/linear_logp.py",
        "cuda (tuned for sm90); cpu only under the Triton interpreter", parallel_modes=("data", "tensor_vocab"),
        shape_ranges={"H": "any", "V_local": "any >= 1", "tokens": "any"},
        saved_state=(("recompute", ("data", "tensor_vocab")), ("logits", ("data", "tensor_vocab"))),
        notes="logp, entropy, d hidden batch-invariant; d weight / d bias deterministic; TP bitwise when "
              "shards start at multiples of chunk_v (docs/linear_logp.md); saved='logits' keeps z - tile max "
              "[N, V] (float16 for 16-bit inputs) instead of recomputing the logits, same logp bits; with "
              "saved_vocab=S only the first S columns (whole chunks)"),))


def _matmul() -> Operator:
    return Operator("matmul", "matmul", (_triton(
        "matmul", "kernel, rlk_triton/ops/matmul.py", "cuda (tuned for sm90); cpu only under the Triton interpreter",
        shape_ranges={"M": "any", "N": "any", "K": "any"},
        notes="rows of out and d a batch-invariant; d b / d bias deterministic"),))


def _rmsnorm() -> Operator:
    return Operator("rmsnorm", "rmsnorm", (_triton(
        "rmsnorm", "kernels, rlk_triton/ops/rmsnorm.py", "cuda; cpu only under the Triton interpreter",
        shape_ranges={"H": [1, "any (one tile up to 16384 on CUDA)"], "leading_dims": "any", "rows": "any"},
        notes="y, residual and d x are batch-invariant per row; d weight sums over the batch on a fixed "
              "row partition: run-to-run deterministic, no atomics"),
        _native("rmsnorm", "kernels native/rmsnorm_kernels.cu",
                {"H": "one tile with a lane per thread (128..16384 on sm90)",
                 "residual": "optional (one fused layout refused: docs/native.md)", "weight": "x's dtype"},
                "eager only",
                RowsRank(1024, -1, NATIVE_SPEED_REPORT, "rms_norm(backend=...) forward, bf16 H 4096, 1-1024 rows, with "
                         "or without the residual: 28-33 against Triton's 36-45 us wall (the backward launch at "
                         "1024 rows: 33 / 50 against 43 / 53 us); at 16384 rows 71-143 against 69-136 us")),
    ))


def _swiglu() -> Operator:
    return Operator("swiglu", "swiglu", (_triton(
        "swiglu", "kernels, rlk_triton/ops/swiglu.py", "cuda; cpu only under the Triton interpreter",
        shape_ranges={"I": [0, "any"], "leading_dims": "any", "rows": "any"}, notes="elementwise"),))


def _rope() -> Operator:
    return Operator("rope", "rope", (_triton(
        "rope", "kernel, rlk_triton/ops/rope.py", "cuda (untuned configs); cpu only under the Triton interpreter",
        shape_ranges={"tokens": "any", "head_dim": "any even rotary dim <= head_dim",
                      "layouts": "[..., H, D], any token / head strides"},
        notes="fp32 tables from rope_tables (float64 on the host, rounded once)"),))


def _embedding() -> Operator:
    return Operator("embedding", "embedding", (_triton(
        "embedding", "kernels, rlk_triton/ops/embedding.py",
        "cuda (untuned configs); cpu only under the Triton interpreter",
        shape_ranges={"tokens": "any", "V": "any", "H": "any"},
        notes="dW: sorted segment sums in ascending token order, no atomics"),))


def _attention() -> Operator:
    return Operator("attention", "attention", (_triton(
        "attention", "kernels, rlk_triton/ops/attention.py", "cuda (untuned); cpu only under the Triton interpreter",
        parallel_modes=("data", "context_chained"),
        shape_ranges={"head_dim": "power of two in [16, 256] (GPU tuned: 64, 128)", "tokens": "any",
                      "heads": "Hkv divides Hq"},
        notes="varlen causal / full; out, LSE and dq / dk / dv pack-invariant; paged decode bitwise equal to "
              "training; CP bitwise by chaining attention_partial states (docs/attention.md)"),))


def _rl(op, contract, kernels, autograd, shapes, invariance_note) -> Operator:
    """An RL operator: fp32 only (per-token logp, advantages and rewards are fp32: the contracts' only
    row), a Triton backend and the float64 torch reference backend."""
    common = dict(dtypes=("float32",), autograd=autograd, parallel_modes=("data",), shape_ranges=shapes,
                  batch_invariant=True, bitwise_deterministic=True)
    return Operator(op, contract, (
        Backend(op, "triton", f"Triton kernels, {kernels}", "production", strict_eligible=True, optimized=True,
                speed_rank=0, devices="cuda (tuned for sm90); cpu only under the Triton interpreter",
                notes=invariance_note, **common),
        Backend(op, "torch_reference", "float64 torch rounded once, rlk_triton/ops/rl_torch.py", "reference",
                strict_eligible=True, optimized=False, speed_rank=100, devices="cuda or cpu (any torch build)",
                notes=f"slow; fixed-shape row sums (16-row chunks x 256-token tiles). {invariance_note}".strip(),
                **common),
    ))


def _rl_operators() -> list:
    bt = {"B": "any", "T": "< 2^24", "B*T": "< 2^31"}
    per_token = ("per-token values and gradients bitwise independent of the other rows; "
                 "the scalar loss's gradient too when a normalizer is passed")
    return [
        _rl("ratio_kl", "rl_losses", "rlk_triton/ops/rl_losses.py", True, bt, ""),
        _rl("policy_loss", "rl_losses", "rlk_triton/ops/rl_losses.py", True, bt, per_token),
        _rl("gae", "advantages", "rlk_triton/ops/advantages.py", False, bt, "per row"),
        _rl("group_advantages", "advantages", "rlk_triton/ops/advantages.py", False,
            {"B": "any", "num_groups": "any"},
            "per group: a group's values depend on its own members and their order only"),
        _rl("gspo_loss", "rl_losses", "rlk_triton/ops/gspo.py", True, bt,
            "per sequence: a sequence's term and its d logp / d entropy are bitwise its own when "
            "a normalizer is passed"),
        _rl("reinforce_pp_baseline", "advantages", "rlk_triton/ops/advantages.py (group means) + torch whitening",
            False, {"B": "any", "T": "< 2^24", "num_groups": "any"},
            "per group when token_mean / token_std are passed; otherwise the whitening "
            "statistics are the batch's, as the math says"),
        _rl("rollout_correction", "rl_losses", "rlk_triton/ops/rollout_correction.py", False, bt,
            "per sequence: a sequence's weights and keep mask are bitwise its own"),
        _rl("masked_whiten", "advantages", "rlk_triton/ops/advantages.py", False, bt,
            "per row when mean / var are passed; otherwise the statistics are the batch's, as the math says"),
    ]


def operators() -> list[Operator]:
    """Every operator's descriptor, in a fixed order."""
    return list(_table())


@functools.lru_cache(maxsize=None)
def _table() -> tuple:
    """Built once: every policy decision reads it (frozen descriptors; describe() copies them out)."""
    return (_selected_logp(), _linear_logp(), _matmul(), _rmsnorm(), _swiglu(), _rope(), _embedding(),
            _attention(), *_rl_operators())
