"""rlk_triton.ops.launch: a remembered compiled kernel is launched only for arguments the JIT would
specialize identically. CPU: the signature's facts and the plumbing (a stand-in JIT function). GPU:
every op's outputs with the cache equal those without it, and each cached launch used the very
kernel the JIT picks for those arguments."""
import pytest
import torch

from rlk_triton.ops import launch


def test_signature_separates_what_the_jit_specializes_on():
    buf = torch.zeros(64, dtype=torch.float16)
    sig = launch.signature
    assert sig((buf,)) == sig((torch.ones(8, dtype=torch.float16),))  # same dtype, both aligned
    assert sig((buf,)) != sig((buf[1:],))  # 2 bytes off 16
    assert sig((buf,)) != sig((buf.float(),))
    assert sig((32,)) == sig((48,)) and sig((32,)) != sig((33,))  # divisibility by 16
    assert sig((1,)) != sig((17,))  # equal to 1
    assert sig((2 ** 31 - 1,)) != sig((2 ** 31 + 15,)) and sig((2 ** 32,)) == sig((2 ** 33,))  # i32 / i64
    assert sig((2 ** 63,)) != sig((2 ** 62,))  # u64
    assert sig((0.5,)) == sig((3.0,))  # floats: the type only
    assert sig((True,)) != sig((False,)) and sig((None,)) != sig((0,)) and sig((True,)) != sig((1,))
    assert sig((object(),)) is None  # unknown: the JIT launches


def test_signature_of_host_tensor_descriptors():
    from triton.tools.tensor_descriptor import TensorDescriptor

    sig = launch.signature
    a = torch.zeros(64, 64, dtype=torch.bfloat16)

    def desc(t, block=(16, 32), shape=None):
        return TensorDescriptor(t, list(shape or t.shape), list(t.stride()), list(block))

    assert sig((desc(a),)) == sig((desc(torch.ones(32, 64, dtype=torch.bfloat16)),))  # values are not facts
    assert sig((desc(a),)) != sig((desc(a, (32, 32)),))  # the block shape
    assert sig((desc(a),)) != sig((desc(a.float()),))
    assert sig((desc(a),)) != sig((desc(a, shape=(64, 63)),))  # a dim not divisible by 16


class _Param:
    def __init__(self, name, default):
        self.name, self.default = name, default


class _Kernel:
    function, packed_metadata = "function", "packed"

    def __init__(self):
        self.launches = []

    def run(self, *a):
        self.launches.append(a)


class _Jit:
    """Stands in for a JITFunction: (x_ptr, n, BLOCK: constexpr, FLAG: constexpr = 7)."""
    params = [_Param("x_ptr", None), _Param("n", None), _Param("BLOCK", None), _Param("FLAG", 7)]

    def __init__(self):
        self.jit_launches, self.kernels = [], {}

    def __getitem__(self, grid):
        def go(*args, **meta):
            self.jit_launches.append((grid, args, meta))
            key = (launch.signature(args), tuple(meta.items()))
            return self.kernels.setdefault(key, _Kernel())
        return go


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "stream_handle", lambda device: 1234)
    monkeypatch.setattr(launch, "ENABLED", True)


def test_a_seen_signature_launches_the_remembered_kernel_with_the_jits_binding(fake_cuda):
    jit = _Jit()
    k = launch.CachedLaunch(jit)
    x = torch.zeros(64)
    first = k[(4,)](x, 32, BLOCK=128, num_warps=4)
    assert len(jit.jit_launches) == 1 and first.launches == []
    y = torch.ones(64)
    again = k[(5, 2)](y, 48, BLOCK=128, num_warps=4)  # other values, the same facts
    assert again is first and len(jit.jit_launches) == 1
    (call,) = first.launches
    assert call[:9] == (5, 2, 1, 1234, "function", "packed", None, None, None)
    assert call[9] is y and call[10:] == (48, 128, 7)  # positional, then constexpr, then default
    k[(1,)](x[1:], 48, BLOCK=128, num_warps=4)  # misaligned: the JIT again
    k[(1,)](x, 49, BLOCK=128, num_warps=4)  # not divisible by 16
    k[(1,)](x, 48, BLOCK=64, num_warps=4)  # another constexpr
    k[(1,)](x, 48, BLOCK=128, num_warps=8)  # another option
    assert len(jit.jit_launches) == 5 and len(first.launches) == 1


def test_the_jit_launches_when_the_cache_must_not_answer(fake_cuda, monkeypatch):
    jit = _Jit()
    k = launch.CachedLaunch(jit)
    x = torch.zeros(64)
    for _ in range(2):
        k[lambda meta: (1,)](x, 32, BLOCK=128)  # a callable grid
        k[(1,)](x, object(), BLOCK=128)  # an argument of an unknown type
        k[(1,)](x, 32, BLOCK=float("nan"))  # a key that never equals itself: not stored
    assert len(jit.jit_launches) == 6
    if launch._RUNTIME is not None and hasattr(launch._RUNTIME.launch_enter_hook, "add"):
        hook = lambda metadata: None  # noqa: E731 - a profiler's
        launch._RUNTIME.launch_enter_hook.add(hook)
        try:
            k[(1,)](x, 32, BLOCK=128)
            k[(1,)](x, 32, BLOCK=128)
        finally:
            launch._RUNTIME.launch_enter_hook.remove(hook)
        assert len(jit.jit_launches) == 8
        del jit.jit_launches[6:]
    monkeypatch.setattr(launch, "ENABLED", False)
    k[(1,)](x, 32, BLOCK=128)
    k[(1,)](x, 32, BLOCK=128)
    assert len(jit.jit_launches) == 8


