"""native/: the sources compile (nvcc for sm_90a, the torch binding's syntax with the CPU torch's
headers), admission records count only with this process's fingerprint, the gate refuses one differing
bit, and nothing runs without a CUDA torch. On the GPU: the rms_norm kernel goes through the gate."""
import json
import shutil
import subprocess
import sysconfig

import pytest
import torch

from rlk_triton import cli, native

NVCC = shutil.which("nvcc")


SOURCES = [name for op in native.OPS.values() for name in op.sources]


# The build's flags with optimization off: every phase still runs (the front end, NVVM, ptxas, which
# parses the inline PTX, the host compile) in a third of the time or less: on a 2-core CPU, 57 and 25 s
# for the two sources, against 209 and 184 s with the build's flags in a suite run. The optimized build is what
# `native admit` compiles and gates on the GPU.
SYNTAX_FLAGS = [f for f in native.BUILD_FLAGS if f != "-O3"] + ["-Xcicc", "-O0", "-Xptxas", "-O0"]


@pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")
@pytest.mark.parametrize("name", [n for n in SOURCES if n.endswith(".cu")])
def test_kernels_compile_for_sm90(tmp_path, name):
    out = subprocess.run([NVCC, "-c", *SYNTAX_FLAGS, str(native.NATIVE_DIR / name), "-o",
                          str(tmp_path / "k.o")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
@pytest.mark.parametrize("name", [n for n in SOURCES if n.endswith(".cpp")])
def test_binding_parses_against_torch_headers(name):
    from torch.utils.cpp_extension import include_paths

    flags = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    out = subprocess.run(["g++", "-std=c++20", "-w", "-fsyntax-only", *flags, "-DTORCH_EXTENSION_NAME=rlk_native",
                          str(native.NATIVE_DIR / name)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLK_NATIVE_CACHE", str(tmp_path / "records"))
    return tmp_path / "records"


def _record(fp):
    return {"format": native.RECORD_FORMAT, "op": "rmsnorm", "date": "2026-12-04T00:00:00+00:00", "cases": 3,
            "fingerprint": fp}


def test_no_record_means_not_admitted(cache):
    ok, why = native.admission("rmsnorm", "cpu")
    assert not ok and "no admission record" in why and str(cache) in why
    rows = {row["backend"]: row for row in native.status("cpu")}
    assert set(rows) == {"rmsnorm.cuda_native", "selected_logp.cuda_native"}
    assert not any(row["admitted"] for row in rows.values())


def test_status_where_the_build_cannot_run_says_so_first(cache):
    """On a device the native build cannot use, status leads with that reason, not with advice to run
    `admit` (which cannot succeed there); a record there is still named, with its own state."""
    row = next(r for r in native.status("cpu") if r["op"] == "rmsnorm")
    assert row["unavailable"] == native.unavailable_reason("rmsnorm", "cpu") is not None
    assert row["reason"].startswith("cannot build or run here") and "native admit" not in row["reason"]
    native._write_record("rmsnorm", _record(dict(native.fingerprint("rmsnorm", "cpu"), sources="0" * 16)))
    row = next(r for r in native.status("cpu") if r["op"] == "rmsnorm")
    assert not row["admitted"] and "stale record" in row["reason"] and str(native.record_path("rmsnorm")) in row["reason"]


def test_a_record_counts_only_with_this_fingerprint(cache):
    fp = native.fingerprint("rmsnorm", "cpu")
    native._write_record("rmsnorm", _record(fp))
    assert native.admission("rmsnorm", "cpu")[0]
    for key, other in (("sources", "0" * 16), ("torch", "0.0"), ("locked_configs", "feedface")):
        native._write_record("rmsnorm", _record(dict(fp, **{key: other})))
        ok, why = native.admission("rmsnorm", "cpu")
        assert not ok and why.startswith("stale record") and key in why
    native.record_path("rmsnorm").write_text("{not json")
    assert not native.admission("rmsnorm", "cpu")[0]  # an unreadable record is no record


@pytest.mark.parametrize("op", sorted(native.OPS))
def test_config_kernels_are_every_config_the_op_reads(op, monkeypatch, device):
    """An admission depends on the op's own locked-config rows (NativeOp.config_kernels): every table
    lookup of the Triton launches the gate compares against, and of the native launchers' layouts, is
    one of them, so a change that could move the op's bits makes its record stale."""
    from rlk_triton import configs

    read = set()
    for name in ("lookup", "lookup_matmul", "lookup_fixed"):
        real = getattr(configs, name)
        monkeypatch.setattr(configs, name, lambda kernel, *a, _real=real, **k: read.add(kernel) or _real(kernel, *a, **k))
    configs.forget()  # plans made by earlier calls hold their configs: this call looks every row up
    spec = native.OPS[op]
    cases = [inputs for _, inputs in spec.cases(device)]
    for inputs in sorted(cases, key=lambda c: c[0].numel())[:3]:  # the Triton launches, forward and backward
        spec.triton(*inputs)
    for inputs in cases:  # the native launchers' layouts, from the same rows, at every case
        if op == "rmsnorm":
            x, res = inputs[0], inputs[4] if len(inputs) > 4 else None
            native._rmsnorm_config(x, "sm90", res)
            native._rmsnorm_bwd_layout("sm90", x.dtype, x.shape[1])
        else:
            native._slp_config(inputs[0], "sm90")
    assert read and read <= set(spec.config_kernels), (read, spec.config_kernels)


def test_an_admission_hashes_only_its_ops_config_rows(monkeypatch):
    """Another op's config change leaves the record standing; a change of one of the op's rows does not."""
    import dataclasses

    from rlk_triton import configs

    before = {op: native.config_fingerprint(op, "sm90") for op in native.OPS}
    whole = configs.fingerprint("sm90")
    assert before["rmsnorm"] != before["selected_logp"] != whole
    table = dict(configs.LOCKED_CONFIGS)
    try:
        key = next(k for k in table if k[0] == "linear_logp_dlogits" and k[1] == "sm90")
        configs.LOCKED_CONFIGS[key] = dataclasses.replace(table[key], chunks_per_pass=table[key].chunks_per_pass + 1)
        assert configs.fingerprint("sm90") != whole  # the table did change
        assert {op: native.config_fingerprint(op, "sm90") for op in native.OPS} == before
        key = next(k for k in table if k[0] == "rmsnorm_dw_reduce")
        configs.LOCKED_CONFIGS[key] = dataclasses.replace(table[key], num_warps=table[key].num_warps * 2)
        assert native.config_fingerprint("rmsnorm", "sm90") != before["rmsnorm"]
        assert native.config_fingerprint("selected_logp", "sm90") == before["selected_logp"]
    finally:
        configs.LOCKED_CONFIGS.clear()
        configs.LOCKED_CONFIGS.update(table)
    assert native.config_fingerprint("rmsnorm", "sm90") == before["rmsnorm"]


def test_the_source_hash_names_the_sources(tmp_path, monkeypatch):
    before = native.source_hash("rmsnorm")
    for name in native.OPS["rmsnorm"].sources:
        shutil.copy(native.NATIVE_DIR / name, tmp_path / name)
    monkeypatch.setattr(native, "NATIVE_DIR", tmp_path)
    assert native.source_hash("rmsnorm") == before
    (tmp_path / "rmsnorm_kernels.cu").write_text((tmp_path / "rmsnorm_kernels.cu").read_text() + "\n// edit\n")
    assert native.source_hash("rmsnorm") != before


def test_same_bits():
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert native.same_bits(a, a.clone())
    assert not native.same_bits(a, torch.tensor([1.0, float("nan"), -0.0]))  # -0 is another bit pattern
    assert not native.same_bits(a, a.double())
    b = a.clone()
    b[0] = torch.nextafter(b[0], torch.tensor(2.0))
    assert not native.same_bits(a, b)


def test_the_gate_refuses_one_differing_bit():
    def triton(x):
        return (x * 2, x.sum().reshape(1))

    def one_bit_off(x):
        y, s = triton(x)
        y = y.clone()
        y.view(torch.int32)[3] ^= 1
        return y, s

    cases = [(f"case {i}", (torch.randn(8, generator=torch.Generator().manual_seed(i)),)) for i in range(3)]
    assert native.gate("toy", triton, triton, cases)["admitted"]
    report = native.gate("toy", one_bit_off, triton, cases)
    assert not report["admitted"] and len(report["mismatches"]) == 3
    first = report["mismatches"][0]
    x = cases[0][1][0]
    one_ulp = abs((x[3] * 2).view(torch.int32).bitwise_xor(1).view(torch.float32) - x[3] * 2).item()
    assert first == {"case": "case 0", "output": 0, "elements_differing": 1, "max_abs_diff": one_ulp}


def test_nothing_runs_without_a_cuda_torch(cache, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert native.unavailable_reason("rmsnorm", "cuda") == "no CUDA torch here"
    assert native.unavailable_reason("rmsnorm", "cpu").startswith("native kernels run on CUDA")
    with pytest.raises(native.NativeUnavailable):
        native.load("rmsnorm")
    assert cli.main(["native", "admit"]) == 1
    assert "not run: no CUDA torch here" in capsys.readouterr().out
    assert cli.main(["native", "status"]) == 0
    assert "not admitted" in capsys.readouterr().out


def test_unknown_op_is_a_typed_error():
    from rlk_triton.errors import InputError

    with pytest.raises(InputError, match="op"):
        native.native_op("softmax")


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(native.OPS))
def test_native_kernel_through_the_gate(tmp_path, monkeypatch, op):
    """The admission itself: every gate case bitwise equal to the Triton kernel, a record written."""
    monkeypatch.setenv("RLK_NATIVE_CACHE", str(tmp_path))
    report = native.admit(op)
    assert report["admitted"], report["mismatches"][:5]
    assert native.admission(op)[0]


def _graph_replay(fn):
    """fn's outputs from a CUDA-graph replay (captured after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()
    graph.replay()
    torch.cuda.synchronize()
    return static


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(native.OPS))
def test_admitted_native_calls_give_the_triton_bits_and_replay_in_a_graph(op):
    """Where this process's records admit the op (scripts/gpu_session.sh runs the gate first): the
    public cuda_native call, forward and backward through autograd, gives the Triton backend's bits,
    and its no-grad call replays in a CUDA graph with the eager bits."""
    ok, why = native.usable(op, "cuda:0")
    if not ok:
        pytest.skip(f"{op} not admitted here: {why}")
    g = torch.Generator(device="cuda").manual_seed(5)
    bf = torch.bfloat16
    if op == "rmsnorm":
        from rlk_triton.ops.rmsnorm import rms_norm

        x, r, gy, gr = (torch.randn(64, 4096, device="cuda", generator=g).to(bf) for _ in range(4))
        w = (torch.randn(4096, device="cuda", generator=g) * 0.5 + 1).to(bf)

        def run(backend, grad):
            leaves = [t.clone().requires_grad_(grad) for t in (x, w, r)]
            y, res = rms_norm(leaves[0], leaves[1], residual=leaves[2], weight_offset=1.0, backend=backend)
            return [y, res] + (list(torch.autograd.grad((y, res), leaves, (gy, gr))) if grad else [])
    else:
        from rlk_triton.logp import selected_logp

        x = (torch.randn(8, 151936, device="cuda", generator=g) * 4).to(bf)
        t = torch.randint(0, 151936, (8,), device="cuda", generator=g)
        gl, ge = torch.randn(8, device="cuda", generator=g), torch.randn(8, device="cuda", generator=g)

        def run(backend, grad):
            leaf = x.clone().requires_grad_(grad)
            logp, ent = selected_logp(leaf, t, temperature=0.8, return_entropy=True, validate=False, backend=backend)
            return [logp, ent] + (list(torch.autograd.grad((logp, ent), leaf, (gl, ge))) if grad else [])
    want, got = run("triton", True), run("cuda_native", True)
    assert all(native.same_bits(a, b) for a, b in zip(want, got))
    if op == "rmsnorm":  # an empty batch: empty results, no launch
        assert rms_norm(x[:0], w, backend="cuda_native").shape == (0, 4096)
    else:
        assert selected_logp(x[:0], t[:0], backend="cuda_native").shape == (0,)
    if op == "selected_logp":  # the indexed variant: three rows scored, the gradient zero elsewhere
        from rlk_triton.logp import selected_logp_indexed

        rows, res = torch.tensor([5, 0, 7], device="cuda"), []
        for backend in ("triton", "cuda_native"):
            leaf = x.clone().requires_grad_()
            lp = selected_logp_indexed(leaf, t[:3], rows, validate=False, backend=backend)
            res.append((lp,) + torch.autograd.grad(lp, leaf, gl[:3]))
        assert all(native.same_bits(a, b) for a, b in zip(*res))
    eager = [o.clone() for o in run("cuda_native", False)]
    replayed = _graph_replay(lambda: run("cuda_native", False))
    assert all(native.same_bits(a, b) for a, b in zip(eager, replayed)) and len(replayed) == 2


# ---- the registry and the call path ----

def test_capabilities_list_the_native_backend_with_why_it_is_unavailable():
    from rlk_triton import registry

    (d,) = [x for x in registry.capabilities("cpu") if x["backend_id"] == "rmsnorm.cuda_native"]
    assert d["backend_class"] == "native" and not d["available"] and not d["strict_eligible"]
    assert d["unavailable_reason"].startswith("native kernels run on CUDA")


def test_the_policy_never_picks_an_unadmitted_native_backend(device):
    from rlk_triton import policy

    from rlk_triton.errors import PolicyError

    try:
        dec = policy.resolve("rmsnorm", dtype=torch.bfloat16, device=device, fast="auto", consistency="strict").to_dict()
    except PolicyError as ex:  # on a CPU no backend is optimized: the decision record still lists them
        dec = ex.decision
    assert dec["chosen"] != "rmsnorm.cuda_native"
    (cand,) = [c for c in dec["candidates"] if c["backend_id"] == "rmsnorm.cuda_native"]
    assert not cand["taken"] and cand["class"] == "native"


def test_cuda_native_without_an_admission_is_a_typed_error(device, cache):
    from rlk_triton.errors import BackendError
    from rlk_triton.ops.rmsnorm import rms_norm

    native.usable.cache_clear()  # an empty record cache: nothing is admitted, whatever ran before

    x = torch.randn(3, 128, device=device)
    w = torch.ones(128, device=device)
    with pytest.raises(BackendError, match="not usable here"):
        rms_norm(x, w, backend="cuda_native")
    with pytest.raises(BackendError, match="not usable here"):
        rms_norm(x, w, backend="cuda_native", residual=x)
    with pytest.raises(BackendError, match="unknown backend"):
        rms_norm(x, w, backend="cuda")


@pytest.mark.parametrize("fused", [False, True])
def test_an_admitted_native_rms_norm_runs_forward_and_backward(device, monkeypatch, fused):
    """The call path, with the native kernels stood in by the Triton launchers (the gate's job is the
    bits; this checks the plumbing): values and gradients are the Triton path's, with and without
    the fused residual add, and the backward goes through the native entry."""
    from rlk_triton.ops import rmsnorm

    def fwd(x, w, eps, offset, residual=None, layout=None):
        y, res_out, rstd = rmsnorm.launch_forward(x, w, residual, eps, offset)
        return (y, rstd) if residual is None else (y, res_out, rstd)

    backward_calls = []

    def bwd(*args):
        backward_calls.append(args[-2:])  # (with_dw, with_dres)
        return rmsnorm.launch_backward(*args)

    monkeypatch.setattr(native, "usable", lambda op, dev: (True, None))
    monkeypatch.setattr(native, "rms_norm_fwd", fwd)
    monkeypatch.setattr(native, "rms_norm_bwd", bwd)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 96, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(96, generator=g) + 1).to(device, torch.bfloat16)
    r = torch.randn(2, 3, 96, generator=g).to(device, torch.bfloat16) if fused else None
    outs = []
    for backend in ("triton", "cuda_native"):
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        rl = r.clone().requires_grad_() if fused else None
        out = rmsnorm.rms_norm(xl, wl, eps=1e-5, residual=rl, weight_offset=0.5, backend=backend)
        y, res_out = out if fused else (out, None)
        loss = y.float().square().sum() + (res_out.float().sin().sum() if fused else 0)
        loss.backward()
        outs.append((y.detach(), xl.grad, wl.grad) + ((res_out.detach(), rl.grad) if fused else ()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert backward_calls == [(True, fused)]
    with torch.no_grad():  # no graph: the native forward alone, same values
        out = rmsnorm.rms_norm(x, w, eps=1e-5, residual=r, weight_offset=0.5, backend="cuda_native")
        assert torch.equal(out[0] if fused else out, outs[0][0])
        if fused:
            assert torch.equal(out[1], outs[0][3])


def test_cuda_native_refuses_unaligned_inputs_with_a_typed_error(device, monkeypatch):
    """The native layout is the Triton kernel's for 16-byte aligned x and weight only: anything else
    is a BackendError naming the backend, never a launch with another order."""
    from rlk_triton.errors import BackendError
    from rlk_triton.ops import rmsnorm

    monkeypatch.setattr(native, "usable", lambda op, dev: (True, None))
    buf = torch.randn(3 * 96 + 1, device=device).to(torch.bfloat16)
    x = buf[1:].view(3, 96)  # 2 bytes off a 16-byte boundary
    w = torch.ones(96, device=device, dtype=torch.bfloat16)
    with pytest.raises(BackendError, match="16-byte aligned"):
        rmsnorm.rms_norm(x, w, backend="cuda_native")
    with pytest.raises(BackendError, match="16-byte aligned"):
        rmsnorm.rms_norm(buf[:288].view(3, 96), torch.ones(97, device=device, dtype=torch.bfloat16)[1:],
                         backend="cuda_native")
    with pytest.raises(BackendError, match="16-byte aligned"):
        rmsnorm.rms_norm(buf[:288].view(3, 96), w, residual=x, backend="cuda_native")


def test_the_native_backward_gets_aligned_gradients(monkeypatch):
    """A contiguous gradient 2 bytes off a 16-byte boundary (a view autograd may hand over) reaches the
    binding as an aligned copy with the same bits, never as a pointer the layout rule does not cover;
    the launch config is the locked backward's."""
    seen = {}

    class Ext:
        @staticmethod
        def rms_norm_bwd(grad_y, grad_res, h, w, rstd, offset, with_dw, with_dres, block, warps, rows, stream):
            seen.update(ptrs=[t.data_ptr() % 16 for t in (grad_y, grad_res)], grad_y=grad_y.clone(),
                        config=(block, warps, rows))
            return h, w, h

    from rlk_triton.ops import launch

    monkeypatch.setattr(launch, "stream_handle", lambda index: 0)  # no CUDA stream on this machine
    h = torch.randn(3, 96).to(torch.bfloat16)
    buf = torch.randn(3 * 96 + 1).to(torch.bfloat16)
    g = buf[1:].view(3, 96)
    assert g.is_contiguous() and g.data_ptr() % 16
    native._rmsnorm_backward(Ext, g, g, h, torch.ones(96, dtype=torch.bfloat16), torch.ones(3), 0.0, True, True)
    assert seen["ptrs"] == [0, 0] and torch.equal(seen["grad_y"], g)
    block, warps, rows, _ = native._rmsnorm_bwd_layout("interpreter", torch.bfloat16, 96)
    assert seen["config"] == (block, warps, rows)


def test_cuda_native_refuses_a_fused_layout_it_has_no_rule_for(device, monkeypatch):
    """The fused add with H not a multiple of 16 and a row stride that is one (docs/native.md): a
    BackendError, never the binding's error or another order."""
    from rlk_triton.errors import BackendError
    from rlk_triton.ops import rmsnorm

    monkeypatch.setattr(native, "usable", lambda op, dev: (True, None))
    layout = native._rmsnorm_config
    monkeypatch.setattr(native, "_rmsnorm_config", lambda x, residual=None: layout(x, "sm90", residual))  # the H200's
    x = torch.randn(2, 4112, device=device).to(torch.bfloat16)[:, :4099]
    w = torch.ones(4099, device=device, dtype=torch.bfloat16)
    with pytest.raises(BackendError, match="no layout for the fused add"):
        rmsnorm.rms_norm(x, w, residual=x.clone(), backend="cuda_native")


def test_cuda_native_refuses_rows_it_has_no_kernel_for(device, monkeypatch):
    """Rows of several tiles (H above the locked tile) or with fewer lanes than threads have no native
    kernel and no gate case: a BackendError, not the binding's RuntimeError."""
    from rlk_triton.errors import BackendError
    from rlk_triton.ops import rmsnorm

    monkeypatch.setattr(native, "usable", lambda op, dev: (True, None))
    for H in (32, 3 * 16384):
        x = torch.randn(2, H, device=device).to(torch.bfloat16)
        with pytest.raises(BackendError, match="one tile"):
            rmsnorm.rms_norm(x, torch.ones(H, device=device, dtype=torch.bfloat16), backend="cuda_native")


# ---- selected_logp ----

def test_selected_logp_cuda_native_without_an_admission_is_a_typed_error(device, cache):
    from rlk_triton.errors import BackendError
    from rlk_triton.logp import selected_logp, selected_logp_indexed

    native.usable.cache_clear()
    logits = torch.randn(3, 100, device=device)
    t = torch.tensor([1, 2, 3], device=device)
    with pytest.raises(BackendError, match="not usable here"):
        selected_logp(logits, t, backend="cuda_native")
    with pytest.raises(BackendError, match="not usable here"):
        selected_logp_indexed(logits, t, torch.arange(3, device=device), backend="cuda_native")


@pytest.mark.parametrize("entropy", [False, True])
def test_an_admitted_native_selected_logp_runs_forward_and_backward(device, monkeypatch, entropy):
    """The call path with the native kernels stood in by the Triton launchers (the gate's job is the
    bits): values and gradients equal the Triton path's, with a per-row temperature and an ignored row,
    for [N, V], [B, T, V] and the indexed variant."""
    from rlk_triton.logp import selected_logp, selected_logp_indexed

    from rlk_triton.ops import selected_logp as slp

    monkeypatch.setattr(native, "usable", lambda op, dev: (True, None))
    monkeypatch.setattr(native, "selected_logp_fwd", lambda *a, layout=None: tuple(slp.launch_forward(*a)))
    monkeypatch.setattr(native, "selected_logp_bwd", slp.launch_backward)
    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(5, 300, generator=g) * 3).to(device, torch.bfloat16)
    t = torch.randint(0, 300, (5,), generator=g).to(device)
    t[2] = -100
    temps = (torch.rand(5, generator=g) + 0.5).to(device)
    outs = []
    for backend in ("triton", "cuda_native"):
        x = logits.clone().requires_grad_()
        out = selected_logp(x, t, temperature=temps, return_entropy=entropy, backend=backend)
        logp, ent = out if entropy else (out, None)
        (logp.sum() + (ent.sin().sum() if entropy else 0)).backward()
        outs.append((logp.detach(), x.grad) + ((ent.detach(),) if entropy else ()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    with torch.no_grad():  # a rollout: no graph, the native forward alone
        out = selected_logp(logits[0], t[0], temperature=0.7, backend="cuda_native")
        assert torch.equal(out, selected_logp(logits[0], t[0], temperature=0.7))
        assert selected_logp(logits[:0], t[:0], backend="cuda_native").shape == (0,)  # empty batch: empty result
    # [B, T, V] logits reach the native kernels as their [N, V] view; values and gradients unchanged
    x3 = logits[:4].view(2, 2, 300)
    outs = []
    for backend in ("triton", "cuda_native"):
        x = x3.clone().requires_grad_()
        logp = selected_logp(x, t[:4].view(2, 2), backend=backend)
        logp.sum().backward()
        outs.append((logp.detach(), x.grad))
    for a, b in zip(*outs):
        assert a.shape == b.shape and torch.equal(a, b)
    # the indexed variant: the scored rows only, zero gradient elsewhere, the same bits
    rows = torch.tensor([3, 0, 4], device=device)
    outs = []
    for backend in ("triton", "cuda_native"):
        x = logits.clone().requires_grad_()
        logp, ent = selected_logp_indexed(x, t[:3], rows, temperature=temps[:3], return_entropy=True, backend=backend)
        (logp.sum() + ent.sin().sum()).backward()
        outs.append((logp.detach(), ent.detach(), x.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert not outs[1][2][[1, 2]].any()


def test_selected_logp_cuda_native_refuses_what_it_has_no_kernel_for(device, monkeypatch):
    """[B, T, V] logits, more vocab chunks than a merge warp has lanes, unaligned logits: BackendError,
    never another order."""
    from rlk_triton.errors import BackendError
    from rlk_triton.logp import selected_logp

    monkeypatch.setattr(native, "usable", lambda op, dev: (True, None))
    layout = native._slp_config
    monkeypatch.setattr(native, "_slp_config", lambda x: layout(x, "sm90"))  # the H200's table
    with pytest.raises(BackendError, match=r"view as \[N, V\]"):  # rows of a [2, 4, 64] not one stride apart
        selected_logp(torch.randn(2, 4, 64, device=device)[:, :3], torch.zeros(2, 3, dtype=torch.long, device=device),
                      backend="cuda_native")
    with pytest.raises(BackendError, match=r"view as \[N, V\]"):  # a size-1 dim whose stride is not dense
        selected_logp(torch.randn(3, 64, device=device).expand(1, 3, 64).as_strided((1, 3, 64), (8, 64, 1)),
                      torch.zeros(1, 3, dtype=torch.long, device=device), backend="cuda_native")
    with pytest.raises(BackendError, match="at most 64 vocab chunks"):
        selected_logp(torch.zeros(1, 64 * 4096 + 1, device=device), torch.zeros(1, dtype=torch.long, device=device),
                      backend="cuda_native")
    buf = torch.zeros(2 * 64 + 1, device=device, dtype=torch.bfloat16)
    with pytest.raises(BackendError, match="16-byte aligned"):
        selected_logp(buf[1:].view(2, 64), torch.zeros(2, dtype=torch.long, device=device), backend="cuda_native")


def test_native_selected_logp_views_dense_leading_dims_as_rows():
    """[B, T, V] (and more leading dims) with dense row strides become the [N, V] view, a size-1 dim's
    stride included; anything else has no native rows (BackendError on the call path)."""
    x = torch.empty(2, 3, 64)
    assert native._slp_rows(x).shape == (6, 64) and native._slp_rows(x).data_ptr() == x.data_ptr()
    assert native._slp_rows(torch.empty(2, 2, 3, 64)).shape == (12, 64)
    assert native._slp_rows(torch.empty(64)).shape == (1, 64)
    assert native._slp_rows(torch.empty(2, 4, 64)[:, :3]) is None
    assert native._slp_rows(torch.empty(1, 3, 64).as_strided((1, 3, 64), (8, 64, 1))) is None
    strided_rows = torch.empty(2, 3, 80)[:, :, :64]  # rows 80 apart: a dense [6, 64] view with stride 80
    assert native._slp_rows(strided_rows).stride() == (80, 1)


def test_selected_logp_native_layout_follows_the_row_stride():
    """vec: the full vector for row strides that are multiples of 16, else 1 (docs/native.md)."""
    x = torch.empty(2, 151936, dtype=torch.bfloat16)
    assert native._slp_config(x, "sm90") == (2048, 8192, 8)
    assert native._slp_config(torch.empty(2, 151952, dtype=torch.bfloat16)[:, :151936], "sm90")[2] == 8
    assert native._slp_config(torch.empty(2, 151937, dtype=torch.bfloat16)[:, :151936], "sm90")[2] == 1
    assert native._slp_config(torch.empty(2, 4096, dtype=torch.float32), "sm90") == (1024, 8192, 4)
    assert native._slp_config(torch.empty(2, 151936, dtype=torch.float32), "sm90") == (1024, 4096, 4)


def test_selected_logp_gate_cases_cover_every_native_kernel():
    """The gate's cases reach every merge width (one chunk, 2 .. 32 lanes, two warps), both vector
    widths and every option, in each dtype: no native variant goes unadmitted-but-selectable. Their
    scored rows are distinct: a row listed twice has two programs writing its d logits in either
    kernel, a race that no bitwise comparison can pass (the first H200 gate failed on one)."""
    from rlk_triton.ops import selected_logp as slp

    seen = set()
    for label, (logits, target, row_index, temperature, temps, _, entropy) in native._slp_cases("cpu"):
        if row_index is not None:
            assert row_index.unique().numel() == row_index.numel(), label
        block_v, chunk_v, vec = native._slp_config(logits, "sm90")
        chunks = slp.chunk_count(logits.shape[-1], chunk_v)
        width = 1 if chunks == 1 else 1 << (chunks - 1).bit_length()
        seen.add((logits.dtype, "merge", width))
        seen.add((logits.dtype, "vec", vec))
        seen.add((logits.dtype, "flags", entropy, row_index is not None, temps is not None))
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        widths = {w for d, kind, *rest in seen if d == dt and kind == "merge" for w in rest}
        # float32's chunk is 4096 above V 8192: 3 chunks at least, so no 2-lane merge exists for it
        assert ({1, 4, 8, 16, 32, 64} if dt == torch.float32 else {1, 2, 4, 8, 16, 32, 64}) <= widths, (dt, widths)
        assert {(dt, "vec", 1), (dt, "vec", 16 // torch.empty(0, dtype=dt).element_size())} <= seen
        for flags in ((False, False, False), (True, False, False), (True, False, True), (True, True, False)):
            assert (dt, "flags", *flags) in seen, (dt, flags)


def test_rmsnorm_gate_cases_cover_every_native_kernel():
    """Every (num_warps, lanes per thread) the native rms_norm kernels are built for is reached by a
    gate case in each dtype, forward (both vector widths of the two-rows kernel) and backward (with and
    without the residual's gradient, both dW reduction layouts, more than one group of partial rows):
    no native variant goes unadmitted-but-selectable."""
    import re

    from rlk_triton.ops import rmsnorm

    built = {(int(w), int(e)) for w, e in re.findall(r"RLK_CFG\((\d+), (\d+)\)",
                                                     (native.NATIVE_DIR / "rmsnorm_kernels.cu").read_text())}
    assert len(built) == 8
    seen = set()
    for _, (x, w, eps, offset, *res) in native._rmsnorm_cases("cpu"):
        dt, (N, H) = x.dtype, x.shape
        block, warps, vec, _ = native._rmsnorm_config(x, "sm90", res[0] if res else None)
        seen.add((dt, "fwd", warps, block // (32 * warps)))
        seen.add((dt, "fwd vec", vec))
        block, warps, rows, _ = native._rmsnorm_bwd_layout("sm90", dt, H)
        assert block == rmsnorm.hidden_tile(rmsnorm.configs.lookup("rmsnorm_bwd", "sm90", dt, H), H)
        seen.add((dt, "bwd", warps, block // (32 * warps)))
        seen.add((dt, "bwd flags", bool(res), H % 16 == 0, -(-N // rows) > 128))
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for w, e in built:
            assert (dt, "fwd", w, e) in seen and (dt, "bwd", w, e) in seen, (dt, w, e)
        assert (dt, "fwd vec", 16 // dt.itemsize) in seen
        if dt != torch.float32:
            assert (dt, "fwd vec", 1) in seen
        for flags in ((False, True, False), (False, False, False), (True, True, False), (True, False, False),
                      (False, True, True), (False, False, True)):
            assert (dt, "bwd flags", *flags) in seen, (dt, flags)


def test_seeding_copies_only_a_committed_record_with_this_fingerprint(cache, tmp_path, monkeypatch):
    """scripts/native_seed_records.py (the GPU session's tests step): a committed record whose fingerprint
    is this process's goes into the record cache and admits the op; one with another fingerprint does
    not; a record already in the cache is left alone."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import native_seed_records as seed

    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.setattr(seed, "DOCS", docs)
    fp = native.fingerprint("rmsnorm", "cuda")
    (docs / "rmsnorm-x-admission-2026-12-06.json").write_text(json.dumps(_record(fp)))
    stale = dict(native.fingerprint("selected_logp", "cuda"), sources="0" * 16)
    (docs / "selected_logp-x-admission-2026-12-06.json").write_text(json.dumps(dict(_record(stale), op="selected_logp")))
    (docs / "selected_logp-y-admission-2026-12-07.json").write_text("{not json")  # read first: skipped, no crash
    assert seed.main() == 0
    assert native.read_record("rmsnorm")["fingerprint"] == fp and native.admission("rmsnorm", "cuda")[0]
    assert native.read_record("selected_logp") is None
    native._write_record("rmsnorm", dict(_record(fp), cases=99))
    seed.main()
    assert native.read_record("rmsnorm")["cases"] == 99
