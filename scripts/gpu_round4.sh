#!/usr/bin/env bash
# One device call: linear_logp with d hidden on the persistent TMA-descriptor matmul too (all its
# gpu tests, the descriptor-vs-pointer bitwise tests of linear_logp and matmul_into, the n_tiles
# specialization fix) and the benchmark. Usage: bash scripts/gpu_round4.sh <commit>.
set -u
export PYTHONUNBUFFERED=1
C=${1:-unknown}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  -k "within_contract or descriptor" > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -10
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 90 python3 scripts/gpu_linear_logp.py --quick --commit "$C" --out $OUT/linear_bench.json > $OUT/linear_bench.log 2>&1
grep -E "rlk_triton|eager|error" $OUT/linear_bench.log | cut -c1-200
echo "total $(( $(date +%s) - T0 )) s"
