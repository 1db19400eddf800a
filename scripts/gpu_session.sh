#!/usr/bin/env bash
# One device call for the open GPU items of issues 18-20: tests of the new paths on cuda, the native
# gate and latency (gpu_native.py), host overhead (gpu_host_overhead.py), linear_logp's modes against
# eager and the GEMM bound (gpu_linear_logp.py), the attention backward split thresholds and SDPA rows
# (gpu_attention_split.py), a host-time profile (gpu_host_profile.py), the attention backward tile sweep
# (gpu_attention_tiles.py), the attention forward's Hopper levers (gpu_attention_fwd_levers.py), linear_logp's
# gradient GEMMs against cuBLAS (gpu_linear_logp_gemms.py), its steps after idle and sustained with the clocks
# sampled (gpu_linear_logp_clocks.py), its fused kernels' epilogue cost (gpu_linear_logp_epilogue.py). Each
# step has its own time box; everything lands under $OUT. "kernels": the native rms_norm backward's device time
# per kernel against Triton's (gpu_native_kernels.py). "parts": a launch's host cost by part and the decode
# matmul's profile (gpu_launch_parts.py). "decode": the rollout-shaped kernels against the stock ones
# (gpu_decode.py; DECODE_ARGS="--only matmul --sweep matmul" for the small-M candidates). "thread": where a lone
# fwd+bwd's host time goes with the backward on autograd's worker thread and on the caller's (gpu_backward_thread.py).
#   RLK_COMMIT=<sha> [STEPS="native tests host ll split"] bash scripts/gpu_session.sh
set -u
source "$(dirname "$0")/device_setup.sh"
export RLK_NATIVE_CACHE=$OUT/native
T0=$(date +%s)
C=${RLK_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for step in ${STEPS:-native tests host ll split}; do  # native first: its records let the tests run the admitted paths
  case $step in
    tests) # 8 workers on 16 cores: two BLAS / OpenMP threads each, not 16 each (the float64 references' GEMMs);
           # 300 s: test_native's nvcc compiles of native/*.cu alone take 90-100 s each there.
           # Without a native step before it in this call: the committed records that match this machine
           # (scripts/native_seed_records.py), so the tests of the admitted native paths run, not skip
           python3 scripts/native_seed_records.py
           OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 timeout ${TESTS_S:-300} python3 -m pytest -q -rfs -n 8 -p no:cacheprovider --durations=8 ${TESTS:-tests/test_native.py \
             tests/test_cuda_graphs.py tests/test_linear_logp_saved.py tests/test_dispatch.py \
             tests/test_attention.py::test_backward_whole_block_loops_give_the_masked_bits \
             tests/test_attention.py::test_backward_transposed_scores_within_contract_and_invariant \
             tests/test_attention.py::test_every_output_and_gradient_element_is_written \
             tests/test_attention.py::test_dq_register_cap_gives_the_same_bits} > $OUT/tests.log 2>&1
           echo "tests: exit $? $(grep -E ' passed| failed' $OUT/tests.log | tail -1)"; grep -E "^FAILED|^ERROR" $OUT/tests.log | cut -c1-300 | head -20
           pkill -f "pytest" 2>/dev/null; sleep 1 ;;  # a timed-out run leaves xdist workers: they would skew the timings
    native) timeout ${NATIVE_S:-300} python3 scripts/gpu_native.py --out $OUT/native.json --commit $C ${NATIVE_ARGS:-} > $OUT/native.log 2>&1
            echo "native: exit $?"; tail -c 1500 $OUT/native.log
            python3 scripts/plot_native_report.py $OUT/native.json --out $OUT/native.png > /dev/null 2>&1 || echo "no picture (matplotlib?)" ;;
    kernels) timeout ${KERNELS_S:-90} python3 scripts/gpu_native_kernels.py --out $OUT/kernels.json --commit $C > $OUT/kernels.log 2>&1
             echo "kernels: exit $?"; grep "^{" $OUT/kernels.log | cut -c1-250 ;;
    parts) timeout ${PARTS_S:-90} python3 scripts/gpu_launch_parts.py --out $OUT/parts.json --commit $C > $OUT/parts.log 2>&1
           echo "parts: exit $?"; grep -v "^ " $OUT/parts.log | tail -c 1500 ;;
    decode) timeout ${DECODE_S:-200} python3 scripts/gpu_decode.py --out $OUT/decode.json --commit $C ${DECODE_ARGS:-} > $OUT/decode.log 2>&1
            echo "decode: exit $?"; tail -c 2500 $OUT/decode.log ;;
    host) timeout ${HOST_S:-120} python3 scripts/gpu_host_overhead.py --json $OUT/host.json --time-box $(( ${HOST_S:-120} - 30 )) ${HOST_ARGS:-} > $OUT/host.log 2>&1
          echo "host: exit $?"; tail -c 1500 $OUT/host.log
          python3 scripts/plot_host_overhead_report.py $OUT/host.json --out $OUT/host.png > /dev/null 2>&1 || echo "no picture (matplotlib?)" ;;
    ll) timeout ${LL_S:-150} python3 scripts/gpu_linear_logp.py --out $OUT/ll.json --commit $C --time-box $(( ${LL_S:-150} - 40 )) ${LL_ARGS:-} > $OUT/ll.log 2>&1
        echo "ll: exit $?"; tail -c 2500 $OUT/ll.log
        python3 scripts/plot_linear_logp_report.py $OUT/ll.json --out $OUT/linear_logp.png > /dev/null 2>&1 || echo "no picture (matplotlib?)" ;;
    gemms) timeout ${GEMMS_S:-150} python3 scripts/gpu_linear_logp_gemms.py --out $OUT/gemms.json --commit $C --time-box $(( ${GEMMS_S:-150} - 50 )) ${GEMMS_ARGS:-} > $OUT/gemms.log 2>&1
           echo "gemms: exit $?"; tail -c 2500 $OUT/gemms.log ;;
    epilogue) timeout ${EPI_S:-170} python3 scripts/gpu_linear_logp_epilogue.py --out $OUT/epilogue.json --commit $C ${EPI_ARGS:-} > $OUT/epilogue.log 2>&1
              echo "epilogue: exit $?"; tail -c 2500 $OUT/epilogue.log ;;
    clocks) timeout ${CLOCKS_S:-120} python3 scripts/gpu_linear_logp_clocks.py --out $OUT/clocks.json --commit $C --time-box $(( ${CLOCKS_S:-120} - 25 )) ${CLOCKS_ARGS:-} > $OUT/clocks.log 2>&1
            echo "clocks: exit $?"; tail -c 2500 $OUT/clocks.log ;;
    thread) timeout ${THREAD_S:-120} python3 scripts/gpu_backward_thread.py --out $OUT/thread.json --commit $C ${THREAD_ARGS:-} > $OUT/thread.log 2>&1
            echo "thread: exit $?"; cut -c1-600 $OUT/thread.log ;;
    profile) timeout ${PROFILE_S:-90} python3 scripts/gpu_host_profile.py --json $OUT/profile.json ${PROFILE_ARGS:-} > $OUT/profile.log 2>&1
             echo "profile: exit $?"; grep "^{" $OUT/profile.log | cut -c1-250 ;;
    split) timeout ${SPLIT_S:-150} python3 scripts/gpu_attention_split.py --out $OUT/split.json --commit $C --time-box $(( ${SPLIT_S:-150} - 30 )) ${SPLIT_ARGS:-} > $OUT/split.log 2>&1
           echo "split: exit $?"; tail -c 3000 $OUT/split.log
           python3 scripts/plot_attention_report.py $OUT/split.json --out $OUT/attention.png > /dev/null 2>&1 || echo "no picture (matplotlib?)" ;;
    tiles) timeout ${TILES_S:-300} python3 scripts/gpu_attention_tiles.py --out $OUT/tiles.json --commit $C --time-box $(( ${TILES_S:-300} - 30 )) ${TILES_ARGS:-} > $OUT/tiles.log 2>&1
           echo "tiles: exit $?"; tail -c 3000 $OUT/tiles.log ;;
    levers) timeout ${LEVERS_S:-300} python3 scripts/gpu_attention_fwd_levers.py --out $OUT/levers.json --commit $C --time-box $(( ${LEVERS_S:-300} - 40 )) ${LEVERS_ARGS:-} > $OUT/levers.log 2>&1
            echo "levers: exit $?"; tail -c 4000 $OUT/levers.log | cut -c1-330 ;;
  esac
  echo "$step done at $(( $(date +%s) - T0 )) s"
done
