#!/usr/bin/env bash
# The GPU machine's entry: install this checkout (device_setup.sh: no network there; Liger-Kernel /
# Cut Cross-Entropy when the call carries their wheels in .whl/), run the gpu-marked tests, then the
# benchmark suite, each in its own time box so that both fit one device call. Writes under $OUT:
# gpu_tests.log, junit.xml, bench.log and bench.json (the suite's report, rewritten after every case:
# a time-boxed run keeps what it measured).
#   RLK_COMMIT=<sha> bash scripts/gpu_run.sh [rlk-triton bench arguments, e.g. --op matmul attention]
# RLK_COMMIT names the commit in the report where the copy has no .git. TESTS_S / BENCH_S: the time
# boxes in seconds; TESTS: the test paths (TESTS= skips the tests).
set -u
OUT=${OUT:-$PWD/gpu-run}
mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TESTS=${TESTS-tests}
if [ -n "$TESTS" ]; then
  timeout "${TESTS_S:-400}" python3 -m pytest -m gpu -q -rf -n 8 -p no:cacheprovider --durations=15 --junitxml="$OUT/junit.xml" \
    -o junit_family=xunit1 $TESTS > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit $?, $(grep -E ' passed| failed' "$OUT/gpu_tests.log" | tail -1)"
  grep -E "^FAILED|^ERROR" "$OUT/gpu_tests.log" | cut -c1-300 | head -30
fi
timeout "${BENCH_S:-300}" python3 -m rlk_triton.cli bench --json "$OUT/bench.json" "$@" > "$OUT/bench.log" 2>&1
echo "bench: exit $? (1: a case failed, 124: time box)"
tail -n 80 "$OUT/bench.log"
