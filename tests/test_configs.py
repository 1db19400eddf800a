"""The locked-config table: complete, row-count free, fingerprinted."""
import inspect

import pytest
import torch
import triton

from rlk_triton import configs


def test_every_kernel_dtype_bucket_has_a_row_on_every_arch():
    for kernel in ("selected_logp_fwd", "selected_logp_bwd"):
        for arch in ("interpreter", "sm90", "sm80", "sm100"):
            for dt in (torch.bfloat16, torch.float16, torch.float32):
                for V in (1, 1024, 1025, 8192, 8193, 262144):
                    cfg = configs.lookup(kernel, arch, dt, V)
                    assert cfg.block_v & (cfg.block_v - 1) == 0


def test_lookup_cannot_see_the_number_of_rows():
    assert list(inspect.signature(configs.lookup).parameters) == ["kernel", "arch", "dtype", "V"]


def test_v_buckets():
    assert [configs.v_bucket(v) for v in (1, 1024, 1025, 8192, 8193)] == \
        ["v<=1024", "v<=1024", "v<=8192", "v<=8192", "v>8192"]


def test_unknown_combination_fails():
    with pytest.raises(KeyError):
        configs.lookup("selected_logp_fwd", "interpreter", torch.float64, 10)
    with pytest.raises(KeyError):
        configs.lookup("selected_logp_fwd", "tpu", torch.float32, 10)


def test_fingerprint_names_table_triton_and_arch(monkeypatch):
    a = configs.fingerprint("sm90")
    assert a == configs.fingerprint("sm90") and a != configs.fingerprint("interpreter")
    monkeypatch.setattr(triton, "__version__", "0.0.0")
    assert configs.fingerprint("sm90") != a
    monkeypatch.undo()
    key = next(iter(configs.LOCKED_CONFIGS))
    monkeypatch.setitem(configs.LOCKED_CONFIGS, key, configs.LaunchConfig(64, 1, 1))
    assert configs.fingerprint("sm90") != a


def test_per_token_rl_kernels_have_one_bucket_on_every_arch():
    kernels = {k for (k, _, _, b), c in configs.LOCKED_CONFIGS.items()
               if b == "any" and isinstance(c, configs.LaunchConfig)}
    assert {"gae", "group_stats", "rl_policy_loss_rows", "rl_ratio_kl_fwd"} <= kernels
    assert {configs.lookup_fixed("rl_policy_loss_split", a).block_v for a in ("interpreter", "sm90")} <= {0, 1}
    for kernel in kernels - {"rl_policy_loss_split"}:  # a switch (0 / 1), not a tile
        for arch in ("interpreter", "sm90", "sm80"):
            assert configs.lookup_fixed(kernel, arch).block_v > 0
    assert list(inspect.signature(configs.lookup_fixed).parameters) == ["kernel", "arch"]


def test_fused_kernel_tiles_are_row_count_free_and_chunks_whole_tiles():
    # rows / cols pick a member of the matmul's bit class; linear_logp's fused kernels have one config
    assert list(inspect.signature(configs.lookup_matmul).parameters) == ["kernel", "arch", "dtype", "rows", "cols"]
    for kernel in ("linear_logp_fwd", "linear_logp_dlogits", "linear_logp_dhidden"):
        for rows in (1, 17, 4096):
            assert configs.lookup_matmul(kernel, "sm90", torch.bfloat16, rows) == \
                configs.lookup_matmul(kernel, "sm90", torch.bfloat16)
    for kernel in ("matmul", "linear_logp_fwd", "linear_logp_dlogits"):
        for arch in ("interpreter", "sm90", "sm80"):
            for dt in (torch.bfloat16, torch.float16, torch.float32):
                cfg = configs.lookup_matmul(kernel, arch, dt)
                assert min(cfg.block_m, cfg.block_n, cfg.block_k) >= 16  # tl.dot's minimum
                if kernel == "linear_logp_dlogits":
                    assert cfg.chunk_v % cfg.block_n == 0
    # the backward's chunks are whole forward tiles: one alignment rule for tensor parallelism
    for arch in ("interpreter", "sm90", "sm80"):
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            assert configs.lookup_matmul("linear_logp_dlogits", arch, dt).chunk_v % \
                configs.lookup_matmul("linear_logp_fwd", arch, dt).block_n == 0


def test_attention_dkdv_tiles_have_at_least_as_many_query_rows_as_keys():
    """On the H200, dk / dv tiles of 32 query rows against 64 or 128 keys (D 128, bf16) gave dk that
    changed from run to run, 13-40% off (docs/reports/h200-attention-tiles-2026-12-04.json, not
    isolated: the kernel has one writer per element). No locked row may be of that shape; a new row
    passes scripts/gpu_attention_tiles.py's determinism check first."""
    rows = {k: c for k, c in configs.LOCKED_CONFIGS.items() if k[0] == "attention_bwd_dkdv"}
    assert rows
    for key, cfg in rows.items():
        assert cfg.block_m >= cfg.block_n, (key, cfg)


def test_lookups_follow_every_change_of_the_table(monkeypatch):
    """Lookups are memoized (a launch's host time); every way of changing the table empties the memo,
    so a replaced row is what the next lookup returns, and the old one again once it is put back."""
    key = ("rmsnorm_fwd", "interpreter", "float32", configs.v_bucket(4096))
    att = ("attention_fwd", "interpreter", "bfloat16", "d<=128")
    old, old_att = configs.LOCKED_CONFIGS[key], configs.LOCKED_CONFIGS[att]
    assert configs.lookup("rmsnorm_fwd", "interpreter", torch.float32, 4096) is old
    assert configs.lookup_attention("attention_fwd", "interpreter", torch.bfloat16, 64) is old_att
    new = configs.LaunchConfig(old.block_v * 2, old.num_warps, old.num_stages)
    with monkeypatch.context() as m:
        m.setitem(configs.LOCKED_CONFIGS, key, new)
        assert configs.lookup("rmsnorm_fwd", "interpreter", torch.float32, 4096) is new
    assert configs.lookup("rmsnorm_fwd", "interpreter", torch.float32, 4096) is old
    saved = dict(configs.LOCKED_CONFIGS)
    try:
        configs.LOCKED_CONFIGS.clear()  # as the sweep scripts restore the table
        with pytest.raises(KeyError):
            configs.lookup_attention("attention_fwd", "interpreter", torch.bfloat16, 64)
        configs.LOCKED_CONFIGS.update(saved | {att: new})
        assert configs.lookup_attention("attention_fwd", "interpreter", torch.bfloat16, 64) is new
    finally:
        configs.LOCKED_CONFIGS.clear()
        configs.LOCKED_CONFIGS.update(saved)
    assert configs.lookup_attention("attention_fwd", "interpreter", torch.bfloat16, 64) is old_att
    assert configs.LOCKED_CONFIGS == saved


def test_a_change_of_the_table_empties_the_plan_stores(monkeypatch):
    """Ops keep per-shape plans made from table rows (ops.launch.planned): a changed row must reach the
    next call, as it reaches the lookups' memo."""
    store = configs.plan_store()
    store["a shape"] = "a plan"
    key = next(iter(configs.LOCKED_CONFIGS))
    monkeypatch.setitem(configs.LOCKED_CONFIGS, key, configs.LOCKED_CONFIGS[key])
    assert not store
    store["a shape"] = "a plan"
    configs.forget()
    assert not store
