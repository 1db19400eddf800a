#!/usr/bin/env bash
# One device call for the model-level work: GPU tests of the models, the tile-offset sweep and the
# interpreter-dot change's GPU paths, the drift command at the GPU preset, and model throughput.
# Writes at most 8 files to $OUT.
set -uo pipefail
source scripts/device_setup.sh
python3 - > "$OUT/versions.json" <<'PY'
import json, subprocess, torch, triton, transformers, numpy
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                  "transformers": transformers.__version__, "numpy": numpy.__version__, "cuda": torch.version.cuda,
                  "commit": commit or None}))
PY
timeout 240 rlk-triton drift --preset gpu --num-prompts 8 --new-tokens 48 --device cuda --max-num-seqs 3 --chunk-size 64 \
  --json "$OUT/drift-gpu.json" --chart "$OUT/drift-gpu.png" > "$OUT/drift-gpu.txt" 2>&1; echo "drift exit $?" >> "$OUT/drift-gpu.txt"
tail -15 "$OUT/drift-gpu.txt"
timeout 120 python3 scripts/gpu_model_speed.py --out "$OUT/speed.json" 2>&1 | tail -8
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_models.py tests/test_tile_positions.py \
  tests/test_matmul.py tests/test_attention.py tests/test_linear_logp.py 2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -8 "$OUT/gpu_tests.txt"
