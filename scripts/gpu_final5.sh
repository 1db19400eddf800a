#!/usr/bin/env bash
# One device call after locking round 4's results (d hidden on descriptors, split row sums, two-row
# RMSNorm forward): the whole gpu suites of the changed operators, then the linear_logp benchmark
# with competitors and the matmul against cuBLAS, then the row-wise benchmark without its sweep.
# Usage: bash scripts/gpu_final5.sh <commit>.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
timeout 210 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  tests/test_rl_losses.py tests/test_rmsnorm.py tests/test_aot_compile.py > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -12
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 170 python3 scripts/gpu_linear_logp.py --commit "$C" --out $OUT/linear_bench.json > $OUT/linear_bench.log 2>&1
grep -E "'name'" $OUT/linear_bench.log | cut -c1-220
echo "linear done at $(( $(date +%s) - T0 )) s"
timeout 70 python3 scripts/gpu_bench_rowwise.py --no-sweep --commit "$C" --out $OUT/rowwise.json > $OUT/rowwise.log 2>&1
grep -E "forward alone|backward alone" $OUT/rowwise.log | cut -c1-200
echo "total $(( $(date +%s) - T0 )) s"
