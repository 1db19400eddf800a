"""rlk_triton: batch-invariant Triton operators for LLM reinforcement learning.

Kernels are imported lazily: set TRITON_INTERPRET=1 before importing rlk_triton.logp on a machine
without a GPU.
"""
__version__ = "0.1.0"

# Submodules load on first attribute access (PEP 562), so `import rlk_triton` stays cheap and
# imports no kernel: `rlk_triton.attention(q, k, v, cu_seqlens)` works without a separate import.
_LAZY_SUBMODULES = ("advantages", "attention", "audit", "configs", "contracts", "errors", "logp", "losses", "packing",
                    "policy", "registry")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def capabilities(device=None) -> list:
    """Descriptors of every backend of every operator on `device`, availability measured here.

    JSON-serializable; see rlk_triton.registry and docs/consistency.md.
    """
    from .registry import capabilities as _capabilities

    return _capabilities(device)
