#!/usr/bin/env bash
# One device call: linear_logp on the persistent TMA-descriptor kernels (every gpu test, including
# the descriptor-vs-pointer bitwise test, and the benchmark against eager / Liger / CCE), the
# retuned RMSNorm (its tests and benchmark), attention's GPU tests against the tightened contract.
# Usage: bash scripts/gpu_round3.sh <commit>. At most 8 files under $OUT come back.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
( timeout 220 python3 -m pytest -q -n 6 -p no:cacheprovider -m gpu tests/test_attention.py > $OUT/tests_attention.log 2>&1 ) &
timeout 220 python3 -m pytest -q -n 6 -p no:cacheprovider tests/test_linear_logp.py tests/test_rmsnorm.py \
  > $OUT/tests_linear_rmsnorm.log 2>&1
wait
for f in tests_linear_rmsnorm tests_attention; do
  echo "$f: $(grep -E 'passed|failed' $OUT/$f.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/$f.log | head -10
done
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 150 python3 scripts/gpu_linear_logp.py --commit "$C" --out $OUT/linear_bench.json > $OUT/linear_bench.log 2>&1
tail -16 $OUT/linear_bench.log
timeout 100 python3 scripts/gpu_bench_rowwise.py --no-sweep --commit "$C" --out $OUT/rowwise.json > $OUT/rowwise.log 2>&1
grep -E "rlk rmsnorm" $OUT/rowwise.log | cut -c1-220; tail -1 $OUT/rowwise.log
echo "total $(( $(date +%s) - T0 )) s"
