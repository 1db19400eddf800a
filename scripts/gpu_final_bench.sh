#!/usr/bin/env bash
# Device call 1 of 2: benchmarks and error measurements, each step time-boxed; JSON under $OUT.
set -u
source "$(dirname "$0")/device_setup.sh"
C=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
timeout 140 python3 scripts/gpu_linear_logp.py --commit "$C" --out $OUT/linear_bench.json > $OUT/linear_bench.log 2>&1; tail -14 $OUT/linear_bench.log
timeout 120 python3 scripts/measure_linear_logp.py --out $OUT/linear_errors.json > $OUT/linear_errors.log 2>&1; tail -15 $OUT/linear_errors.log
timeout 45 python3 scripts/measure_matmul.py --out $OUT/matmul_errors.json 2>&1 | tail -12
timeout 100 python3 scripts/gpu_bench_rowwise.py --no-sweep --commit "$C" --out $OUT/rowwise.json > $OUT/rowwise.log 2>&1; tail -8 $OUT/rowwise.log
timeout 100 python3 scripts/gpu_bench_positional.py --commit "$C" --out $OUT/positional.json > $OUT/positional.log 2>&1; tail -8 $OUT/positional.log
