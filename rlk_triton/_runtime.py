"""Where kernels run: the Triton interpreter on CPU, or a CUDA device. Also the one parser of the
device and dtype arguments that users pass as strings, and the one range check of id tensors (the
host sync of validation)."""
from __future__ import annotations

import os
import warnings

import torch

from .errors import DeviceError, DTypeError

# The interpreter evaluates masked-off lanes in NumPy (log of 0, inf - inf, 0 * inf): RuntimeWarnings
# that are noise, not findings. Filtered for that one module only, so no other warning is hidden.
_INTERPRETER_MODULE = r"triton\.runtime\.interpreter\Z"
_noise_filtered = False


def quiet_interpreter_noise() -> None:
    """Ignore the interpreter's NumPy RuntimeWarnings (module triton.runtime.interpreter only). Idempotent."""
    global _noise_filtered
    if not _noise_filtered:
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=_INTERPRETER_MODULE)
        _noise_filtered = True


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (TRITON_INTERPRET=1).

    The flag must be set before any module with ``@triton.jit`` is imported: Triton reads it
    when it decorates a kernel. Every kernel module calls this at import, which is where the
    interpreter's warning filter gets installed.
    """
    try:
        import triton.knobs as knobs  # triton >= 3.4

        active = bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        active = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if active:
        quiet_interpreter_noise()
    return active


# ---- arguments given as strings ----

# Names people type for the dtypes rlk_triton deals in; any other torch dtype attribute name
# (float64, int32, ...) is accepted too and then judged by the contracts (which fail closed).
_DTYPE_ALIASES = {
    "bf16": torch.bfloat16, "bfloat": torch.bfloat16,
    "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "f32": torch.float32, "float": torch.float32,
    "fp64": torch.float64, "f64": torch.float64, "double": torch.float64,
}


def as_dtype(value, argument: str = "dtype") -> torch.dtype:
    """A torch.dtype from a torch.dtype or a name: 'bfloat16', 'bf16', 'torch.bfloat16', 'half', 'fp32', ...
    Raises DTypeError naming `argument` for anything else."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        dt = _DTYPE_ALIASES.get(key)
        if dt is None and key.isidentifier():
            dt = getattr(torch, key, None)
        if isinstance(dt, torch.dtype):
            return dt
    raise DTypeError(argument, f"{value!r} is not a dtype (for example bfloat16 / bf16, float16 / fp16 / half, "
                               "float32 / fp32 / float)")


def dtype_name(value, argument: str = "dtype") -> str:
    """The canonical name ('bfloat16') of a dtype given as a torch.dtype or any name as_dtype accepts."""
    return str(as_dtype(value, argument)).removeprefix("torch.")


def as_device(value, argument: str = "device") -> torch.device:
    """A torch.device from a torch.device, a string ('cpu', 'cuda', 'cuda:1') or a CUDA ordinal;
    DeviceError otherwise."""
    if isinstance(value, torch.device):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return torch.device("cuda", value)  # torch's convention: an int is a CUDA ordinal
    if isinstance(value, str):
        try:
            return torch.device(value.strip())
        except (RuntimeError, ValueError):
            pass
    raise DeviceError(argument, f"{value!r} is not a device (cpu, cuda or cuda:N)")


def cuda_unavailable_reason(device: torch.device):
    """Why `device` (type cuda) cannot be used here, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"no CUDA device {device.index}: torch.cuda.device_count() is {torch.cuda.device_count()}"
    return None


_ARCH_BY_INDEX: dict = {}


def arch_of(device, argument: str = "device") -> str:
    """The arch key of the locked-config table and the contracts: 'interpreter' or 'sm<major><minor>'.
    Cached per device index: it runs on every launch, where host time is the bottleneck of small ops.
    Raises DeviceError for a device this machine does not have or rlk_triton does not run on."""
    if not isinstance(device, torch.device):
        device = as_device(device, argument)
    if device.type == "cpu":
        return "interpreter"
    if device.type != "cuda":
        raise DeviceError(argument, f"{device.type}: rlk_triton runs on cuda, or on cpu under the Triton interpreter")
    index = device.index
    if index is None:
        if not torch.cuda.is_available():  # torch would raise AssertionError('Torch not compiled with CUDA enabled')
            raise DeviceError(argument, cuda_unavailable_reason(device))
        index = torch.cuda.current_device()
    arch = _ARCH_BY_INDEX.get(index)
    if arch is None:
        reason = cuda_unavailable_reason(torch.device("cuda", index))
        if reason is not None:
            raise DeviceError(argument, reason)
        major, minor = torch.cuda.get_device_capability(index)
        arch = _ARCH_BY_INDEX[index] = f"sm{major}{minor}"
    return arch


def default_arch() -> str:
    """The arch this process would run kernels on."""
    if interpreter_active() or not torch.cuda.is_available():
        return "interpreter"
    return arch_of(torch.device("cuda", torch.cuda.current_device()))


interpreter_active()  # installs the filter in processes that set TRITON_INTERPRET before importing rlk_triton


def shaped(t: torch.Tensor, shape) -> torch.Tensor:
    """t viewed as `shape`, or t itself when it has that shape already: a view costs 2-3 us of host time
    per call (more under autograd, which records it), and a public op's output usually has its
    input's shape."""
    return t if t.shape == shape else t.view(shape)


# Up to this many ids are range-checked on the host: one device-to-host copy, where the device check is
# about six kernel launches (compares, or, any) before its sync; a decode step's ids are that small.
HOST_CHECK_MAX_IDS = 256


def first_id_outside(ids: torch.Tensor, lo: int, hi: int, allowed: int | None = None):
    """(flat position, value) of the first element of the 1-D integer tensor `ids` outside [lo, hi) and
    not equal to `allowed`, or None. One host sync either way."""
    n = ids.numel()
    if n == 0:
        return None
    if n <= HOST_CHECK_MAX_IDS:
        vals = ids.tolist()
        if lo <= min(vals) and max(vals) < hi:
            return None
        for pos, v in enumerate(vals):
            if not lo <= v < hi and v != allowed:
                return pos, v
        return None
    bad = (ids < lo) | (ids >= hi)
    if allowed is not None:
        bad &= ids != allowed
    if not bool(bad.any()):
        return None
    pos = int(bad.nonzero()[0, 0])
    return pos, int(ids[pos])
