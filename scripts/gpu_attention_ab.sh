#!/usr/bin/env bash
# Attention kernel A/B on the H200 in one device call: the attention GPU tests (decode == training
# bitwise, the bit-class gate, bad input, the model layer built on attention), then
# scripts/gpu_attention_ab.py (A = rlk_triton/ops/_attention_before.py) and the decode report rows of
# scripts/gpu_decode.py (ONLY=matmul,decode,logp for all of its rows).
# Usage: [WHAT="..." ONLY=...] bash scripts/gpu_attention_ab.sh <commit> <before commit>
set -u
source "$(dirname "$0")/device_setup.sh"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${GATE_S:-240} python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_config_classes.py tests/test_attention.py \
  tests/test_bad_input_attention.py tests/test_models.py tests/test_layer_chain.py > $OUT/gate.log 2>&1
echo "gate: $(grep -E 'passed|failed' $OUT/gate.log | tail -1)"
grep -E "^FAILED|^ERROR" $OUT/gate.log | cut -c1-300 | head -20
echo "gate done at $(( $(date +%s) - T0 )) s"
timeout ${AB_S:-240} python3 scripts/gpu_attention_ab.py --out $OUT/ab.json --commit "$1" --before-commit "$2" \
  --what "${WHAT:-attention kernels: B against A, same run}" > $OUT/ab.log 2>&1
tail -3 $OUT/ab.log
echo "ab done at $(( $(date +%s) - T0 )) s"
timeout ${BENCH_S:-150} python3 scripts/gpu_decode.py --commit "$1" --out $OUT/decode.json --only ${ONLY:-decode} > $OUT/decode.log 2>&1
tail -6 $OUT/decode.log
echo "total $(( $(date +%s) - T0 )) s"
