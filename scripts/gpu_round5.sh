#!/usr/bin/env bash
# One device call: is warp specialization of the persistent descriptor loops bitwise (the
# "descriptor" tests run pointer / flattened / warp-specialized), and which path and vocab chunk
# should linear_logp lock (scripts/gpu_linear_logp_paths.py). Usage: bash scripts/gpu_round5.sh <commit>.
set -u
export PYTHONUNBUFFERED=1
C=${1:-unknown}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
T0=$(date +%s)
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  -k "descriptor" > $OUT/tests5.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests5.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests5.log | head -10
timeout 400 python3 scripts/gpu_linear_logp_paths.py --commit "$C" --out $OUT/paths.json > $OUT/paths.log 2>&1
cut -c1-260 $OUT/paths.log | grep -v "^ *$" | tail -40
echo "total $(( $(date +%s) - T0 )) s"
