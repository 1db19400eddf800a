#!/usr/bin/env bash
# asv's performance history, measured on the GPU machine and kept in asv_bench/results/ (committed).
#
#   here:  bash scripts/asv_history.sh --pack        # .asvrepo: a bare clone of the last 300 commits
#   there: bash scripts/asv_history.sh SHA [SHA ...] # carry .asvrepo (and .whl with asv's wheels)
#
# For each commit: its tree is unpacked from the repository, the current benchmark cases
# (rlk_triton/bench, which older commits lack or define differently) are laid over it, as asv always
# measures old commits with the current suite, the tree is installed, and `asv run` records it under the
# fixed machine name (ASV_MACHINE, default h200) with --set-commit-hash. The checkout is reinstalled at
# the end. BENCH: asv's -b regex (default: every family's device time); PER_COMMIT_S: each commit's
# time box. Results land in asv_bench/results/<machine>/ (under $OUT/asv-results too where OUT is set).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "${1:-}" = "--pack" ]; then
  rm -rf .asvrepo
  git clone -q --bare --depth "${DEPTH:-300}" "file://$ROOT" .asvrepo && du -sh .asvrepo
  exit
fi
REPO=$(git rev-parse --absolute-git-dir 2>/dev/null || echo "$ROOT/.asvrepo")
[ -d "$REPO" ] || { echo "no git repository: run 'bash scripts/asv_history.sh --pack' in a checkout and carry .asvrepo"; exit 2; }
# on the GPU machine asv comes as a carried wheel (scripts/device_setup.sh puts .whl on PYTHONPATH)
python3 -c "import asv" 2>/dev/null || source "$ROOT/scripts/device_setup.sh"
MACHINE=${ASV_MACHINE:-h200}
# default: the device time of the cases that history is about (the rollout shapes, the training
# forward, the LM head, one of each row op, the PPO loss)
BENCH=${BENCH:-"track_device_ms\\('(fwd M=(1|64) N=4096 K|decode|fwd causal 4 x 8192, 32 q / 8|fwd \\[(1|16384) x 151936|fwd\\+bwd N=8192|fwd\\+bwd \\[16384 x 4096\\] bf|fwd\\+bwd \\[64 x 8192\\] PPO|fwd\\+bwd \\[16384 x 14336|fwd\\+bwd \\[16384 tokens)"}
CONF=/tmp/asv.history.json
# the committed config with absolute paths: the repository may be the carried bare clone
python3 - "$ROOT" "$REPO" "$CONF" <<'EOF'
import json, sys
root, repo, out = sys.argv[1:]
conf = json.load(open(f"{root}/asv_bench/asv.conf.json"))
conf.update(repo=repo, benchmark_dir=f"{root}/asv_bench/benchmarks", results_dir=f"{root}/asv_bench/results",
            env_dir="/tmp/asv-env", html_dir="/tmp/asv-html")
json.dump(conf, open(out, "w"), indent=1)
EOF
# asv has no GPU field: the GPU goes in front of the CPU model (the 2026-12-04 runs recorded the name only)
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
CPU=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
python3 -m asv machine --config "$CONF" --yes --machine "$MACHINE" --os "$(uname -sr)" --arch "$(uname -m)" \
  --cpu "GPU ${GPU:-none}; CPU ${CPU:-unknown}" --num_cpu "$(nproc)" \
  --ram "$(awk '/MemTotal/ {print $2}' /proc/meminfo)" > /dev/null
status=0
for sha in "$@"; do
  full=$(git --git-dir="$REPO" rev-parse "$sha^{commit}") || { status=1; continue; }
  tree=/tmp/asv-trees/$full
  rm -rf "$tree" && mkdir -p "$tree"
  git --git-dir="$REPO" archive "$full" | tar -x -C "$tree"
  rm -rf "$tree/rlk_triton/bench" && cp -r rlk_triton/bench "$tree/rlk_triton/bench"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e "$tree" 2>&1 | tail -1
  echo "== $(git --git-dir="$REPO" log -1 --format='%h %ad %s' --date=format:'%m-%d %H:%M' "$full" | cut -c1-100)"
  (cd "$tree" && timeout "${PER_COMMIT_S:-900}" python3 -m asv run --config "$CONF" --machine "$MACHINE" \
      --set-commit-hash "$full" --quick --show-stderr -b "$BENCH") 2>&1 | grep -v "^ *$" | tail -n 60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # after each commit: a call cut by its time limit keeps what was measured
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/asv-results" && cp -r asv_bench/results/. "$OUT/asv-results/"; fi
done
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e "$ROOT" 2>&1 | tail -1
exit $status
