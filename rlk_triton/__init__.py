"""rlk_triton: batch-invariant Triton operators for LLM reinforcement learning.

Kernels are imported lazily: set TRITON_INTERPRET=1 before importing rlk_triton.logp on a machine
without a GPU.
"""
__version__ = "0.1.0"
