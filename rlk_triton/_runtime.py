"""Where kernels run: the Triton interpreter on CPU, or a CUDA device."""
from __future__ import annotations

import os

import torch


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (TRITON_INTERPRET=1).

    The flag must be set before any module with ``@triton.jit`` is imported: Triton reads it
    when it decorates a kernel.
    """
    try:
        import triton.knobs as knobs  # triton >= 3.4

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_ARCH_BY_INDEX: dict = {}


def arch_of(device: torch.device) -> str:
    """The arch key of the locked-config table and the contracts: 'interpreter' or 'sm<major><minor>'.
    Cached per device index: it runs on every launch, where host time is the bottleneck of small ops."""
    if device.type == "cpu":
        return "interpreter"
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch = _ARCH_BY_INDEX.get(index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(index)
        arch = _ARCH_BY_INDEX[index] = f"sm{major}{minor}"
    return arch


def default_arch() -> str:
    """The arch this process would run kernels on."""
    if interpreter_active() or not torch.cuda.is_available():
        return "interpreter"
    return arch_of(torch.device("cuda", torch.cuda.current_device()))
