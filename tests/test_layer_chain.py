"""A transformer block's forward chain, attention aside: RMSNorm -> matmul -> RoPE -> SwiGLU -> matmul.

Two batches that share some tokens (at other positions in the batch, with other neighbours, with
padding) must give those tokens bitwise the same outputs and input gradients: the harness's axes,
applied to the whole chain. Each token carries its own position id, as in a packed batch.
"""
import pytest
import torch

from rlk_triton.ops.matmul import matmul
from rlk_triton.ops.rmsnorm import rms_norm
from rlk_triton.ops.rope import apply_rope, rope_tables
from rlk_triton.ops.swiglu import swiglu
from rlk_triton.testing import RowOp, check_batch_invariance


def _chain_op(dtype, device, H=64, heads=4, head_dim=16):
    inter = heads * head_dim
    gen = torch.Generator().manual_seed(3)
    w_norm = (1 + 0.1 * torch.randn(H, generator=gen)).to(device, dtype)
    w_in = (torch.randn(H, 2 * inter, generator=gen) / H ** 0.5).to(device, dtype)
    w_out = (torch.randn(inter, H, generator=gen) / inter ** 0.5).to(device, dtype)
    cos, sin = rope_tables(256, head_dim, device=device)

    def forward(x, pos):
        h = rms_norm(x, w_norm)
        proj = matmul(h, w_in)                                    # [T, 2 I]
        gate = proj[:, :inter].reshape(-1, heads, head_dim)
        gate, _ = apply_rope(gate, None, cos, sin, pos)           # rotate the gate half per position
        y = swiglu(gate.reshape(-1, inter), proj[:, inter:])
        return (matmul(y, w_out),)

    def make_rows(n, g):
        return (torch.randn(n, H, generator=g).to(device, dtype), torch.randint(0, 256, (n,), generator=g).to(device))

    def padding(n, g):
        return (torch.zeros(n, H, dtype=dtype, device=device), torch.zeros(n, dtype=torch.long, device=device))

    return RowOp(f"block_chain[{dtype}]", forward, make_rows, grad_inputs=(0,), make_padding=padding)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_block_chain_is_batch_invariant(device, dtype):
    report = check_batch_invariance(_chain_op(dtype, device), batch_sizes=(6, 19) if device == "cpu" else (6, 700))
    assert report.passed, report.failures()[:5]
    axes = {r.axis for r in report.results}
    assert {"batch_size", "row_position", "neighbours", "padding_rows"} <= axes
