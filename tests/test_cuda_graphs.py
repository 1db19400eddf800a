"""Every public op's call (forward, or forward + backward by torch.autograd.grad) is CUDA-graph
capturable with validate=False, and a replay gives the eager call's bits. The calls are the benchmark
suite's cases (rlk_triton/bench/cases.py, --quick shapes), which pass validate=False wherever an op
has it: the same calls asv and the reports time."""
import pytest
import torch

from rlk_triton.bench import cases


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases.select(None, "quick"), ids=lambda c: f"{c.op}:{c.name}")
def test_capture_and_replay_give_the_eager_bits(case):
    bound = case.build("cuda", True)
    torch.cuda.synchronize()
    eager = [t.clone() for t in _tensors(bound.rlk())]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch.cuda.graphs asks
        for _ in range(2):
            bound.rlk()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = _tensors(bound.rlk())
    graph.replay()
    torch.cuda.synchronize()
    assert len(static) == len(eager) and eager
    for a, b in zip(eager, static):
        assert torch.equal(a, b), f"{case.op} {case.name}: replay differs from the eager call"
