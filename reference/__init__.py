"""NumPy float64 ground truth. Slow, obviously right; installed as rlk_triton.reference."""
from .linear_logp import linear_logp_grad_reference, linear_logp_reference
from .logp import selected_logp_reference, selected_logp_grad_reference

__all__ = ["selected_logp_reference", "selected_logp_grad_reference", "linear_logp_reference",
           "linear_logp_grad_reference"]
