"""Stand-ins for Triton's compiled-kernel launchers, for checking and timing rlk_triton.ops.launch
without a GPU (tests/test_launch.py, scripts/host_calls_cpu.py).

`descriptor_wrapper` is Triton 3.6's per-launch descriptor wrapper (backends/nvidia/driver.py,
wrap_handle_tensordesc) as that release writes it, made with a given `make_tensordesc_arg`: the
function ops.launch.DescriptorLaunch recognises by its shape and takes over."""
from __future__ import annotations

from typing import Callable, Sequence

_WRAPPER_SOURCE = """
def wrap_handle_tensordesc(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):
        final_args = list(args[:_BASE_ARGS_FORMAT_LEN])
        tensordesc_idx = 0
        for i, arg in enumerate(args[_BASE_ARGS_FORMAT_LEN:]):
            if i in tensordesc_indices:
                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[tensordesc_idx]))
                tensordesc_idx += 1
            else:
                final_args.append(arg)
        return launcher(*final_args)
    return inner
"""


def descriptor_wrapper(c_launch: Callable, positions: Sequence[int], metas: Sequence, make_arg: Callable,
                       meta_name: str = "tensordesc_meta") -> Callable:
    """Triton 3.6's wrapper around the C launcher `c_launch` for descriptors at kernel argument
    `positions` with metadata `metas`, encoding each with `make_arg(descriptor, metadata)`.
    meta_name: the name the wrapper closes over for the metadata (another name: a launcher of another
    shape, which ops.launch must leave alone)."""
    space = {"_BASE_ARGS_FORMAT_LEN": 13, "make_tensordesc_arg": make_arg}
    exec(_WRAPPER_SOURCE.replace("tensordesc_meta", meta_name), space)  # noqa: S102 - a fixed source
    return space["wrap_handle_tensordesc"](c_launch, set(positions), list(metas))
