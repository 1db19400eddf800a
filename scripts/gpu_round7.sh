#!/usr/bin/env bash
# Round 7 on the H200 in one device call (under 10 minutes, every step with its own timeout): the
# epilogues in column quarters (matmul.column_quarters; ptxas spills 7112 -> 468 B in d logits, 1876 ->
# 28 B in d hidden, 308 -> 0 B in the matmul) and the forward's one-temporary-less epilogue (2308 -> 0
# B). The gpu tests of linear_logp and matmul (paths, invariance, contract), linear_logp's path sweep
# (against the pointer kernels, bitwise; per-kernel breakdown; chosen vs eager), then the matmul
# against cuBLAS on both layouts. (At 296955e the sweep also timed whole-tile and half-tile epilogues
# through a config field since removed: docs/reports/h200-round7-2026-12-03.json.) Usage: bash scripts/gpu_round7.sh <commit>.
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_linear_logp.py tests/test_matmul.py \
  -k "descriptor or invariant or within_contract" > $OUT/tests.log 2>&1
echo "tests: $(grep -E 'passed|failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -12
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 200 python3 scripts/gpu_linear_logp_paths.py --commit "$C" --out $OUT/paths.json > $OUT/paths.log 2>&1
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/paths.json"))
for row in r["rows"]:
    print(row["name"][:120], row.get("ms"), row.get("tflops"), row.get("peak_extra_gib"), row.get("bitwise_vs_pointer"), row.get("error", "")[:160])
for b in r.get("breakdown", []):
    print(b["name"], {k[:20]: v for k, v in list(b["kernels"].items())[:5]})
print("chosen:", r.get("chosen"), "errors:", [e[-600:] for e in r["errors"]])
PY
echo "paths done at $(( $(date +%s) - T0 )) s"
timeout 120 python3 scripts/gpu_linear_logp.py --matmul-only --commit "$C" --out $OUT/matmul.json > $OUT/matmul.log 2>&1
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/matmul.json"))
for x in r["matmul"]:
    print(x["shape"], x.get("layout"), round(x.get("tflops", 0)), round(x.get("ratio_vs_cublas", 0), 3), x.get("pointer_bitwise_equal"), x.get("row_invariant_7_vs_full"), x.get("error", ""))
print("errors:", r["errors"])
PY
echo "total $(( $(date +%s) - T0 )) s"
