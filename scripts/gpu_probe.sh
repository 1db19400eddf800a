#!/usr/bin/env bash
# First device call: versions, config sweep, error measurement on the compiled kernels.
set -u
source "$(dirname "$0")/device_setup.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton, numpy; print(torch.__version__, triton.__version__, numpy.__version__)"
python3 scripts/gpu_tune.py --out $OUT/tune.json 2>&1 | tee $OUT/tune.log | tail -5
python3 scripts/measure_errors.py --big --out $OUT/errors_gpu.json 2>&1 | tee $OUT/errors.log
