"""rlk_triton.ops.launch: a remembered compiled kernel is launched only for arguments the JIT would
specialize identically. CPU: the signature's facts and the plumbing (a stand-in JIT function). GPU:
every op's outputs with the cache equal those without it, and each cached launch used the very
kernel the JIT picks for those arguments."""
import pytest
import torch

from rlk_triton.ops import launch
from rlk_triton.testing.launchers import descriptor_wrapper


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


def test_a_descriptor_not_built_has_the_facts_of_the_one_it_builds():
    from triton.tools.tensor_descriptor import TensorDescriptor

    m = torch.zeros(64, 80, dtype=torch.bfloat16)
    for t in (m, m[:, :48], m[:, :40], m[8:, 16:], m[:32].t().contiguous(), torch.zeros(64, 64)):
        for block in ((16, 32), (32, 16)):
            lazy = launch.Descriptor(t, block)
            assert launch.signature((lazy,)) == launch.signature((TensorDescriptor.from_tensor(t, list(block)),))
            built = lazy.build()
            assert type(built) is TensorDescriptor and built.base is t and list(built.block_shape) == list(block)


def test_host_descriptor_is_lazy_for_cached_kernels_only():
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert type(launch.host_descriptor(launch.CachedLaunch(_Jit()), t, [16, 32])) is launch.Descriptor
    assert type(launch.host_descriptor(object(), t, [16, 32])) is TensorDescriptor  # an interpreted kernel


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


class _CudaLike(torch.Tensor):
    """A CPU tensor that says it is a CUDA tensor: what the cache passes for one."""

    @property
    def is_cuda(self):
        return True


def test_a_cuda_tensor_is_passed_as_its_address_and_a_host_tensor_never_hits_its_entry(fake_cuda, monkeypatch):
    jit = _Jit()
    k = launch.CachedLaunch(jit)
    x = torch.zeros(64).as_subclass(_CudaLike)
    first = k[(1,)](x, 32, BLOCK=128)
    k[(1,)](x, 32, BLOCK=128)
    assert first.launches[-1][9] == x.data_ptr() and type(first.launches[-1][9]) is int
    monkeypatch.setattr(launch, "POINTERS_AS_INTS", False)
    k[(1,)](x, 32, BLOCK=128)
    assert first.launches[-1][9] is x
    host = torch.zeros(64)  # same dtype and alignment, not CUDA: another signature, the JIT's launch
    assert launch.signature((host, 32)) != launch.signature((x, 32))
    assert k[(1,)](host, 32, BLOCK=128) is not first and len(jit.jit_launches) == 2


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


class _DescKernel(_Kernel):
    """A compiled kernel whose launcher has Triton 3.6's shape, with descriptors at `positions`."""

    def __init__(self, positions, metas=("m0", "m1"), scratch=0, freevars_ok=True):
        super().__init__()
        self.c_launches, self.encodings = [], []

        def make_tensordesc_arg(arg, metadata):
            self.encodings.append((arg.base.data_ptr(), metadata))
            return [("map", arg.base.data_ptr(), metadata, tuple(arg.shape), tuple(arg.strides)),
                    *arg.shape, *arg.strides]

        wrapper = descriptor_wrapper(lambda *a: self.c_launches.append(a), positions, metas, make_tensordesc_arg,
                                     "tensordesc_meta" if freevars_ok else "metas")

        class Run:
            global_scratch_size = profile_scratch_size = scratch
            launch_cooperative_grid, launch_pdl = False, True

            def __init__(self):  # an instance attribute, as CudaLauncher's
                self.launch = wrapper

            def __call__(self, gx, gy, gz, stream, function, *args):  # as CudaLauncher.__call__
                self.launch(gx, gy, gz, stream, function, False, True, None, None, *args)

        self.run = Run()


def _descs():
    from triton.tools.tensor_descriptor import TensorDescriptor

    a, b = torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    return [TensorDescriptor(t, [64, 64], [64, 1], [16, 32]) for t in (a, b)]


