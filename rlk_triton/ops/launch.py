"""How every kernel is launched: Triton's JIT launch, with its per-call binding skipped for argument
signatures seen before.

`kernel[grid](*args, **meta)` binds the arguments, specializes each one (dtype, 16-byte alignment,
divisibility by 16), formats a cache key and looks up the compiled kernel on every call; for a small
op that is a large part of its host time (scripts/gpu_host_profile.py, "launch probe" rows).
`@cached` over `@triton.jit` gives an object launched the same way. Its first call with an argument
signature goes through the JIT, which compiles or finds the kernel and launches it, and remembers the
compiled kernel. Later calls with the same signature call that kernel's launcher directly with the
arguments bound as the JIT binds them.

The signature is a superset of what the JIT specializes on:
- each tensor's dtype and whether its address is 16-byte aligned;
- each int's range class, divisibility by 16 and equality to 1;
- the type of each float;
- the value of bools and None;
- each host tensor descriptor's base dtype and alignment, block shape, padding, and the divisibility
  by 16 of its shape and strides (the launcher fills the TMA descriptor from it on every launch);
- the keyword arguments (constexprs, num_warps, num_stages) with their values;
- the current device;
- whether each tensor is a CUDA tensor: a remembered launch passes a CUDA tensor's address as an int
  (`bind`), which Triton's launcher takes as it is, instead of calling data_ptr() and asking the driver
  for the same address again.

So a remembered kernel is the binary the JIT would pick: the same bits, by construction
(tests/test_launch.py checks it on the GPU).

Host tensor descriptors (the TMA matmuls): Triton 3.6's launcher wraps its C launcher in a Python
function that, on every launch, walks every argument and encodes each descriptor's CUtensorMap anew
(`make_tensordesc_arg`). A remembered kernel whose launcher has that shape is launched through the C
launcher directly, with the encoded arguments of each descriptor remembered per (base address,
shape, strides): the encoding is a pure function of those and of what the signature fixes (dtype,
block shape, padding) and the kernel's descriptor metadata, and the C launcher copies the map into
the launch's parameters, so a remembered map gives the bytes a fresh one would. Any other launcher
shape (another Triton) keeps the JIT's launcher: the same bits, only slower. Callers pass
`host_descriptor(kernel, tensor, block_shape)`: for a cached kernel a `Descriptor` that is built into
Triton's TensorDescriptor only when the JIT, Triton's launcher or a new map needs the object.

A call site that repeats its shapes can fix its launch once per shape: `Template(kernel, args, meta)`
with SLOT at the positions each call gives (the tensors, and whatever else varies), kept per shape by
`planned`. A call then binds the SLOTs' values only; the rest of the signature was taken when the
template was made. It remembers, per (device, SLOT signature), the entry the kernel's own launch made
for the full arguments: the same kernel, the same bits. A `DescriptorSlot` is a SLOT given as a tensor
that the kernel takes as a host descriptor, for a call site whose key fixes the tensor's shape and
strides: the template remembers its maps per base address alone.

Every call goes through the JIT:
- under the interpreter (`cached` returns the interpreted function itself);
- for arguments of other types, keyword values other than int, float, bool,
  str and None, and NaN constexprs (a key that never equals itself would be stored on every call);
- for a callable grid;
- while a Triton launch hook is set (profilers);
- with RLK_LAUNCH_CACHE=0 in the environment, or `ENABLED = False`.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

try:
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - a triton without the module: nothing is wrapped
    JITFunction = ()

try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - a triton without host descriptors: such arguments go to the JIT
    TensorDescriptor = None

ENABLED = os.environ.get("RLK_LAUNCH_CACHE", "1") != "0"
POINTERS_AS_INTS = os.environ.get("RLK_LAUNCH_POINTERS_AS_INTS", "1") != "0"  # off: tensors to the launcher (bind)
TEMPLATES = os.environ.get("RLK_LAUNCH_TEMPLATES", "1") != "0"  # off: a Template takes its kernel's launch

_I32 = (-(1 << 31), (1 << 31) - 1)
_U64 = 1 << 63
_META_TYPES = (int, float, bool, str, type(None))


def signature(args) -> tuple | None:
    """The facts of positional kernel arguments that the JIT's specialization can depend on, or None
    for an argument type this module does not know (then the JIT launches)."""
    bound = bind(args)
    return None if bound is None else bound[0]


def bind(args) -> tuple | None:
    """(signature, the arguments as the cached launch passes them), or None for an argument type this
    module does not know. A CUDA tensor is passed as its address: Triton's launcher takes an int as the
    device address as it is, where for a tensor it calls data_ptr() and asks the driver for the address
    (cuPointerGetAttribute), the same number for device memory, on every launch. Whether a tensor is a
    CUDA tensor is a signature fact, so a host tensor goes to the JIT, whose launcher refuses it."""
    sig, passed = [], []
    for a in args:
        t = type(a)
        if t is int:
            sig.append((_I32[0] <= a <= _I32[1], a >= _U64, a & 15 == 0, a == 1))
        elif t is float:
            sig.append(float)
        elif isinstance(a, torch.Tensor):
            ptr = a.data_ptr()
            cuda = a.is_cuda
            sig.append((a.dtype, ptr & 15 == 0, cuda))
            if cuda and POINTERS_AS_INTS:
                passed.append(ptr)
                continue
        elif a is None or t is bool:
            sig.append(a)
        elif t is TensorDescriptor:  # the launcher fills the TMA descriptor from it on every launch
            sig.append((a.base.dtype, a.base.data_ptr() & 15 == 0, tuple(a.block_shape), a.padding,
                        _divisible(tuple(a.shape), tuple(a.strides))))
        elif t is Descriptor:  # the facts of the TensorDescriptor it builds
            x = a.tensor
            sig.append((x.dtype, x.data_ptr() & 15 == 0, a.block_shape, "zero", _divisible(x.shape, x.stride())))
        else:
            return None
        passed.append(a)
    return tuple(sig), tuple(passed)


_DIVISIBLE: dict = {}


def _divisible(shape, strides) -> tuple:
    """(which dims, which strides are divisible by 16) of a descriptor: remembered per (shape, strides),
    which a decode step repeats (a list comprehension per call costs more than the lookup)."""
    key = (shape, strides)
    facts = _DIVISIBLE.get(key)
    if facts is None:
        if len(_DIVISIBLE) >= 4096:
            _DIVISIBLE.clear()
        facts = _DIVISIBLE[key] = (tuple([v & 15 == 0 for v in shape]), tuple([v & 15 == 0 for v in strides]))
    return facts


class Descriptor(NamedTuple):
    """A host TMA descriptor over all of a tensor, in blocks of block_shape (a tuple), not built yet:
    `build()` is TensorDescriptor.from_tensor(tensor, block_shape). A remembered launch encodes the
    map straight from the tensor and builds the object only for a new (address, shape, strides),
    where Triton's JIT or its launcher get the object itself. Made by `host_descriptor`."""
    tensor: torch.Tensor
    block_shape: tuple

    def build(self):
        return TensorDescriptor.from_tensor(self.tensor, list(self.block_shape))


