import os

import torch

# Without a GPU the kernels run under the Triton interpreter; the flag must be set before any
# module with @triton.jit is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        # slow means slow under the interpreter: on a GPU these run
        if "slow" in item.keywords and not HAS_GPU and not config.getoption("--runslow"):
            item.add_marker(pytest.mark.skip(reason="slow under the interpreter: --runslow"))


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def nan_filled_buffers(monkeypatch):
    """A call that, for the rest of the test, pre-fills every new floating-point torch.empty / empty_like
    buffer with NaN: an output element a kernel leaves unwritten then shows (no zero fill hides it)."""
    def arm():
        for name in ("empty", "empty_like"):
            def alloc(*args, _real=getattr(torch, name), **kwargs):
                x = _real(*args, **kwargs)
                return x.fill_(float("nan")) if x.is_floating_point() else x
            monkeypatch.setattr(torch, name, alloc)
    return arm


@pytest.fixture
def kernel_spy(monkeypatch):
    """spy(module, name, see): for the rest of the test, each launch `module.name[grid](*args, **meta)`
    first calls see(name, meta), which may record or edit the launch options, then launches."""
    def spy(module, name, see):
        kernel = getattr(module, name)

        class Spy:
            def __getitem__(self, grid):
                def launch(*args, **meta):
                    see(name, meta)
                    return kernel[grid](*args, **meta)
                return launch
        monkeypatch.setattr(module, name, Spy())
    return spy


@pytest.fixture(scope="module")
def ptx(request):
    """The sm_90a PTX of the test module's NATIVE_SOURCE under native/ (nvcc, the build's flags), for the
    order checks in scripts/ptx_emulator.py; skipped without nvcc."""
    from rlk_triton import native

    try:
        return native.compile_ptx(request.module.NATIVE_SOURCE)
    except native.NativeUnavailable as ex:
        pytest.skip(str(ex))
