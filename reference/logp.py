"""float64 selected-token log-probabilities, entropy and their gradients.

x = logits / T (float64), lse = logsumexp(x), p = softmax(x)
  logp    = x[target] - lse                      (0 where target == ignore_index)
  entropy = -sum p log p = lse - sum p x
  d logp / d logits_j    = (onehot_j - p_j) / T
  d entropy / d logits_j = -p_j (log p_j + entropy) / T
"""
from __future__ import annotations

import numpy as np


def _scaled(logits, temperature):
    x = np.asarray(logits, dtype=np.float64)
    t = np.asarray(temperature, dtype=np.float64)
    if t.ndim:  # per-row temperatures
        t = t.reshape(t.shape + (1,))
    return x / t, t


def _log_softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    return x - lse, lse


def selected_logp_reference(logits, target_ids, temperature=1.0, ignore_index=-100):
    """(logp, entropy) float64 with the shape of target_ids."""
    x, _ = _scaled(logits, temperature)
    logq, _ = _log_softmax(x)
    p = np.exp(logq)
    with np.errstate(invalid="ignore"):
        entropy = -np.sum(np.where(p > 0, p * logq, 0.0), axis=-1)
    tgt = np.asarray(target_ids, dtype=np.int64)
    ignored = tgt == ignore_index
    safe = np.where(ignored, 0, tgt)
    logp = np.take_along_axis(logq, safe[..., None], axis=-1)[..., 0]
    return np.where(ignored, 0.0, logp), entropy


def selected_logp_grad_reference(logits, target_ids, grad_logp, grad_entropy=None,
                                 temperature=1.0, ignore_index=-100, flush_below=None):
    """d loss / d logits (float64) for loss = sum grad_logp * logp + sum grad_entropy * entropy.

    flush_below: treat probabilities below it as 0, as fp32 arithmetic that flushes subnormals
    does (2**-126 on GPUs); None keeps them.
    """
    x, t = _scaled(logits, temperature)
    logq, _ = _log_softmax(x)
    p = np.exp(logq)
    if flush_below is not None:
        p = np.where(p < flush_below, 0.0, p)
    tgt = np.asarray(target_ids, dtype=np.int64)
    g = np.where(tgt == ignore_index, 0.0, np.asarray(grad_logp, dtype=np.float64))[..., None]
    onehot = np.zeros_like(x)
    safe = np.where(tgt == ignore_index, 0, tgt)
    np.put_along_axis(onehot, safe[..., None], 1.0, axis=-1)
    d = g * (onehot - p)
    if grad_entropy is not None:
        with np.errstate(invalid="ignore"):
            plogp = np.where(p > 0, p * logq, 0.0)
            entropy = -np.sum(plogp, axis=-1, keepdims=True)
            h = np.asarray(grad_entropy, dtype=np.float64)[..., None]
            d = d - h * np.where(p > 0, p * (logq + entropy), 0.0)
    return d / t
