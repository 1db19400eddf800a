"""Vocab-parallel linear_logp over torch.distributed (gloo, CPU processes; on a GPU machine the same
test runs the kernels on CUDA with gloo moving host copies).

Rule under test (docs/linear_logp.md): when every shard starts on a canonical chunk boundary,
logp, entropy and d hidden are bitwise those of one shard, and each rank's d weight / d bias rows are
bitwise the matching rows of the one-shard gradient; otherwise results stay within the contract.
"""
import os
from pathlib import Path

import pytest
import torch

from rlk_triton import configs
from rlk_triton._runtime import arch_of
from rlk_triton.testing.linear_parity import LinearCase, build_linear_case

N, H = 13, 40


def _chunk():
    return configs.lookup_matmul("linear_logp_dlogits", arch_of(torch.device("cpu")), torch.float32).chunk_v


def _inputs(dtype, V):
    hidden, weight, bias, targets = build_linear_case(LinearCase(N, H, V, dtype, bias=True, seed=V), "cpu")
    gen = torch.Generator().manual_seed(7)
    return hidden, weight, bias, targets, torch.randn(N, generator=gen), torch.randn(N, generator=gen)


def _run(hidden, weight, bias, targets, g, ge, **kw):
    from rlk_triton.logp import linear_logp

    h, w, b = (x.detach().clone().requires_grad_() for x in (hidden, weight, bias))
    logp, ent = linear_logp(h, w, targets, bias=b, temperature=0.9, return_entropy=True, **kw)
    ((logp * g).sum() + (ent * ge).sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(), "d_hidden": h.grad, "d_weight": w.grad,
            "d_bias": b.grad}


def _worker(rank, world, init_method, out_dir, dtype_name, bounds, saved="recompute", saved_vocab=None):
    os.environ["TRITON_INTERPRET"] = "1"
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        dtype = getattr(torch, dtype_name)
        V = bounds[-1]
        hidden, weight, bias, targets, g, ge = _inputs(dtype, V)
        lo, hi = bounds[rank], bounds[rank + 1]
        out = _run(hidden, weight[lo:hi], bias[lo:hi], targets, g, ge, tp_group=dist.group.WORLD,
                   vocab_start_index=lo, global_vocab_size=V, saved=saved, saved_vocab=saved_vocab)
        torch.save(out, Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path, dtype, bounds, saved="recompute", saved_vocab=None):
    import torch.multiprocessing as mp

    world = len(bounds) - 1
    mp.spawn(_worker, args=(world, f"file://{tmp_path / 'store'}", str(tmp_path),
                            str(dtype).removeprefix("torch."), bounds, saved, saved_vocab), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _assert_one_shard(ranks, one, bounds):
    """Every rank holds one shard's logp, entropy and d hidden, and its rows of d weight / d bias."""
    for r, got in enumerate(ranks):
        for name in ("logp", "entropy", "d_hidden"):
            assert torch.equal(got[name], one[name]), (r, name)
        lo, hi = bounds[r], bounds[r + 1]
        assert torch.equal(got["d_weight"], one["d_weight"][lo:hi]), r
        assert torch.equal(got["d_bias"], one["d_bias"][lo:hi]), r


@pytest.mark.parametrize("world,dtype,saved", [(2, torch.float32, "recompute"), (4, torch.bfloat16, "recompute"),
                                               (2, torch.float32, "logits"), (4, torch.bfloat16, "logits")])
def test_aligned_shards_are_bitwise_one_shard(tmp_path, world, dtype, saved):
    """Both saved-state policies: with saved="logits" each rank keeps its shard's logits and the
    result is bitwise one shard's saved="logits" result."""
    C = _chunk()
    V = 4 * C + 29  # the last shard ends in a partial chunk
    bounds = [0] + [C * (1 + r) for r in range(world - 1)] + [V]  # uneven, chunk-aligned starts
    if world == 2:
        bounds = [0, 3 * C, V]
    ranks = _spawn(tmp_path, dtype, bounds, saved)
    hidden, weight, bias, targets, g, ge = _inputs(dtype, V)
    one = _run(hidden, weight, bias, targets, g, ge, saved=saved)
    _assert_one_shard(ranks, one, bounds)


@pytest.mark.parametrize("world,kept_chunks", [(2, 2), (4, 2)])
def test_aligned_shards_keeping_part_of_the_vocab_are_bitwise_one_shard(tmp_path, world, kept_chunks):
    """saved_vocab under TP: each rank keeps its part of the vocab's first columns (all of them, some,
    or none), and the result is bitwise one shard keeping the same columns."""
    C = _chunk()
    V = 4 * C + 29
    bounds = [0, 3 * C, V] if world == 2 else [0, C, 2 * C, 3 * C, V]
    saved_vocab = kept_chunks * C + 5  # rounds down to whole chunks
    ranks = _spawn(tmp_path, torch.bfloat16, bounds, "logits", saved_vocab)
    hidden, weight, bias, targets, g, ge = _inputs(torch.bfloat16, V)
    one = _run(hidden, weight, bias, targets, g, ge, saved="logits", saved_vocab=saved_vocab)
    _assert_one_shard(ranks, one, bounds)


def test_unaligned_shards_stay_within_contract(tmp_path):
    from rlk_triton.testing.linear_parity import compare_to_reference, judge_errors

    C = _chunk()
    V = 3 * C + 5
    bounds = [0, C + 17, V]  # rank 1 starts inside a chunk
    ranks = _spawn(tmp_path, torch.float32, bounds)
    hidden, weight, bias, targets, g, ge = _inputs(torch.float32, V)
    for name in ("logp", "entropy", "d_hidden"):  # every rank holds the same merged result
        assert torch.equal(ranks[0][name], ranks[1][name]), name
    got = dict(ranks[0])
    got["d_weight"] = torch.cat([r["d_weight"] for r in ranks])
    got["d_bias"] = torch.cat([r["d_bias"] for r in ranks])
    ratios = judge_errors(compare_to_reference(got, hidden, weight, bias, targets, 0.9, g.double(), ge.double()),
                          torch.float32, "interpreter")
    assert max(ratios.values()) <= 1.0, ratios


def test_shards_must_tile_the_vocab_in_rank_order(tmp_path):
    C = _chunk()
    with pytest.raises(Exception, match="vocab_start_index|global_vocab_size"):
        _spawn(tmp_path, torch.float32, [C, 2 * C, 3 * C])  # rank 0 does not start at 0