def test_descriptor_launch_passes_the_c_launcher_what_tritons_wrapper_does():
    d0, d1 = _descs()
    k = _DescKernel(positions=(0, 3))
    by_maps = launch.DescriptorLaunch.of(k)
    assert by_maps is not None
    args = (d0, 7, None, d1, 2.5, 128)
    k.run(3, 1, 1, 99, "function", "packed", None, None, None, *args)  # the wrapper's launch
    by_maps(3, 1, 1, 99, "function", "packed", args)
    want, got = k.c_launches
    assert got == want and got[13] == ("map", d0.base.data_ptr(), "m0", (64, 64), (64, 1))
    assert len(k.encodings) == 4  # each encodes both
    by_maps(3, 1, 1, 99, "function", "packed", args)
    assert len(k.encodings) == 4 and k.c_launches[-1] == want  # both remembered
    d2 = type(d0)(torch.zeros(64, 64, dtype=torch.bfloat16), [64, 64], [64, 1], [16, 32])
    d3 = type(d0)(d0.base, [64, 48], [64, 1], [16, 32])
    for new in (d2, d3):  # another base address, another shape: encoded again
        by_maps(1, 1, 1, 99, "function", "packed", (new,) + args[1:])
        k.run(1, 1, 1, 99, "function", "packed", None, None, None, new, *args[1:])
        assert k.c_launches[-1] == k.c_launches[-2] and k.c_launches[-1][13][3] == tuple(new.shape)
    assert len(k.encodings) == 4 + 2 * (1 + 2)  # one new map each, d1's remembered; the wrapper's two


def test_descriptor_launch_encodes_a_lazy_descriptor_as_the_built_one():
    d0, d1 = _descs()
    k = _DescKernel(positions=(0, 3))
    by_maps = launch.DescriptorLaunch.of(k)
    lazy = launch.Descriptor(d0.base, (16, 32))
    by_maps(3, 1, 1, 99, "function", "packed", (lazy, 7, None, d1, 2.5, 128))
    k.run(3, 1, 1, 99, "function", "packed", None, None, None, d0, 7, None, d1, 2.5, 128)
    assert k.c_launches[0] == k.c_launches[1]
    by_maps(3, 1, 1, 99, "function", "packed", (d0, 7, None, d1, 2.5, 128))  # the same map: remembered
    assert k.c_launches[2] == k.c_launches[0] and len(k.encodings) == 4


def test_descriptor_launch_remembers_a_bounded_number_of_maps(monkeypatch):
    monkeypatch.setattr(launch, "MAPS_PER_DESCRIPTOR", 4)
    d0, _ = _descs()
    k = _DescKernel(positions=(0,), metas=("m0",))
    by_maps = launch.DescriptorLaunch.of(k)
    keep = [type(d0)(torch.zeros(64, 64, dtype=torch.bfloat16), [64, 64], [64, 1], [16, 32]) for _ in range(9)]
    for d in keep:
        by_maps(1, 1, 1, 0, "f", "p", (d,))
    assert all(len(r) <= 4 for _, _, r in by_maps.descriptors) and len(k.encodings) == 9


def test_other_launchers_keep_the_jits_launch():
    assert launch.DescriptorLaunch.of(_DescKernel(positions=(0, 3), freevars_ok=False)) is None
    assert launch.DescriptorLaunch.of(_DescKernel(positions=(0, 3), metas=(None, None))) is None
    assert launch.DescriptorLaunch.of(_DescKernel(positions=(0, 3), scratch=128)) is None
    assert launch.DescriptorLaunch.of(_DescKernel(positions=(0,))) is None  # metadata for 2, 1 descriptor
    plain = _Kernel()
    plain.run = type("Run", (), {"launch": staticmethod(print)})()  # a builtin: no descriptors to take over
    assert launch.DescriptorLaunch.of(plain) is None


class _OneKernelJit(_Jit):
    """(a, b, n, BLOCK: constexpr), compiled to one given kernel."""
    params = [_Param("a", None), _Param("b", None), _Param("n", None), _Param("BLOCK", None)]

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def __getitem__(self, grid):
        def go(*args, **meta):
            self.jit_launches.append((grid, args, meta))
            return self.kernel
        return go


