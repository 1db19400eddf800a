"""Rows at every offset of a tile: the tl.dot kernels give a row the same bits wherever it sits.

The other invariance axes place the probe rows at a few positions; whether those land on offsets
where a tile's arithmetic differs is luck (under the interpreter tl.dot was one np.matmul, whose
BLAS gave a row other bits at 10 of 15 offsets of a tile on one CPU and at none on another). Here
the probe rows take every offset 0..BLOCK_M-1 of a tile, the last one straddling the boundary into
the next tile, for values and row gradients, in every dtype: `torch.equal` or fail.
"""
import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.testing import check_batch_invariance
from rlk_triton.testing.linear_parity import linear_logp_row_op
from rlk_triton.testing.matmul_parity import matmul_row_op

from test_layer_chain import _chain_op

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tile_rows(device, *kernels):
    """The largest row tile of the kernels an op runs (the others divide it: offsets cover them too)."""
    arch = arch_of(torch.device(device))
    return max(configs.lookup_matmul(k, arch, torch.float32).block_m for k in kernels)


def _assert_every_offset_equal(op, tile_rows):
    report = check_batch_invariance(op, probe_rows=2, batch_sizes=(5,), tile_rows=tile_rows)
    swept = [r for r in report.results if r.axis == "tile_position"]
    assert len(swept) >= tile_rows, "the sweep did not run"
    bad = report.failures()
    assert not bad, [f"{r.axis} / {r.variant} / {r.what}: max |diff| {r.max_abs_diff:.3g}" for r in bad[:8]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_rows_at_every_tile_offset(device, dtype):
    n, k = (70, 50) if device == "cpu" else (4096, 4096)
    _assert_every_offset_equal(matmul_row_op(n, k, dtype, device), _tile_rows(device, "matmul"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_logp_rows_at_every_tile_offset(device, dtype):
    """logp, entropy and d hidden of a token wherever it sits in the forward's, d logits' and
    d hidden's row tiles."""
    H, V = (32, 200) if device == "cpu" else (4096, 151936)
    tile = _tile_rows(device, "linear_logp_fwd", "linear_logp_dlogits", "linear_logp_dhidden")
    _assert_every_offset_equal(linear_logp_row_op(H, V, dtype, device), tile)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_chain_rows_at_every_tile_offset(device, dtype):
    _assert_every_offset_equal(_chain_op(dtype, device), _tile_rows(device, "matmul"))
