#!/usr/bin/env bash
# Round 4 on the H200 in one device call (under 10 minutes; every step has its own timeout; its
# report: docs/reports/h200-round4-2026-12-03.json): the gpu tests of the then written-but-off paths
# (descriptor d hidden, split row sums, [rows, H] RMSNorm forward, the n_tiles fix), linear_logp's path and chunk sweep,
# the RL benchmark with the split row-sum row, and the row-wise sweep. Usage: bash scripts/gpu_round45.sh <commit>.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  tests/test_rl_losses.py tests/test_rmsnorm.py -k "within_contract or descriptor or split_rows or multi_row" \
  > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -12
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 230 python3 scripts/gpu_linear_logp_paths.py --commit "$C" --out $OUT/paths.json > $OUT/paths.log 2>&1
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/paths.json"))
for row in r["rows"]:
    print(row["name"][:90], row.get("ms"), row.get("tflops"), row.get("peak_extra_gib"), row.get("bitwise_vs_pointer"), row.get("error", "")[:120])
print("errors:", [e[-300:] for e in r["errors"]])
PY
echo "paths done at $(( $(date +%s) - T0 )) s"
timeout 60 python3 scripts/gpu_bench_rl.py --out $OUT/rl.json > /tmp/rl.log 2>&1; grep -E "policy_loss|PPO" /tmp/rl.log | cut -c1-200
timeout 150 python3 scripts/gpu_bench_rowwise.py --commit "$C" --out $OUT/rowwise.json > $OUT/rowwise.log 2>&1
grep -E "sweep rmsnorm forward|rlk rmsnorm forward alone" $OUT/rowwise.log | cut -c1-160
timeout 40 python3 scripts/gpu_host_overhead.py --out $OUT/host.json > /tmp/host.log 2>&1; head -c 3500 /tmp/host.log
echo "total $(( $(date +%s) - T0 )) s"