def test_cached_launch_takes_remembered_descriptors_through_the_c_launcher(fake_cuda, monkeypatch):
    d0, d1 = _descs()
    kernel = _DescKernel(positions=(0, 1))
    jit = _OneKernelJit(kernel)
    k = launch.CachedLaunch(jit)
    k[(2,)](launch.Descriptor(d0.base, (16, 32)), d1, 64, BLOCK=32)  # the JIT gets the built descriptor
    assert [type(a) for a in jit.jit_launches[0][1][:2]] == [type(d0)] * 2
    k[(2,)](d0, d1, 64, BLOCK=32)
    assert len(jit.jit_launches) == 1 and kernel.launches == [] and len(kernel.c_launches) == 1
    assert kernel.c_launches[0][:13] == (2, 1, 1, 1234, "function", False, True, None, None, "packed", None, None,
                                         None)
    assert kernel.c_launches[0][13:] == (("map", d0.base.data_ptr(), "m0", (64, 64), (64, 1)), 64, 64, 64, 1,
                                         ("map", d1.base.data_ptr(), "m1", (64, 64), (64, 1)), 64, 64, 64, 1, 64, 32)
    monkeypatch.setattr(launch, "REMEMBER_DESCRIPTORS", False)
    k[(2,)](launch.Descriptor(d0.base, (16, 32)), d1, 64, BLOCK=32)  # off: built, the wrapper's launch
    assert len(kernel.c_launches) == 2 and kernel.c_launches[1] == kernel.c_launches[0]


def test_a_template_launches_what_the_kernels_launch_would(fake_cuda):
    jit = _Jit()
    k = launch.CachedLaunch(jit)
    t = launch.Template(k, (launch.SLOT, 32), {"BLOCK": 128, "num_warps": 4})
    x, y = torch.zeros(64), torch.ones(64)
    first = t((4,), x)  # the kernel's own launch: the JIT, remembered by the kernel and the template
    assert len(jit.jit_launches) == 1 and jit.jit_launches[0][1] == (x, 32)
    assert t((4, 3), y) is first and k[(4, 3)](y, 32, BLOCK=128, num_warps=4) is first
    assert len(jit.jit_launches) == 1
    t_call, k_call = first.launches
    assert t_call[:9] == k_call[:9] == (4, 3, 1, 1234, "function", "packed", None, None, None)
    assert t_call[9] is y and t_call[10:] == k_call[10:] == (32, 128, 7)
    assert len(k._entries) == 1 and len(t.entries) == 1
    t((4,), x[1:])  # the slot's facts differ (misaligned): the kernel's launch, a new specialization
    assert len(jit.jit_launches) == 2 and len(t.entries) == 2
    other = launch.Template(k, (launch.SLOT, 33), {"BLOCK": 128, "num_warps": 4})  # a fixed int's facts
    assert other((4,), x) is not first and len(jit.jit_launches) == 3
    for wrong in ((), (x, y)):
        with pytest.raises(TypeError, match="1 SLOT values"):
            t((4,), *wrong)


def test_a_template_of_a_cuda_tensor_passes_its_address(fake_cuda):
    k = launch.CachedLaunch(_Jit())
    x = torch.zeros(64).as_subclass(_CudaLike)
    t = launch.Template(k, (launch.SLOT, 32), {"BLOCK": 128})
    t((1,), x)
    kernel = t((1,), x)
    assert kernel.launches[-1][9] == x.data_ptr() and type(kernel.launches[-1][9]) is int


