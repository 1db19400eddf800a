#!/usr/bin/env bash
# The decode-speed issue on the H200 in one device call: the bit-class gate (every row-bucket config
# against its class reference, torch.equal), the decode / matmul / selected_logp GPU tests, then
# scripts/gpu_decode.py's report (with --sweep: candidate configs too). Every step time-boxed.
# Usage: [GATE_FILES=... EXTRA_TESTS=... ONLY=matmul,decode,logp] bash scripts/gpu_decode.sh <commit> [SWEEP_PARTS]
set -u
C=${1:-unknown}
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
GATE_FILES=${GATE_FILES:-tests/test_config_classes.py tests/test_attention.py tests/test_matmul.py tests/test_tile_positions.py}
timeout ${GATE_S:-200} python3 -m pytest -v -rf -n 8 -p no:cacheprovider --durations=12 $GATE_FILES ${EXTRA_TESTS:-} > $OUT/gate.log 2>&1
echo "gate: $(grep -E 'passed|failed' $OUT/gate.log | tail -1), $(grep -c ' PASSED ' $OUT/gate.log) PASSED lines"
grep -E " FAILED | ERROR |^FAILED|^ERROR|^E  " $OUT/gate.log | cut -c1-300 | head -30
echo "gate done at $(( $(date +%s) - T0 )) s"
timeout ${BENCH_S:-300} python3 scripts/gpu_decode.py --commit "$C" --out $OUT/decode.json ${2:+--sweep $2} --only ${ONLY:-matmul,decode,logp} > $OUT/decode.log 2>&1
tail -5 $OUT/decode.log
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/decode.json"))
for x in r["rows"]:
    print(x["op"], "|", x["shape"], "|", round(x["rlk_ms"] * 1e3, 1), "us |", round(x["ratio"], 3), "|",
          {k: (round(v, 3) if isinstance(v, float) else v) for k, v in x.items() if k in ("copy_fraction", "bitwise_vs_training", "rlk_wall_ms")})
best = {}
for s in r["sweep"]:
    if "ms" not in s:
        print("ERR", s["op"], s["config"], s["error"][:200]); continue
    key = (s["op"], s.get("M"), s.get("N"), s.get("K"), s.get("B"), s.get("L"))
    c = s["config"]; tag = tuple(c[k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "persistent_tma", "q_heads", "chunk_v") if k in c)
    best.setdefault(key, []).append((s["ms"], tag, s.get("bitwise", "n/a")))
for key, v in best.items():
    v.sort()
    print(key, [(round(ms * 1e3, 1), t, b) for ms, t, b in v[:4]], "non-bitwise:", [t for _, t, b in v if not b][:4])
print("failures:", r["failures"], "errors:", [e[-300:] for e in r["errors"]])
PY
echo "total $(( $(date +%s) - T0 )) s"
