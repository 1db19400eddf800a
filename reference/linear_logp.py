"""float64 LM head + selected-token logp / entropy, and the gradients of hidden, weight and bias.

logits = hidden @ weight.T + bias (float64), then reference.logp on those logits:
  d logits = selected_logp_grad_reference(...)            [N, V]
  d hidden = d logits @ weight,  d weight = d logits.T @ hidden,  d bias = sum_rows d logits
"""
from __future__ import annotations

import numpy as np

from .logp import selected_logp_grad_reference, selected_logp_reference


def linear_logits64(hidden, weight, bias=None):
    x = np.asarray(hidden, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
    if bias is not None:
        x = x + np.asarray(bias, dtype=np.float64)
    return x


def linear_logp_reference(hidden, weight, target_ids, bias=None, temperature=1.0, ignore_index=-100):
    """(logp, entropy) float64 [N]."""
    return selected_logp_reference(linear_logits64(hidden, weight, bias), target_ids, temperature,
                                   ignore_index)


def linear_logp_grad_reference(hidden, weight, target_ids, grad_logp, grad_entropy=None, bias=None,
                               temperature=1.0, ignore_index=-100, flush_below=None):
    """(d hidden, d weight, d bias) float64 for loss = sum grad_logp * logp + sum grad_entropy * entropy,
    plus d logits (the input of the two products, for sensitivity estimates)."""
    h = np.asarray(hidden, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    d = selected_logp_grad_reference(linear_logits64(h, w, bias), target_ids, grad_logp, grad_entropy,
                                     temperature, ignore_index, flush_below)
    return d @ w, d.T @ h, d.sum(axis=0), d
