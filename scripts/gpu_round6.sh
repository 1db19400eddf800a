#!/usr/bin/env bash
# Round 6 on the H200 in one device call (under 10 minutes, every step with its own timeout): the gpu
# tests of the TMA epilogue stores (tma_store: d logits, and d hidden's C_in / out), then linear_logp's
# path sweep (scripts/gpu_linear_logp_paths.py: paths, 4-stage forward, chunk 8192, per-kernel
# breakdown, the cuBLAS four-GEMM bound, the chosen path against eager). Usage: bash scripts/gpu_round6.sh <commit>.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  -k "descriptor or within_contract or invariant" > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -12
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 330 python3 scripts/gpu_linear_logp_paths.py --commit "$C" --out $OUT/paths.json > $OUT/paths.log 2>&1
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/paths.json"))
for row in r["rows"]:
    print(row["name"][:110], row.get("ms"), row.get("tflops"), row.get("peak_extra_gib"), row.get("bitwise_vs_pointer"), row.get("error", "")[:160])
for b in r.get("breakdown", []):
    print(b["name"], json.dumps(b["kernels"])[:1500])
print("cublas four-GEMM bound ms:", r.get("cublas_four_gemm_ms"), "chosen:", r.get("chosen"))
print("errors:", [e[-600:] for e in r["errors"]])
PY
echo "total $(( $(date +%s) - T0 )) s"