def host_descriptor(kernel, tensor: torch.Tensor, block_shape) -> object:
    """The host descriptor argument of `kernel` over all of `tensor`: a Descriptor for a kernel this
    module launches (built when needed), a TensorDescriptor for any other (the interpreter's)."""
    if type(kernel) is CachedLaunch:
        return Descriptor(tensor, tuple(block_shape))
    return TensorDescriptor.from_tensor(tensor, list(block_shape))


def _built(args) -> tuple:
    """args with every Descriptor built: what Triton's JIT and launcher take."""
    return tuple([a.build() if type(a) is Descriptor else a for a in args])


_RUNTIME = getattr(_knobs, "runtime", None)


def _hooked() -> bool:
    """A launch hook is set: a plain hook (older triton), or a HookChain holding one (triton >= 3.5
    keeps empty chains there, and its own launches then call them for nothing)."""
    if _RUNTIME is None:
        return False
    for hook in (_RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: int) -> int:
    """The current CUDA stream of device index `device` as an integer, what launchers and the native
    bindings take: the raw handle Triton's launcher reads (torch.cuda.current_stream() builds a Stream
    object first)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device)
    return torch.cuda.current_stream(device).cuda_stream


# Triton 3.6's descriptor wrapper (backends/nvidia/driver.py, wrap_handle_tensordesc): the names its
# per-launch function closes over, and the C launcher's leading arguments (format "iiiKKppOOOOOO":
# grid x, y, z, stream, function, cooperative, pdl, two scratch buffers, metadata, launch metadata,
# enter and exit hooks), after which the kernel's arguments come.
_DESC_WRAPPER_FREEVARS = frozenset({"launcher", "tensordesc_indices", "tensordesc_meta"})
_C_LAUNCH_BASE_ARGS = 13
MAPS_PER_DESCRIPTOR = 64  # base addresses remembered per descriptor argument (weights, and reused buffers)
REMEMBER_DESCRIPTORS = os.environ.get("RLK_LAUNCH_DESCRIPTORS", "1") != "0"  # off: the JIT's launcher


class DescriptorLaunch:
    """Launches a compiled kernel with host descriptor arguments through Triton 3.6's C launcher,
    remembering each descriptor's encoded arguments (CUtensorMap, shape, strides) per base address,
    shape and strides. `of(kernel)` is None for any other launcher."""

    def __init__(self, c_launch, descriptors, make_arg, cooperative, pdl):
        self.c_launch, self.make_arg = c_launch, make_arg
        self.descriptors = [(i, meta, {}) for i, meta in descriptors]  # (position, metadata, remembered)
        self.cooperative, self.pdl = cooperative, pdl

    @classmethod
    def of(cls, kernel):
        run = kernel.run
        wrapper = getattr(run, "launch", None)
        code, closure = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
        if code is None or not closure or frozenset(code.co_freevars) != _DESC_WRAPPER_FREEVARS:
            return None
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
        make_arg = wrapper.__globals__.get("make_tensordesc_arg")
        metas = cells["tensordesc_meta"]
        if (make_arg is None or make_arg.__code__.co_argcount != 2
                or wrapper.__globals__.get("_BASE_ARGS_FORMAT_LEN") != _C_LAUNCH_BASE_ARGS
                or not metas or any(m is None for m in metas)  # no metadata: the map is built elsewhere
                or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)):
            return None
        positions = sorted(cells["tensordesc_indices"])
        if len(positions) != len(metas):
            return None
        return cls(cells["launcher"], list(zip(positions, metas)), make_arg,
                   run.launch_cooperative_grid, run.launch_pdl)

    def __call__(self, gx, gy, gz, stream, function, packed, args):
        encodings = []
        for i, meta, remembered in self.descriptors:
            d = args[i]
            if type(d) is Descriptor:
                x = d.tensor
                key = (x.data_ptr(), tuple(x.shape), x.stride())
            else:
                key = (d.base.data_ptr(), tuple(d.shape), tuple(d.strides))
            encoded = remembered.get(key)
            if encoded is None:
                encoded = remember(remembered, key, tuple(self.make_arg(d.build() if type(d) is Descriptor else d,
                                                                        meta)))
            encodings.append(encoded)
        self.launch_encoded(gx, gy, gz, stream, function, packed, args, encodings)

    def launch_encoded(self, gx, gy, gz, stream, function, packed, args, encodings):
        """The C launch of args with the descriptor at each of this kernel's descriptor positions given as
        its encoded arguments (encodings, in position order)."""
        flat, start = [], 0
        for (i, _, _), encoded in zip(self.descriptors, encodings):
            flat += args[start:i]
            flat += encoded
            start = i + 1
        flat += args[start:]
        self.c_launch(gx, gy, gz, stream, function, self.cooperative, self.pdl, None, None, packed, None, None, None,
                      *flat)


def remember(maps: dict, key, encoded: tuple) -> tuple:
    """maps[key] = encoded, with at most MAPS_PER_DESCRIPTOR maps kept (all dropped when full)."""
    if len(maps) >= MAPS_PER_DESCRIPTOR:
        maps.clear()
    maps[key] = encoded
    return encoded


class CachedLaunch:
    """A JIT kernel launched as `kernel[grid](*args, **meta)`, remembering the compiled kernel per
    argument signature. Attributes other than launching are the JIT function's."""

    def __init__(self, jit):
        self.jit = jit
        self._params = [(p.name, p.default) for p in jit.params]
        self._entries = {}

    def __getattr__(self, name):  # fn, params, warmup, ...: the JIT function's
        return getattr(self.jit, name)

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launch(grid, args, meta)

    def launch(self, grid, args, meta):
        if not ENABLED or callable(grid) or _hooked():
            return self.jit[grid](*_built(args), **meta)
        bound = bind(args)
        if bound is None or any(type(v) not in _META_TYPES for v in meta.values()):
            return self.jit[grid](*_built(args), **meta)
        sig, passed = bound
        device = torch.cuda.current_device()
        key = (device, sig, tuple(meta.items()))
        entry = self._entries.get(key)
        if entry is None:
            return self._first(grid, args, meta, key)
        self._run(entry, grid, device, passed)
        return entry[0]

    def _first(self, grid, args, meta, key):
        """The JIT's launch of a signature not seen before; its compiled kernel remembered under key."""
        args = _built(args)
        kernel = self.jit[grid](*args, **meta)
        if hasattr(kernel, "result"):  # an asynchronous compile's future
            kernel = kernel.result()
        # The constexprs and defaults the JIT binds after the positional arguments: fixed by the key.
        tail = tuple(meta[n] if n in meta else d for n, d in self._params[len(args):])
        if all(v == v for v in meta.values()):
            with_descriptors = TensorDescriptor is not None and any(type(a) is TensorDescriptor for a in args)
            self._entries[key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata, tail,
                                  with_descriptors, DescriptorLaunch.of(kernel) if with_descriptors else None)
        return kernel

    @staticmethod
    def _run(entry, grid, device, passed):
        """A remembered kernel's launch on a grid of 1-3 dims with the arguments as bind passes them."""
        kernel, run, function, packed, tail, with_descriptors, by_maps = entry
        n = len(grid)
        gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        if by_maps is not None and REMEMBER_DESCRIPTORS:
            by_maps(gx, gy, gz, stream_handle(device), function, packed, passed + tail)
        else:
            if with_descriptors:
                passed = _built(passed)
            run(gx, gy, gz, stream_handle(device), function, packed, None, None, None, *passed, *tail)


