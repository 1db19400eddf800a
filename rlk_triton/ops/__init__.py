"""Operator implementations: Triton kernels, thin launchers, torch.library custom ops with autograd."""
