#!/usr/bin/env bash
# Round 6, the closing device call (under 10 minutes, every step with its own timeout): the gpu tests
# of linear_logp and matmul, the linear_logp benchmark with competitors, the matmul on both loading
# paths against cuBLAS, and linear_logp against eager at other LM-head shapes.
# Usage: bash scripts/gpu_round6_final.sh <commit>.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -12
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 300 python3 scripts/gpu_linear_logp.py --commit "$C" --out $OUT/linear_bench.json > $OUT/linear_bench.log 2>&1
grep -E "'name'|'shape'|'N'" $OUT/linear_bench.log | cut -c1-330
tail -3 $OUT/linear_bench.log | cut -c1-600
echo "total $(( $(date +%s) - T0 )) s"
