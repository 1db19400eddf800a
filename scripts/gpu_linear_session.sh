#!/usr/bin/env bash
# One device call for linear_logp: gpu-marked tests, error measurement, sweep + benchmark.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
timeout 320 python3 scripts/gpu_linear_logp.py --sweep --commit "$COMMIT" --out $OUT/linear_bench.json 2>&1 | tee $OUT/linear_bench.log | tail -40
timeout 150 python3 scripts/measure_linear_logp.py --out $OUT/linear_errors.json > $OUT/linear_errors.log 2>&1; tail -18 $OUT/linear_errors.log
timeout 110 python3 -m pytest -q -m gpu tests/test_linear_logp.py tests/test_configs.py -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/linear_tests.log
