"""The reusable parity and invariance harness. Public: frameworks and later operators reuse it.

- invariance.RowOp / check_batch_invariance: the bitwise batch-invariance axes for any row-wise op.
- parity: seeded cases for each registered op, judged against contracts/.
"""
from .invariance import InvarianceFailure, RowOp, assert_batch_invariant, check_batch_invariance

__all__ = ["RowOp", "check_batch_invariance", "assert_batch_invariant", "InvarianceFailure"]
