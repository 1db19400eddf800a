#!/usr/bin/env bash
# One device call: the reworked RMSNorm kernels (tests, benchmark, config sweep), attention's and
# RoPE / embedding's GPU error measurements (host-bound float64 references, run beside the tests),
# the RL benchmark with CUDA-graph device times and GSPO, and the TMA-descriptor matmul probe.
# Every step is time-boxed and writes under $OUT, so a cut run keeps what it measured.
set -u
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
( timeout 230 python3 scripts/measure_attention.py --out $OUT/attention_errors.json > $OUT/attention_errors.log 2>&1 ) &
( timeout 230 python3 scripts/measure_positional.py --big --out $OUT/positional_errors.json > $OUT/positional_errors.log 2>&1 ) &
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_rmsnorm.py tests/test_layer_chain.py tests/test_attention.py \
  > $OUT/rmsnorm_tests.log 2>&1
grep -E "passed|failed" $OUT/rmsnorm_tests.log | tail -1; grep -E "^FAILED|^ERROR" $OUT/rmsnorm_tests.log | head -20
wait
echo "error measurements done at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/attention_errors.log; tail -3 $OUT/positional_errors.log
timeout 170 python3 scripts/gpu_bench_rowwise.py --out $OUT/rowwise.json > $OUT/rowwise.log 2>&1
grep -E "rlk rmsnorm|sweep rmsnorm" $OUT/rowwise.log | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['name'], r.get('ms'), r.get('x_copy_rate'), r.get('error',''))" | sort -k1,1 | head -80
tail -1 $OUT/rowwise.log
timeout 90 python3 scripts/gpu_bench_rl.py --out $OUT/rl.json > $OUT/rl.log 2>&1; cat $OUT/rl.log | tail -14
timeout 80 python3 scripts/gpu_tma_probe.py --out $OUT/tma_probe.json > $OUT/tma_probe.log 2>&1; tail -5 $OUT/tma_probe.log
echo "total $(( $(date +%s) - T0 )) s"
