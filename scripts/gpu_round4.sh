#!/usr/bin/env bash
# One device call for what is written but not yet run on a GPU: linear_logp's d hidden on the
# persistent TMA-descriptor matmul (forced on by the "descriptor" tests, which compare it bitwise with
# the pointer kernel), the n_tiles specialization fix, policy_loss's split row sums (bitwise test and
# benchmark), then the linear_logp benchmark, which times both paths in one run. If the tests pass,
# turn persistent_tma on for linear_logp_dhidden and rl_policy_loss_split's cuda row to 1 in
# rlk_triton/configs.py. Then the RMSNorm sweep (its [rows, H] forward kernel, off until measured:
# lock "rmsnorm_fwd_rows" to the best rows if it beats 1). Usage: bash scripts/gpu_round4.sh <commit>.
set -u
export PYTHONUNBUFFERED=1
C=${1:-unknown}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  tests/test_rl_losses.py tests/test_rmsnorm.py -k "within_contract or descriptor or split_rows or multi_row" \
  > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -10
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 90 python3 scripts/gpu_linear_logp.py --quick --commit "$C" --out $OUT/linear_bench.json > $OUT/linear_bench.log 2>&1
grep -E "rlk_triton|eager|error" $OUT/linear_bench.log | cut -c1-200
timeout 60 python3 scripts/gpu_bench_rl.py --out $OUT/rl.json > $OUT/rl.log 2>&1; grep -E "policy_loss|PPO" $OUT/rl.log
timeout 170 python3 scripts/gpu_bench_rowwise.py --commit "$C" --out $OUT/rowwise.json > $OUT/rowwise.log 2>&1
grep -E "sweep rmsnorm forward|rlk rmsnorm forward alone" $OUT/rowwise.log | cut -c1-160
echo "total $(( $(date +%s) - T0 )) s"
