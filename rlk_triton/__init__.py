"""rlk_triton: batch-invariant Triton operators for LLM reinforcement learning.

Kernels are imported lazily: set TRITON_INTERPRET=1 before importing rlk_triton.logp on a machine
without a GPU.
"""
__version__ = "0.1.0"


def capabilities(device=None) -> list:
    """Descriptors of every backend of every operator on `device`, availability measured here.

    JSON-serializable; see rlk_triton.registry and docs/consistency.md.
    """
    from .registry import capabilities as _capabilities

    return _capabilities(device)
