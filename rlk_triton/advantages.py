"""Advantage estimators for RL: GAE as a parallel scan, group-normalized advantages (GRPO, RLOO),
the REINFORCE++ baseline. Outputs are float32 constants to autograd (no backward).

    from rlk_triton.advantages import gae, group_advantages, reinforce_pp_baseline
    adv, ret = gae(rewards, values, response_mask, gamma=1.0, lam=0.95)      # [B, T]
    adv = group_advantages(scores, group_ids, num_groups=G, mode="mean_std")  # [B], GRPO

Groups are always explicit: group_ids [B] in [0, num_groups). Per-sequence and per-token values
depend only on the rows and the group ids passed in; every kernel has a fixed reduction order
(rlk_triton/ops/advantages.py), so the results are bitwise reproducible and batch-invariant per
row (GAE) or per group (group statistics). docs/advantages.md has the math and edge cases.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ._runtime import first_id_outside
from .errors import DeviceError, DTypeError, InputError, ShapeError
from .losses import BACKENDS, _check_backend
from .losses import _check_device as _check_tensor_device
from .ops import advantages as _ops
from .ops import rl_torch as _torch_reference

GROUP_MODES = tuple(_ops.MODES)
SINGLETONS = ("zero", "raw")  # a group of one valid member: advantage 0, or baseline 0 / std 1 (the raw score)
EPS_PLACEMENTS = ("std", "var")  # (x - mean) / (std + eps), or (x - mean) * rsqrt(var + eps)

__all__ = ["gae", "group_advantages", "reinforce_pp_baseline", "masked_whiten", "GROUP_MODES", "SINGLETONS",
           "EPS_PLACEMENTS", "BACKENDS"]


def gae(rewards, values, mask=None, *, gamma: float, lam: float, bootstrap_values=None, backend: str = "triton"):
    """Generalized advantage estimation over the active tokens of each row.

    rewards, values: float32 [B, T]; mask: bool / 0-1 [B, T] (None: all active). Masked tokens are
    transparent and get 0. bootstrap_values: [B], the value past each row's last active token
    (None: 0, a finished sequence). Returns (advantages, returns) float32 [B, T].
    backend: "triton" (the scan kernel) or "torch_reference" (float64 torch, a reverse loop over
    time, rounded once: any device, slow, same contract).
    """
    _check_backend(backend)
    _float2("rewards", rewards)
    _float2("values", values, like=rewards)
    for name, x in (("gamma", gamma), ("lam", lam)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not 0.0 <= x <= 1.0:
            raise InputError(name, f"must be a number in [0, 1], got {x!r}")
    m = _mask("mask", mask, rewards.shape, rewards.device, for_kernel=backend == "triton")
    B = rewards.shape[0]
    boot = None if bootstrap_values is None else _vector("bootstrap_values", bootstrap_values, B, rewards.device)
    _check_tensor_device("rewards", rewards, backend)
    if backend == "torch_reference":
        if boot is None:
            boot = torch.zeros(B, dtype=torch.float32, device=rewards.device)
        return _torch_reference.gae(rewards.float().contiguous(), values.float().contiguous(), m, boot, gamma, lam)
    # no bootstrap values: the kernel takes 0 (no [B] of zeros to fill)
    return _ops.launch_gae(rewards.float().contiguous(), values.float().contiguous(), m, boot, gamma, lam)


def group_advantages(scores, group_ids, *, num_groups: int, mode: str = "mean_std", valid=None,
                     eps: float = 1e-6, singleton: str = "zero", validate: bool = True, backend: str = "triton"):
    """Per-sequence advantages normalized within explicit groups (GRPO: the samples of one prompt).

    scores: float32 [B]; group_ids: int [B] in [0, num_groups); valid: bool [B] (None: all).
    mode: "mean" (s - mean), "mean_std" ((s - mean) / (std + eps), unbiased std as torch.std),
    "rloo" (s - mean of the other members). A group with one valid member, a group whose scores are
    all equal (in every mode, whatever eps), and every invalid row get 0; so does a group with
    std + eps == 0 (eps=0 allowed): never NaN from finite scores. Returns float32 [B].
    eps: a finite number >= 0.
    singleton: the rule for a group with one valid member: "zero" (default: no baseline to compare
        with, advantage 0) or "raw" (verl's loop estimators: baseline 0 and std 1, so "mean" and
        "rloo" give the raw score s and "mean_std" gives s / (1 + eps)).
    validate: check on the host that group_ids lie in [0, num_groups) (and that a floating-point
        `valid` holds only 0 / 1). It costs a device sync per call; with validate=False nothing is
        checked on the host: a row whose group id is out of range is treated as invalid (it gets 0
        and joins no group), and a floating-point `valid` counts nonzero as valid.
    backend: "triton" (the kernels) or "torch_reference" (float64 torch, rounded once: any device,
        slow, same contract; it syncs once to size its [groups, members] matrix).
    """
    _check_backend(backend)
    if mode not in GROUP_MODES:
        raise InputError("mode", f"{mode!r} is not one of {', '.join(GROUP_MODES)}")
    _choice("singleton", singleton, SINGLETONS)
    s, g, ok = _group_inputs(scores, group_ids, num_groups, valid, validate, backend)
    eps = _eps(eps)
    if backend == "torch_reference":
        return _torch_reference.group_advantages(s, g, ok, num_groups, mode, eps, singleton)
    return _ops.launch_group_advantages(s, g, ok, num_groups, mode, eps, singleton)[0]


def reinforce_pp_baseline(scores, group_ids, mask, *, num_groups: int, valid=None, eps: float = 1e-6,
                          token_mean: Optional[float] = None, token_std: Optional[float] = None,
                          singleton: str = "zero", eps_placement: str = "std",
                          validate: bool = True, backend: str = "triton"):
    """REINFORCE++ with a group baseline: a_i = s_i - mean of its group, broadcast to the active
    tokens of sequence i, then whitened over all active tokens: (a - mean) / (std + eps).

    singleton: "zero" (default: a group of one gets a_i = 0) or "raw" (baseline 0: a_i = s_i, verl's).
    eps_placement: "std" (default: / (std + eps)) or "var" (* rsqrt(var + eps), verl's masked_whiten,
    which uses eps = 1e-8); token_std is the std either way (var = token_std^2).

    mask: bool / 0-1 [B, T], required (it gives the output its T). eps: a finite number >= 0; where
    std + eps == 0 (no spread, eps=0) every token gets 0. The whitening statistics are batch-level:
    by default over this batch's active tokens (float64, unbiased std); a framework that normalizes
    globally (across ranks) passes token_mean and token_std (both or neither): numbers (finite;
    token_std >= 0), or 1-element tensors on scores' device, checked on the host when validate is
    on (one more sync); with validate=False a non-finite tensor, or a negative token_std, makes
    every output NaN. Returns float32 [B, T], 0 on masked tokens. validate and backend as in
    group_advantages (the torch reference keeps the baseline in float64 until the one rounding).
    """
    _check_backend(backend)
    s, g, ok = _group_inputs(scores, group_ids, num_groups, valid, validate, backend)
    if not torch.is_tensor(mask):
        raise DTypeError("mask", f"must be a bool or 0/1 tensor [B, T] (it gives the output its T), "
                                 f"got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ShapeError("mask", f"must be [B, T], got {tuple(mask.shape)}")
    m = _mask("mask", mask, (s.shape[0], mask.shape[1]), s.device, validate)
    eps = _eps(eps)
    _choice("singleton", singleton, SINGLETONS)
    _choice("eps_placement", eps_placement, EPS_PLACEMENTS)
    token_mean = _token_stat("token_mean", token_mean, s.device, validate)
    token_std = _token_stat("token_std", token_std, s.device, validate, nonnegative=True)
    if (token_mean is None) != (token_std is None):
        raise InputError("token_std" if token_std is None else "token_mean",
                         "pass both token_mean and token_std, or neither")
    if backend == "torch_reference":
        a = _torch_reference.group_advantages64(s, g, ok, num_groups, "mean", 0.0, singleton)
    else:
        a = _ops.launch_group_advantages(s, g, ok, num_groups, "mean", 0.0, singleton)[0]
    tokens = (m != 0) & (ok != 0)[:, None]
    if token_mean is None:
        per_row = tokens.sum(1).double()
        n = per_row.sum()
        mean = (per_row * a.double()).sum() / n.clamp_min(1)
        var = (per_row * (a.double() - mean) ** 2).sum() / (n - 1).clamp_min(1)
        token_mean, token_std = mean, var.sqrt()
    std = torch.as_tensor(token_std, dtype=torch.float64, device=s.device)
    den = std + eps if eps_placement == "std" else torch.sqrt(std * std + eps)
    out = (a.double()[:, None] - token_mean) / torch.where(den != 0, den, 1.0)
    out = torch.where(den != 0, out, 0.0)  # std + eps == 0 (no spread, eps=0): 0, not 0 / 0
    return torch.where(tokens, out, 0.0).float()


def masked_whiten(values, mask=None, *, shift_mean: bool = True, unbiased: bool = True, eps: float = 1e-8,
                  eps_placement: str = "var", mean=None, var=None, backend: str = "triton"):
    """Whiten values over the active tokens of the batch: (v - mean) / den, den = sqrt(var + eps)
    (eps_placement "var", verl's masked_whiten: * rsqrt(var + 1e-8)) or sqrt(var) + eps ("std").

    values: float [B, T] (read as fp32); mask: bool / 0-1 [B, T] (None: all active). mean and var are
    over the active tokens, var unbiased (n - 1) unless unbiased=False; shift_mean=False adds the mean
    back (verl's option). Masked tokens get 0; no active token, or one with unbiased (var 0), gives 0;
    den == 0 (no spread and eps = 0) gives 0, never 0 / 0. A framework that whitens globally (across
    ranks) passes mean and var (both or neither: finite numbers, var >= 0): each row's output then
    depends on that row alone (batch-invariant); otherwise the statistics are the batch's, as the
    math says. Returns float32 [B, T], a constant to autograd.

    Kernels (rlk_triton/ops/advantages.py): row sums in BLOCK_T tiles in order, one program folding
    the rows in order (mean, then the squared deviations from it), an elementwise apply; the torch
    reference backend is float64 with the same fixed-shape sums, rounded once.
    """
    _check_backend(backend)
    _float2("values", values)
    m = _mask("mask", mask, values.shape, values.device, for_kernel=backend == "triton")
    _check_tensor_device("values", values, backend)
    if not isinstance(shift_mean, bool):
        raise InputError("shift_mean", f"must be a bool, got {shift_mean!r}")
    if not isinstance(unbiased, bool):
        raise InputError("unbiased", f"must be a bool, got {unbiased!r}")
    eps = _eps(eps)
    _choice("eps_placement", eps_placement, EPS_PLACEMENTS)
    for name, x in (("mean", mean), ("var", var)):
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                              or (name == "var" and x < 0)):
            raise InputError(name, f"must be a finite number{' >= 0' if name == 'var' else ''}, got {x!r}")
    if (mean is None) != (var is None):
        raise InputError("var" if var is None else "mean", "pass both mean and var, or neither")
    stats = None
    if mean is not None:
        den = math.sqrt(var + eps) if eps_placement == "var" else math.sqrt(var) + eps
        stats = torch.tensor([float(mean), float(var), den], dtype=torch.float32, device=values.device)
    v = values.float().contiguous()
    if backend == "torch_reference":
        return _torch_reference.masked_whiten(v, m, stats, shift_mean, unbiased, eps, eps_placement == "var")[0]
    return _ops.launch_masked_whiten(v, m, stats, shift_mean, unbiased, eps, eps_placement == "var")[0]


# ---- validation ----


def _choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise InputError(name, f"{value!r} is not one of {', '.join(choices)}")


def _eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise InputError("eps", f"must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _token_stat(name, x, device, validate, nonnegative=False):
    """token_mean / token_std: None, a float, or a float64 0-dim tensor on `device`. A tensor is
    checked on the host only with validate; otherwise a bad value becomes NaN (every output NaN)."""
    if x is None:
        return None
    need = "a finite number >= 0" if nonnegative else "a finite number"
    if torch.is_tensor(x):
        if x.numel() != 1:
            raise ShapeError(name, f"must hold one number, got shape {tuple(x.shape)}")
        if x.dtype == torch.bool or x.dtype.is_complex:
            raise DTypeError(name, f"dtype {x.dtype} is not a real number type")
        if x.device != device:
            raise DeviceError(name, f"on {x.device}, scores on {device}")
        v = x.detach().reshape(()).double()
        ok = torch.isfinite(v) & (v >= 0) if nonnegative else torch.isfinite(v)
        if validate and not bool(ok):  # host sync of validation
            raise InputError(name, f"must be {need}, got {v.item()!r}")
        return torch.where(ok, v, torch.nan)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (nonnegative and x < 0):
        raise InputError(name, f"must be {need} or a 1-element tensor, got {x!r}")
    return float(x)


def _float2(name, x, like=None):
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise DTypeError(name, f"must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != 2:
        raise ShapeError(name, f"must be [B, T], got {tuple(x.shape)}")
    if like is not None:
        if x.shape != like.shape:
            raise ShapeError(name, f"shape {tuple(x.shape)} != rewards' {tuple(like.shape)}")
        if x.device != like.device:
            raise DeviceError(name, f"on {x.device}, rewards on {like.device}")


# Mask dtypes the kernels read as they are (each load tests != 0): no conversion launches before the
# kernel, which for GAE's one launch were two thirds of the host time (issue 20).
KERNEL_MASK_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32)


def _mask(name, mask, shape, device, validate=True, for_kernel=False):
    """The checked mask as uint8 0 / 1, or with for_kernel (what the kernels take) a mask of
    KERNEL_MASK_DTYPES as it is, contiguous: nonzero is active either way."""
    if mask is None:
        return torch.ones(shape, dtype=torch.uint8, device=device)
    if not torch.is_tensor(mask):
        raise DTypeError(name, "must be a bool or 0/1 tensor")
    if validate and mask.is_floating_point() and not bool(((mask == 0) | (mask == 1)).all()):  # host sync
        raise DTypeError(name, "must be a bool or 0/1 tensor")
    if tuple(mask.shape) != tuple(shape):
        raise ShapeError(name, f"shape {tuple(mask.shape)} != {tuple(shape)}")
    if mask.device != device:
        raise DeviceError(name, f"on {mask.device}, expected {device}")
    if for_kernel and mask.dtype in KERNEL_MASK_DTYPES:
        return mask.contiguous()
    return (mask != 0).to(torch.uint8).contiguous()


def _vector(name, x, n, device):
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise DTypeError(name, "must be a floating-point tensor")
    if tuple(x.shape) != (n,):
        raise ShapeError(name, f"must be [{n}], got {tuple(x.shape)}")
    if x.device != device:
        raise DeviceError(name, f"on {x.device}, expected {device}")
    return x.float().contiguous()


def _group_inputs(scores, group_ids, num_groups, valid, validate=True, backend="triton"):
    """(scores fp32, group ids int32 / int64 as given, valid: nonzero = valid); with validate=False
    out-of-range ids become invalid rows (valid is then bool). A valid of KERNEL_MASK_DTYPES reaches
    the kernels as it is and the ids keep their dtype: no conversion launches."""
    if not torch.is_tensor(scores) or not scores.is_floating_point() or scores.dim() != 1:
        raise DTypeError("scores", "must be a 1-D floating-point tensor [B]")
    if not torch.is_tensor(group_ids) or group_ids.dtype not in (torch.int32, torch.int64):
        raise DTypeError("group_ids", "must be an int32 / int64 tensor")
    if tuple(group_ids.shape) != tuple(scores.shape):
        raise ShapeError("group_ids", f"shape {tuple(group_ids.shape)} != scores' {tuple(scores.shape)}")
    if group_ids.device != scores.device:
        raise DeviceError("group_ids", f"on {group_ids.device}, scores on {scores.device}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise InputError("num_groups", f"must be an int >= 0, got {num_groups!r}")
    _check_tensor_device("scores", scores, backend)
    if validate and first_id_outside(group_ids, 0, num_groups) is not None:  # the host sync of validation
        raise InputError("group_ids", f"ids must lie in [0, num_groups={num_groups})")
    if not validate:  # an out-of-range id: an invalid row, no sync
        in_range = (group_ids >= 0) & (group_ids < num_groups)
        if valid is None:
            ok = in_range
        else:
            ok = _mask("valid", valid, scores.shape, scores.device, validate, for_kernel=True)
            ok = in_range & (ok if ok.dtype == torch.bool else ok != 0)
    else:
        ok = _mask("valid", valid, scores.shape, scores.device, validate, for_kernel=backend == "triton")
    return scores.float().contiguous(), group_ids.contiguous(), ok