def test_a_template_takes_the_kernels_launch_when_nothing_may_be_remembered(fake_cuda, monkeypatch):
    jit = _Jit()
    k = launch.CachedLaunch(jit)
    x = torch.zeros(64)
    never = [launch.Template(k, (launch.SLOT, object()), {"BLOCK": 128}),  # a fixed unknown type
             launch.Template(k, (launch.SLOT, 32), {"BLOCK": float("nan")})]
    for t in never * 2:
        t((1,), x)
    assert len(jit.jit_launches) == 4 and all(not t.entries for t in never)
    t = launch.Template(k, (launch.SLOT, 32), {"BLOCK": 128})
    t(lambda meta: (1,), x)  # a callable grid
    t((1,), object())  # a slot of an unknown type
    monkeypatch.setattr(launch, "ENABLED", False)
    t((1,), x)
    t((1,), x)
    assert len(jit.jit_launches) == 8 and not t.entries
    monkeypatch.setattr(launch, "ENABLED", True)
    t((1,), x)
    t((1,), x)
    assert len(jit.jit_launches) == 9 and len(t.entries) == 1
    through_the_kernel = []
    monkeypatch.setattr(launch.CachedLaunch, "launch",
                        lambda self, grid, args, meta: through_the_kernel.append(args))
    t((1,), x)  # remembered: the kernel's launch is not asked
    monkeypatch.setattr(launch, "TEMPLATES", False)
    t((1,), x)
    assert through_the_kernel == [(x, 32)]
    interpreted = _Jit()  # not a CachedLaunch (the interpreter's kernel): its own launch, every call
    t = launch.Template(interpreted, (launch.SLOT, 32), {"BLOCK": 128})
    t((2,), x)
    t((2,), x)
    assert [c[1] for c in interpreted.jit_launches] == [(x, 32)] * 2


def test_a_template_with_descriptor_slots_launches_through_the_remembered_maps(fake_cuda):
    d0, d1 = _descs()
    kernel = _DescKernel(positions=(0, 1))
    k = launch.CachedLaunch(_OneKernelJit(kernel))
    t = launch.Template(k, (launch.SLOT, launch.SLOT, 64), {"BLOCK": 32})
    t((2,), launch.Descriptor(d0.base, (16, 32)), d1)
    t((2,), launch.Descriptor(d0.base, (16, 32)), d1)
    assert len(t.entries) == 1  # the second call launched from the template's entry
    k[(2,)](d0, d1, 64, BLOCK=32)
    assert len(kernel.c_launches) == 2 and kernel.c_launches[0] == kernel.c_launches[1]
    assert kernel.c_launches[0][13] == ("map", d0.base.data_ptr(), "m0", (64, 64), (64, 1))


