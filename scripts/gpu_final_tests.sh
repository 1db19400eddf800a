#!/usr/bin/env bash
# Device call 2 of 2: every gpu-marked test, junit XML kept even when time-boxed.
set -u
source "$(dirname "$0")/device_setup.sh"
timeout ${1:-300} python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider --junitxml=$OUT/junit.xml -o junit_family=xunit1 \
  > $OUT/gpu_tests.log 2>&1
echo "rc=$?"; grep -E "passed|failed" $OUT/gpu_tests.log | tail -3; grep -E "^FAILED|^ERROR" $OUT/gpu_tests.log | head -30
