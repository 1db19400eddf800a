#!/usr/bin/env bash
# Round 6, after locking the matmul's descriptor path on sm90: the gpu tests of every user of the
# matmul (matmul, the layer chain, configs, linear_logp without TP), then the matmul against cuBLAS on
# both layouts (b [K, N] and weight.t()) and both paths. Usage: bash scripts/gpu_round6_matmul.sh <commit>.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
timeout 220 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_matmul.py tests/test_layer_chain.py \
  tests/test_configs.py tests/test_linear_logp.py > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -12
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 200 python3 scripts/gpu_linear_logp.py --matmul-only --commit "$C" --out $OUT/matmul.json > $OUT/matmul.log 2>&1
grep "'shape'" $OUT/matmul.log | cut -c1-420
tail -2 $OUT/matmul.log | cut -c1-400
echo "total $(( $(date +%s) - T0 )) s"