def test_descriptor_slots_launch_as_the_built_descriptors_with_maps_remembered_per_address(fake_cuda, monkeypatch):
    """A DescriptorSlot's tensor (the call site fixes its layout) is bound as a tensor and launched
    through the C launcher with the arguments the kernel's own launch of the built descriptor gives, a
    transposed slot's map over the transpose; each map is encoded once per base address; with the
    maps off, the wrapper encodes the built descriptors: the same C launch."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, w = torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(48, 64, dtype=torch.bfloat16)
    kernel = _DescKernel(positions=(0, 1))
    k = launch.CachedLaunch(_OneKernelJit(kernel))
    t = launch.Template(k, (launch.DescriptorSlot((16, 32)), launch.DescriptorSlot((16, 32), True), 64),
                        {"BLOCK": 32})
    args = t.arguments((m, w.t()))
    assert [type(a) for a in args[:2]] == [launch.Descriptor] * 2 and args[1].tensor.shape == (48, 64)
    t((2,), m, w.t())  # the kernel's launch: the JIT
    t((2,), m, w.t())  # remembered: the template's maps
    k[(2,)](launch.Descriptor(m, (16, 32)), launch.Descriptor(w, (16, 32)), 64, BLOCK=32)
    ours, own = kernel.c_launches
    assert ours == own and ours[18] == ("map", w.data_ptr(), "m1", (48, 64), (64, 1))
    encoded = len(kernel.encodings)  # two by the template, two by the kernel's own launch
    t((2,), m, w.t())
    assert len(kernel.encodings) == encoded and kernel.c_launches[-1] == own
    m2 = torch.ones(64, 64, dtype=torch.bfloat16)  # another address: its map encoded, w's remembered
    t((2,), m2, w.t())
    assert len(kernel.encodings) == encoded + 1 and kernel.c_launches[-1][13][1] == m2.data_ptr()
    monkeypatch.setattr(launch, "REMEMBER_DESCRIPTORS", False)
    t((2,), m, w.t())
    assert kernel.c_launches[-1] == own and len(kernel.encodings) == encoded + 3  # the wrapper encodes both
    interpreted = _Jit()  # the interpreter's kernel takes Triton's own descriptors
    launch.Template(interpreted, (launch.DescriptorSlot((16, 32), True), 64), {"BLOCK": 32})((1,), w.t())
    built = interpreted.jit_launches[0][1][0]
    assert type(built) is TensorDescriptor and built.base.data_ptr() == w.data_ptr() and list(built.shape) == [48, 64]


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
    JIT alone: the same outputs, torch.equal; and at every cached launch, the kernel's own or a call
    site's Template (matmul's plans), the JIT, asked for the kernel of the same arguments (warmup: no
    launch), returns the remembered object."""
    checked = []
    original = launch.CachedLaunch.launch

    def checking(self, grid, args, meta):
        before = len(self._entries)
        ck = original(self, grid, args, meta)
        if launch.ENABLED and len(self._entries) == before and ck is not None:
            want = self.jit.run(*launch._built(args), grid=grid, warmup=True, **meta)  # descriptors built
            assert want is ck, self.jit.fn.__name__
            checked.append(self.jit.fn.__name__)
        return ck

    monkeypatch.setattr(launch.CachedLaunch, "launch", checking)
    original_template = launch.Template.__call__

    def checking_template(self, grid, *values):  # a call site's template (matmul's plans): the JIT's kernel too
        ck = original_template(self, grid, *values)
        if launch.ENABLED and self.remembers and ck is not None:
            want = self.kernel.jit.run(*launch._built(self.arguments(values)), grid=grid, warmup=True, **self.meta)
            assert want is ck, self.kernel.jit.fn.__name__
            checked.append("template " + self.kernel.jit.fn.__name__)
        return ck

    monkeypatch.setattr(launch.Template, "__call__", checking_template)

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
    assert any(c.startswith("template ") for c in checked), sorted(set(checked))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="descriptor kernels run on a GPU only")
def test_remembered_descriptor_maps_give_the_bits_of_fresh_ones(monkeypatch):
    """The TMA matmuls (a @ w.t() at decode and prefill rows, the descriptor kernel on sm90) with each
    descriptor encoded anew (Triton's launcher) and from the remembered maps: equal bits, eager and
    replayed from a CUDA graph, with the input buffer refilled between calls (a remembered map
    addresses memory, not values). On Triton 3.6 the maps are in use: a DescriptorLaunch exists, and
    matmul's plan templates hold maps of their own (DescriptorSlot)."""
    import triton

    from rlk_triton.ops import matmul as mm

    if not launch.ENABLED:
        pytest.skip("RLK_LAUNCH_CACHE=0")
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(4096, 4096, device="cuda", generator=g).to(torch.bfloat16)
    for M in (1, 16, 64, 2048):
        a = torch.empty(M, 4096, device="cuda", dtype=torch.bfloat16)
        outs = {}
        for remember in (False, True, True):
            monkeypatch.setattr(launch, "REMEMBER_DESCRIPTORS", remember)
            got = []
            for seed in (1, 2):
                a.copy_(torch.randn(M, 4096, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
                got.append(mm.matmul(a, w.t()).clone())
            outs.setdefault(remember, []).append(got)
        for got in outs[True]:
            assert all(torch.equal(x, y) for x, y in zip(outs[False][0], got)), M
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = mm.matmul(a, w.t())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, outs[False][0][1]), M  # a holds seed 2's values
    maps = [e[6] for e in mm._matmul_desc_kernel._entries.values()]
    # the plans' templates launched through their own per-address maps (DescriptorSlot)
    stores = [store for plan in mm._PLANS.values() if plan.tma is not None
              for _, per_slot in plan.tma.entries.values() for store in per_slot]
    if triton.__version__.startswith("3.6"):
        assert maps and all(m is not None for m in maps)
        assert any(stores)


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
