#!/usr/bin/env bash
# One device call for what is written but not yet run on a GPU:
# the rewritten GSPO kernels and the inductor fix, attention (tests, benchmark, error measurement),
# the RMSNorm backward sweep, and the GPU error measurements of the row-wise / positional ops.
# Every step is time-boxed and writes under $OUT, so a cut run keeps what it measured.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout 150 python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider tests/test_gspo.py tests/test_rl_losses.py \
  tests/test_rl_backends.py tests/test_rl_registry.py tests/test_attention.py > $OUT/pending_tests.log 2>&1
grep -E "passed|failed" $OUT/pending_tests.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/pending_tests.log | head -20
timeout 150 python3 scripts/gpu_bench_attention.py --out $OUT/attention.json > $OUT/attention.log 2>&1; tail -6 $OUT/attention.log
timeout 80 python3 scripts/measure_attention.py --out $OUT/attention_errors.json > $OUT/attention_errors.log 2>&1; tail -6 $OUT/attention_errors.log
timeout 80 python3 scripts/gpu_bench_rowwise.py --out $OUT/rowwise_sweep.json > $OUT/rowwise_sweep.log 2>&1; grep sweep $OUT/rowwise_sweep.log | tail -14
timeout 60 python3 scripts/measure_rowwise.py --big --out $OUT/rowwise_errors.json > /dev/null 2>&1
timeout 60 python3 scripts/measure_positional.py --big --out $OUT/positional_errors.json > /dev/null 2>&1
ls $OUT