def test_under_the_interpreter_kernels_are_not_wrapped():
    from rlk_triton._runtime import interpreter_active
    from rlk_triton.ops import rmsnorm

    if not interpreter_active():
        pytest.skip("the interpreter is off")
    assert not isinstance(rmsnorm._fwd_kernel, launch.CachedLaunch)


# ---- GPU ----

def _gpu_workloads():
    from rlk_triton.bench import cases

    out = []
    for c in cases.select(None, "quick"):
        out.append((f"{c.op} {c.case} {c.shape}", c))
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cache is active on a GPU only")
def test_cached_launches_use_the_jits_kernel_and_give_its_bits(monkeypatch):
    """Every quick benchmark case twice with the cache (the second call launches from it) against the
    JIT alone: the same outputs, torch.equal; and at every cached launch the JIT, asked for the kernel
    of the same arguments (warmup: no launch), returns the remembered object."""
    checked = []
    original = launch.CachedLaunch.launch

    def checking(self, grid, args, meta):
        before = len(self._entries)
        ck = original(self, grid, args, meta)
        if launch.ENABLED and len(self._entries) == before and ck is not None:
            want = self.jit.run(*args, grid=grid, warmup=True, **meta)
            assert want is ck, self.jit.fn.__name__
            checked.append(self.jit.fn.__name__)
        return ck

    monkeypatch.setattr(launch.CachedLaunch, "launch", checking)

    def outputs(fn):
        got = fn()
        torch.cuda.synchronize()
        flat = got if isinstance(got, (tuple, list)) else (got,)
        return [t.detach().clone() for t in flat if isinstance(t, torch.Tensor)]

    for name, case in _gpu_workloads():
        fn = case.build("cuda", True).rlk
        monkeypatch.setattr(launch, "ENABLED", False)
        want = outputs(fn)
        monkeypatch.setattr(launch, "ENABLED", True)
        outputs(fn)
        got = outputs(fn)
        assert len(want) == len(got), name
        for a, b in zip(want, got):
            assert torch.equal(a, b), name
    assert len(set(checked)) >= 10, sorted(set(checked))


def _probe_kernel(x_ptr, y_ptr, desc, n, m, f, flag, opt, BLOCK: "tl.constexpr"):  # never compiled
    pass


def test_one_signature_is_one_jit_specialization():
    """The property the cache rests on, against the installed Triton's own binder: argument tuples with
    one launch signature get one specialization from the JIT (so one compiled kernel). Tensors of two
    dtypes, aligned and 2 bytes off; ints around 1, 16, 2^31, 2^63 and negatives; floats; bools; None;
    host descriptors of two block shapes over aligned and unaligned extents."""
    import itertools
    import random

    try:
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature
        from triton.tools.tensor_descriptor import TensorDescriptor

        _probe_kernel.__annotations__["BLOCK"] = tl.constexpr
        jit = JITFunction(_probe_kernel)
        binder = create_function_from_signature(jit.signature, jit.params, make_backend(GPUTarget("cuda", 90, 32)))
    except Exception as ex:  # noqa: BLE001 - a triton without these internals: nothing to compare with
        pytest.skip(f"this triton's binder is not reachable: {ex!r}"[:200])
    buf16, buf32 = torch.zeros(256, dtype=torch.bfloat16), torch.zeros(256)
    tensors = [buf16, buf16[1:], buf16[8:], buf32, buf32[1:], buf32[4:]]
    ints = [0, 1, 2, 15, 16, 17, 32, 48, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 63, -16, -1]
    m2 = torch.zeros(64, 64, dtype=torch.bfloat16)
    descs = [TensorDescriptor(m2, [64, 64], [64, 1], [16, 32]), TensorDescriptor(m2, [64, 48], [64, 1], [16, 32]),
             TensorDescriptor(m2, [64, 63], [64, 1], [16, 32]), TensorDescriptor(m2, [64, 64], [64, 1], [32, 32]),
             TensorDescriptor(torch.zeros(32, 64, dtype=torch.bfloat16), [32, 64], [64, 1], [16, 32])]
    rng = random.Random(0)
    seen = {}
    cases = [(rng.choice(tensors), rng.choice(tensors), rng.choice(descs), rng.choice(ints), rng.choice(ints),
              rng.choice([0.5, 3.0]), rng.choice([True, False]), rng.choice([None, buf32]))
             for _ in range(600)]
    cases += [(buf16, buf32, descs[0], a, b, 1.0, True, None) for a, b in itertools.product(ints, ints)]
    for args in cases:
        sig = launch.signature(args)
        assert sig is not None
        spec = str(binder(*args, BLOCK=64)[1])
        assert seen.setdefault(sig, spec) == spec, (args, spec, seen[sig])
    assert len(set(seen.values())) > 50  # the cases do reach many specializations


def test_host_cdiv_and_next_power_of_2_are_tritons():
    import triton

    values = list(range(-5, 5000)) + [2 ** k + d for k in range(13, 40) for d in (-1, 0, 1)]
    for n in values:
        assert launch.next_power_of_2(n) == triton.next_power_of_2(n), n
    for x in values[:3000]:
        for y in (1, 2, 3, 16, 64, 4096):
            assert launch.cdiv(x, y) == triton.cdiv(x, y), (x, y)