SLOT = object()  # a Template's positional argument that each call gives


class DescriptorSlot(NamedTuple):
    """A Template's positional argument that each call gives as a tensor and the kernel takes as a host
    descriptor over all of it (over its transpose, with transposed) in blocks of block_shape.

    For a call site whose plan key fixes that tensor's dtype, shape and strides (matmul's plans): its
    descriptors then differ from call to call by base address alone, so a call binds the tensor as a
    tensor (its dtype and alignment, as the descriptor's facts would give with the rest fixed) and the
    template keeps each descriptor's encoded map per base address: no descriptor object, transpose or
    (address, shape, strides) key per call."""
    block_shape: tuple
    transposed: bool = False

    def over(self, kernel, tensor: torch.Tensor):
        """The descriptor argument for a call's tensor (host_descriptor)."""
        return host_descriptor(kernel, tensor.t() if self.transposed else tensor, self.block_shape)


class Template:
    """`kernel[grid](*args, **meta)` with the keyword arguments and every positional argument but the
    SLOTs fixed; a call gives the grid and the SLOTs' values in order: `template(grid, *values)`.

    A call site that repeats its shapes (a decode step) builds one per shape and pays, per call, for
    the facts of its SLOT values only: the fixed arguments' facts and the keyword arguments' key were
    taken once, and with them fixed the SLOTs' signature decides the full one (the grid is no fact of
    the kernel's). So the kernel it remembers per (device, SLOT signature) is the one the kernel's own
    launch remembers for the full arguments, which a first call asks it for (CachedLaunch.launch: the
    JIT's kernel, the same bits). Whatever the kernel's launch would not remember (a hook, the cache
    off, a callable grid, an argument type bind does not know) takes the kernel's launch every call.
    A template holds no tensor: SLOTs and DescriptorSlots are where the tensors go."""

    def __init__(self, kernel, args: tuple, meta: dict):
        self.kernel, self.meta, self.args = kernel, dict(meta), tuple(args)
        given = [a is SLOT or type(a) is DescriptorSlot for a in args]
        self.slots = tuple([i for i, g in enumerate(given) if g])
        # (index among a call's values, the slot) of each DescriptorSlot, in position order
        self.descriptor_slots = tuple([(k, args[i]) for k, i in enumerate(self.slots)
                                       if type(args[i]) is DescriptorSlot])
        fixed = bind(tuple([a for a, g in zip(args, given) if not g]))
        self.remembers = (type(kernel) is CachedLaunch and fixed is not None
                          and all(type(v) in _META_TYPES and v == v for v in meta.values()))
        if self.remembers:
            passed = iter(fixed[1])
            self.passed = [None if g else next(passed) for g in given]
            self.meta_key = tuple(self.meta.items())
        self.entries = {}  # (device, SLOT signature) -> (the kernel's entry, a map store per DescriptorSlot)

    def arguments(self, values) -> tuple:
        """The kernel's positional arguments for a call's SLOT values: a DescriptorSlot's tensor as its
        host descriptor."""
        args = list(self.args)
        for i, v in zip(self.slots, values):
            slot = args[i]
            args[i] = v if slot is SLOT else slot.over(self.kernel, v)
        return tuple(args)

    def __call__(self, grid, *values):
        if len(values) != len(self.slots):
            raise TypeError(f"this launch template takes {len(self.slots)} SLOT values, got {len(values)}")
        bound = None
        if self.remembers and ENABLED and TEMPLATES and type(grid) is tuple and not _hooked():
            bound = bind(values)
        if bound is not None:
            device = torch.cuda.current_device()
            hit = self.entries.get((device, bound[0]))
            if hit is not None:
                entry, maps = hit
                passed = self.passed.copy()
                for i, v in zip(self.slots, bound[1]):
                    passed[i] = v
                if self.descriptor_slots:
                    self._run_descriptors(entry, maps, grid, device, passed, values)
                else:
                    CachedLaunch._run(entry, grid, device, tuple(passed))
                return entry[0]
        args = self.arguments(values)
        if type(self.kernel) is not CachedLaunch:  # the interpreter's kernel
            return self.kernel[grid](*args, **self.meta)
        kernel = self.kernel.launch(grid, args, self.meta)
        if bound is not None:  # the entry the kernel's launch made or used for these arguments, if any
            entry = self.kernel._entries.get((device, signature(args), self.meta_key))
            # with DescriptorSlots, remembered only where they are the kernel's descriptors (the maps'
            # positions); descriptors given through plain SLOTs take the kernel's remembered maps
            if entry is not None and (not self.descriptor_slots or entry[6] is None
                                      or [i for i, _, _ in entry[6].descriptors]
                                      == [self.slots[k] for k, _ in self.descriptor_slots]):
                self.entries[(device, bound[0])] = (entry, tuple([{} for _ in self.descriptor_slots]))
        return kernel

    def _run_descriptors(self, entry, maps, grid, device, passed, values):
        """A remembered launch with DescriptorSlots: through the C launcher with each descriptor's map
        remembered per base address (maps, one store per slot), or with the descriptors built where
        the kernel's launcher is another's (DescriptorLaunch.of) or the maps are off."""
        by_maps = entry[6]
        if by_maps is None or not REMEMBER_DESCRIPTORS:
            for k, slot in self.descriptor_slots:
                passed[self.slots[k]] = slot.over(self.kernel, values[k])
            CachedLaunch._run(entry, grid, device, tuple(passed))
            return
        encodings = []
        for (k, slot), (_, meta, _), store in zip(self.descriptor_slots, by_maps.descriptors, maps):
            x = values[k]
            ptr = x.data_ptr()
            encoded = store.get(ptr)
            if encoded is None:
                encoded = remember(store, ptr, tuple(by_maps.make_arg(slot.over(self.kernel, x).build(), meta)))
            encodings.append(encoded)
        n = len(grid)
        by_maps.launch_encoded(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream_handle(device),
                               entry[2], entry[3], tuple(passed) + entry[4], encodings)


PLANS_MAX = 1024  # plans kept per call site; a call site's plans are all dropped when it has this many


def planned(plans: dict, key, make, *args):
    """plans[key], made by make(*args) on the first call with that key: a call site's per-shape
    decision (its Templates and grid arithmetic), bounded by PLANS_MAX. The key must hold every fact
    make reads from args."""
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= PLANS_MAX:
            plans.clear()
        plan = plans[key] = make(*args)
    return plan


def cdiv(x: int, y: int) -> int:
    """triton.cdiv for host code: the same value without the constexpr wrapper that triton >= 3.5 puts
    around it (about 2 us a call on a CPU; launchers make several per call)."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """triton.next_power_of_2 for host code: the smallest power of 2 >= n, 0 for n <= 0 (as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cached(kernel):
    """`@cached` above `@triton.jit`: the kernel launched through CachedLaunch on a GPU; under the
    interpreter the interpreted function itself (nothing to save there)."""
    if JITFunction and isinstance(kernel, JITFunction):
        return CachedLaunch(kernel)
    return kernel
