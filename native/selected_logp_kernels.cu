// selected_logp forward and backward, written to give the Triton kernels' bits (the backward is below,
// with its own note): rlk_triton/ops/selected_logp.py
// _fwd_kernel (a program per (scored row, vocab chunk): the chunk's tiles folded into a softmax state;
// FINISH: a row of one chunk writes its results) and _fwd_merge_kernel (each row's chunk states merged
// in one step, then the results), with the locked configs' BLOCK_V, CHUNK_V and warps
// (rlk_triton/configs.py "selected_logp_fwd" / "selected_logp_chunk"). One call launches both, so a
// decode-sized call pays one host round trip instead of two Triton launches.
//
// The order is Triton 3.6's (the GPU machine's), read from the kernels' sm90 PTX and SASS compiled with
// the 3.6 wheel under the JIT's specialization, and checked by running that PTX (with ptxas's one
// contraction, below) and this file's PTX side by side in scripts/ptx_emulator.py
// (scripts/native_ptx_compare.py):
//   chunk kernel, one warp, thread t holds register r = c * VEC + j at lane c * VEC * 32 + t * VEC + j;
//   per tile, with x_r the raw logit in fp32 and inv_t = div.full(1, temperature):
//     1. xs_r = inv_t * x_r (rounded); tile max = max chained in register order, then butterflies
//        16 .. 1; m' = max(m, tile max); shift = m' == -inf ? 0 : m';
//     2. d_r = fma(inv_t, x_r, -shift) (the product not rounded: LLVM contracts it), e_r =
//        ex2.approx.ftz(d_r * log2 e), alpha = ex2.approx.ftz((m - shift) * log2 e);
//     3. with entropy: moved = s > 0 ? s * (m - shift) : 0; u = sum_r (e_r > 0 ? d_r * e_r : 0)
//        (chained in register order, then butterflies); t' = fma(t + moved, alpha, u);
//     4. s' = fma(s, alpha, sum_r e_r) (the same chain and butterflies);
//   the tail tile's lanes past V hold -inf (e = 0, no entropy term).
//   merge kernel, four warps, lane % CHUNKS = chunk (CHUNKS = next_pow2(chunks), 2 .. 32 lanes a row;
//   64: two warps a row, slp_merge64_kernel):
//     m = butterfly max; shift as above; d_c = m_c - shift; beta_c = ex2.approx.ftz(d_c * log2 e);
//     s = butterflies over the row's lanes of s_c * beta_c, the first add contracted:
//         fma(beta_c, s_c, shfl(s_c * beta_c, CHUNKS / 2)), then adds at CHUNKS / 4 .. 1;
//     t likewise of (t_c + (s_c > 0 ? d_c * s_c : 0)) * beta_c;
//   results (both kernels): log_s = log2(s) * ln 2 with libdevice's log2f (ftz) instruction for
//   instruction (log2_ftz), logp = (x_t - m) - log_s with x_t - m = fma(x_t raw, inv_t, -m) (ptxas
//   contracts Triton's mul and sub into an fma), entropy = log_s - div.full(t, s) with div.full's final
//   product contracted into the subtraction (ptxas does that to Triton's; div_full_parts spells it out).
// Every other operation is an explicit _rn intrinsic (built with --fmad=false). The approximate
// instructions (ex2.approx.ftz, div.full) are Triton's own choices; the GPU gate checks their bits.
// No torch headers: CI compiles this file for sm_90a with nvcc alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

namespace {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
#define RLK_NAN __int_as_float(0x7FC00000)  // Triton's float("nan"): the gate compares NaNs by bit pattern

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// div.full.f32 a / b as ptxas expands Triton's: a and b scaled by 1/4 when |b| > 2^126 and by 2^24 when
// |b| < 2^-126, then a' * rcp.approx.ftz(b') (MUFU.RCP). Spelled out so that the final product can be
// contracted where Triton's SASS contracts it (the entropy's log_s - t / s), and nowhere else.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void div_full_parts(float a, float b, float& num, float& rcp) {
  const bool big = fabsf(b) > 8.50705917302346158658e+37f, small = fabsf(b) < 1.17549435082228750797e-38f;
  if (big) { a = __fmul_rn(a, 0.25f); b = __fmul_rn(b, 0.25f); }
  if (small) { a = __fmul_rn(a, 16777216.0f); b = __fmul_rn(b, 16777216.0f); }
  num = a;
  rcp = rcp_approx(b);
}
__device__ __forceinline__ float div_full(float a, float b) {
  float num, rcp;
  div_full_parts(a, b, num, rcp);
  return __fmul_rn(num, rcp);
}
__device__ __forceinline__ float fma_ftz(float a, float b, float c) {
  float y;
  asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(y) : "f"(a), "f"(b), "f"(c));
  return y;
}

// libdevice's log2f with flush to zero (the one Triton links), instruction for instruction: the
// argument's exponent split off around sqrt(1/2), a degree-10 polynomial in f = mantissa - 1.
__device__ __forceinline__ float log2_ftz(float a) {
  const bool tiny = a < 1.17549435e-38f;  // below the smallest normal: scaled by 2^23 first
  const float x = tiny ? __fmul_rn(a, 8388608.0f) : a;
  const float e0 = tiny ? -23.0f : 0.0f;
  const int xi = __float_as_int(x);
  const int k = (xi - 0x3F3504F3) & (int)0xFF800000;
  const float ek = fma_ftz((float)k, 1.1920928955078125e-7f, e0);
  const float f = __fadd_rn(__int_as_float(xi - k), -1.0f);
  float p = fma_ftz(__int_as_float(0x3DC6B27F), f, __int_as_float(0xBE2C7F30));
  p = fma_ftz(p, f, __int_as_float(0x3E2FCF2A));
  p = fma_ftz(p, f, __int_as_float(0xBE374E43));
  p = fma_ftz(p, f, __int_as_float(0x3E520BF4));
  p = fma_ftz(p, f, __int_as_float(0xBE763C8B));
  p = fma_ftz(p, f, __int_as_float(0x3E93BF99));
  p = fma_ftz(p, f, __int_as_float(0xBEB8AA49));
  p = fma_ftz(p, f, __int_as_float(0x3EF6384A));
  p = fma_ftz(p, f, __int_as_float(0xBF38AA3B));
  const float q = __fmul_rn(f, __fmul_rn(f, p));
  float r = __fadd_rn(ek, fma_ftz(f, __int_as_float(0x3FB8AA3B), q));
  if (!((unsigned)xi < 0x7F800000u)) r = fma_ftz(x, CUDART_INF_F, CUDART_INF_F);  // inf, NaN, negatives
  return x == 0.0f ? -CUDART_INF_F : r;
}

template <typename T> struct Raw;
template <> struct Raw<float> { using type = unsigned; };
template <> struct Raw<__half> { using type = unsigned short; };
template <> struct Raw<__nv_bfloat16> { using type = unsigned short; };

__device__ __forceinline__ float to_f32(float, unsigned b) { return __uint_as_float(b); }
__device__ __forceinline__ float to_f32(__half, unsigned short b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float to_f32(__nv_bfloat16, unsigned short b) {
  return __bfloat162float(__ushort_as_bfloat16(b));
}

__device__ __forceinline__ float shfl(float v, int d) { return __shfl_xor_sync(0xffffffffu, v, d); }

struct Args {
  const void* logits; int64_t stride_outer, stride_inner, inner_size;
  const void* target; const void* row_index; const float* temperature_rows; float temperature;
  float *logp, *entropy, *row_max, *row_logsum, *state;
  int64_t V, ignore_index; int n_rows, n_chunks; int64_t total_rows;
  int target_32, row_index_32;  // index tensors of int32 (else int64), widened as Triton's .to(int64)
};

__device__ __forceinline__ int64_t index_at(const void* p, bool is_32, int64_t k) {
  return is_32 ? (int64_t) reinterpret_cast<const int*>(p)[k] : reinterpret_cast<const int64_t*>(p)[k];
}

// (row, row_ok) of scored row pid: a row index outside the logits is clamped to row 0 and flagged.
template <bool ROW_INDEX>
__device__ __forceinline__ int64_t row_of(const Args& a, int64_t pid, bool& ok) {
  const int64_t row = ROW_INDEX ? index_at(a.row_index, a.row_index_32, pid) : pid;
  ok = row >= 0 && row < a.total_rows;
  return ok ? row : 0;
}

template <typename T>
__device__ __forceinline__ const T* row_start(const Args& a, int64_t row) {
  return reinterpret_cast<const T*>(a.logits) + (row / a.inner_size) * a.stride_outer + (row % a.inner_size) * a.stride_inner;
}

template <bool PER_ROW_T>
__device__ __forceinline__ float inv_temperature(const Args& a, int64_t pid) {
  return div_full(1.0f, PER_ROW_T ? a.temperature_rows[pid] : a.temperature);
}

// The results of a row from its state: (logp, log_s, entropy before the row_ok select).
template <typename T>
__device__ __forceinline__ void row_results(const Args& a, const T* row_ptr, float inv_t, int64_t target, bool row_ok,
                                            float m, float s, float t, float& logp, float& log_s, float& entropy) {
  const bool in_range = target >= 0 && target < a.V;
  const float x_t = to_f32(T(), reinterpret_cast<const typename Raw<T>::type*>(row_ptr)[in_range ? target : 0]);
  log_s = __fmul_rn(log2_ftz(s), LN2);
  logp = __fsub_rn(__fmaf_rn(x_t, inv_t, -m), log_s);
  logp = in_range ? logp : RLK_NAN;
  logp = target == a.ignore_index ? 0.0f : logp;
  logp = row_ok ? logp : RLK_NAN;
  float num, rcp;
  div_full_parts(t, s, num, rcp);
  entropy = __fmaf_rn(rcp, -num, log_s);  // log_s - t / s, the quotient's product contracted (SASS)
}

// One tile of E = VEC * CHUNKS registers per thread folded into (m, s, t): steps 1-4 above.
template <int E, bool ENT>
__device__ __forceinline__ void fold_tile(const float (&x)[E], float inv_t, float& m, float& s, float& t) {
  float mx = fmaxf(__fmul_rn(inv_t, x[0]), __fmul_rn(inv_t, x[1]));
#pragma unroll
  for (int r = 2; r < E; ++r) mx = fmaxf(mx, __fmul_rn(inv_t, x[r]));
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) mx = fmaxf(mx, shfl(mx, d));
  const float m_new = fmaxf(m, mx);
  const float shift = m_new == -CUDART_INF_F ? 0.0f : m_new;
  float d[E], e[E];
#pragma unroll
  for (int r = 0; r < E; ++r) {
    d[r] = __fmaf_rn(inv_t, x[r], -shift);
    e[r] = ex2_approx(__fmul_rn(d[r], LOG2E));
  }
  const float m_minus = __fsub_rn(m, shift);
  const float alpha = ex2_approx(__fmul_rn(m_minus, LOG2E));
  if constexpr (ENT) {
    const float moved = s > 0.0f ? __fmul_rn(s, m_minus) : 0.0f;
    const float base = __fadd_rn(t, moved);
    float u = __fadd_rn(e[0] > 0.0f ? __fmul_rn(d[0], e[0]) : 0.0f, e[1] > 0.0f ? __fmul_rn(d[1], e[1]) : 0.0f);
#pragma unroll
    for (int r = 2; r < E; ++r) u = __fadd_rn(u, e[r] > 0.0f ? __fmul_rn(d[r], e[r]) : 0.0f);
#pragma unroll
    for (int k = 16; k >= 1; k >>= 1) u = __fadd_rn(u, shfl(u, k));
    t = __fmaf_rn(base, alpha, u);
  }
  float se = __fadd_rn(e[0], e[1]);
#pragma unroll
  for (int r = 2; r < E; ++r) se = __fadd_rn(se, e[r]);
#pragma unroll
  for (int k = 16; k >= 1; k >>= 1) se = __fadd_rn(se, shfl(se, k));
  s = __fmaf_rn(s, alpha, se);
  m = m_new;
}

// Lanes of tile `start` (element offset in the row) into x; masked lanes (>= V) get -inf. A full tile
// of a 16-byte VEC layout is read one 16-byte vector per (thread, c): the launcher picks that VEC only
// for rows that start 16-byte aligned (and tiles start at multiples of BLOCK_V).
template <typename T, int E, int VEC, bool MASKED>
__device__ __forceinline__ void load_tile(const T* row_ptr, int64_t start, int64_t V, float (&x)[E]) {
  using R = typename Raw<T>::type;
  const R* p = reinterpret_cast<const R*>(row_ptr);
  const int t = threadIdx.x;
#pragma unroll
  for (int c = 0; c < E / VEC; ++c) {
    const int64_t lane0 = start + c * VEC * 32 + t * VEC;
    if constexpr (!MASKED && VEC * sizeof(R) == 16) {
      union { uint4 v; R e[VEC]; } u;
      u.v = __ldcs(reinterpret_cast<const uint4*>(p + lane0));  // read once: evict first
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[c * VEC + j] = to_f32(T(), u.e[j]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int64_t lane = lane0 + j;
        x[c * VEC + j] = (!MASKED || lane < V) ? to_f32(T(), p[lane]) : -CUDART_INF_F;
      }
    }
  }
}

template <typename T, int BLOCK_V, int VEC, bool ENT, bool ROW_INDEX, bool PER_ROW_T, bool FINISH>
__global__ void __launch_bounds__(32) slp_chunk_kernel(Args a, int chunk_v) {
  constexpr int E = BLOCK_V / 32;
  const int64_t pid = blockIdx.x;
  const int chunk = blockIdx.y;
  bool row_ok;
  const int64_t row = row_of<ROW_INDEX>(a, pid, row_ok);
  const T* row_ptr = row_start<T>(a, row);
  const float inv_t = inv_temperature<PER_ROW_T>(a, pid);
  const int64_t start = (int64_t)chunk * chunk_v;
  const int64_t width = a.V - start < chunk_v ? a.V - start : chunk_v;
  const int64_t n_full = width / BLOCK_V;
  float m = -CUDART_INF_F, s = 0.0f, t = 0.0f;
  float x[E];
  for (int64_t tile = 0; tile < n_full; ++tile) {
    load_tile<T, E, VEC, false>(row_ptr, start + tile * BLOCK_V, a.V, x);
    fold_tile<E, ENT>(x, inv_t, m, s, t);
  }
  if (n_full * BLOCK_V < width) {
    load_tile<T, E, VEC, true>(row_ptr, start + n_full * BLOCK_V, a.V, x);
    fold_tile<E, ENT>(x, inv_t, m, s, t);
  }
  if (threadIdx.x != 0) return;  // every lane holds the same state
  if constexpr (FINISH) {
    float logp, log_s, entropy;
    row_results<T>(a, row_ptr, inv_t, index_at(a.target, a.target_32, pid), row_ok, m, s, t, logp, log_s, entropy);
    a.logp[pid] = logp;
    a.row_max[pid] = m;
    a.row_logsum[pid] = log_s;
    if (ENT) a.entropy[pid] = row_ok ? entropy : RLK_NAN;
  } else {
    float* out = a.state + pid * a.n_chunks + chunk;
    const int64_t plane = (int64_t)a.n_rows * a.n_chunks;
    out[0] = m;
    out[plane] = row_ok ? s : RLK_NAN;  // a missing row: NaN sum, so NaN results
    if (ENT) out[2 * plane] = t;
  }
}

// ---- the merge: shared by the one-warp and two-warp layouts ----

// Merge row block_row of the launch: the scored row it reads (rows past the end redo the last one and
// are not stored), the row's chunk states at `chunk` (empty past the row's chunks).
template <typename T, bool ENT, bool ROW_INDEX, bool PER_ROW_T>
struct MergeRow {
  int64_t block_row, pid;
  bool ok, row_ok;
  const T* row_ptr;
  float inv_t, m_c, s_c, t_c;

  __device__ __forceinline__ MergeRow(const Args& a, int64_t block_row_, int chunk) : block_row(block_row_) {
    ok = block_row < a.n_rows;
    pid = ok ? block_row : a.n_rows - 1;
    row_ptr = row_start<T>(a, row_of<ROW_INDEX>(a, pid, row_ok));
    inv_t = inv_temperature<PER_ROW_T>(a, pid);
    const int64_t plane = (int64_t)a.n_rows * a.n_chunks;
    const float* at = a.state + pid * a.n_chunks + chunk;
    const bool have = chunk < a.n_chunks;
    m_c = have ? at[0] : -CUDART_INF_F;
    s_c = have ? at[plane] : 0.0f;
    t_c = ENT && have ? at[2 * plane] : 0.0f;
  }

  // The row's results {logp, row max, log-sum, entropy} from its merged state (m, s, t).
  __device__ __forceinline__ void results(const Args& a, float m, float s, float t, float (&out)[4]) const {
    row_results<T>(a, row_ptr, inv_t, index_at(a.target, a.target_32, pid), row_ok, m, s, t, out[0], out[2], out[3]);
    out[1] = m;
  }

  // Written by the one thread that calls it.
  __device__ __forceinline__ void store(const Args& a, const float (&out)[4]) const {
    a.logp[block_row] = out[0];
    a.row_max[block_row] = out[1];
    a.row_logsum[block_row] = out[2];
    if (ENT) a.entropy[block_row] = out[3];
  }

  __device__ __forceinline__ void store(const Args& a, float m, float s, float t) const {
    float out[4];
    results(a, m, s, t, out);
    store(a, out);
  }
};

// Max over LANES lanes: butterflies LANES / 2 .. 1 (every lane gets it).
template <int LANES>
__device__ __forceinline__ float lanes_max(float v) {
#pragma unroll
  for (int d = LANES / 2; d >= 1; d >>= 1) v = fmaxf(v, shfl(v, d));
  return v;
}

// Sum over LANES lanes of x * y with the first butterfly add contracted with the lane's own product,
// fma(x, y, shfl(x * y, LANES / 2)), then adds at LANES / 4 .. 1 (Triton's PTX). That first step is
// asymmetric: lanes below LANES / 2 and the others end with different sums.
template <int LANES>
__device__ __forceinline__ float lanes_sum_of_products(float x, float y) {
  float v = __fmaf_rn(x, y, shfl(__fmul_rn(x, y), LANES / 2));
#pragma unroll
  for (int d = LANES / 4; d >= 1; d >>= 1) v = __fadd_rn(v, shfl(v, d));
  return v;
}

// One merge of (m, s, t) over LANES lanes; COMBINE merges the partials of several warps (identity for
// one warp). m's shift and the chunk weights beta as in the chunk kernel.
template <int LANES, bool ENT, typename Row, typename Combine>
__device__ __forceinline__ void merge_state(const Row& r, Combine combine, float& m, float& s, float& t) {
  m = combine(lanes_max<LANES>(r.m_c), true);
  const float shift = m == -CUDART_INF_F ? 0.0f : m;
  const float d_c = __fsub_rn(r.m_c, shift);
  const float beta = ex2_approx(__fmul_rn(d_c, LOG2E));
  s = combine(lanes_sum_of_products<LANES>(beta, r.s_c), false);
  t = 0.0f;
  if constexpr (ENT) {
    const float w = __fadd_rn(r.s_c > 0.0f ? __fmul_rn(d_c, r.s_c) : 0.0f, r.t_c);
    t = combine(lanes_sum_of_products<LANES>(w, beta), false);
  }
}

// 2 .. 32 chunks: MERGE_ROWS rows per block, 4 warps; a row's CHUNKS lanes hold its chunk states
// (lane % CHUNKS = chunk), 32 / CHUNKS rows per warp at a time.
template <typename T, int CHUNKS, int MERGE_ROWS, bool ENT, bool ROW_INDEX, bool PER_ROW_T>
__global__ void __launch_bounds__(128) slp_merge_kernel(Args a) {
  constexpr int ROWS_PER_PASS = 4 * 32 / CHUNKS;
  __shared__ float kept[4][ROWS_PER_PASS];  // [result][row of the pass]
  const int lane = threadIdx.x % CHUNKS, slot = threadIdx.x / CHUNKS;
#pragma unroll  // (straight-line code: the emulator runs loops only with a uniform back edge)
  for (int base = 0; base < MERGE_ROWS; base += ROWS_PER_PASS) {
    const MergeRow<T, ENT, ROW_INDEX, PER_ROW_T> r(a, (int64_t)blockIdx.x * MERGE_ROWS + base + slot, lane);
    float m, s, t;
    merge_state<CHUNKS, ENT>(r, [](float v, bool) { return v; }, m, s, t);
    // The row's lanes hold two candidate sums (lanes_sum_of_products): the lower half of its lanes one,
    // the upper half the other, so two candidate results. Triton's kernel has every lane of the row
    // write its results to the row's one shared slot and stores what the slot keeps. With 16 or 32
    // lanes a row, those are 16-byte stores (st.shared.v4: 4 or 8 rows a thread), which the hardware
    // runs in phases of 8 lanes in lane order: the slot keeps a write of the row's last phase, lanes
    // CHUNKS - 8 .. CHUNKS - 1, all of the upper half (the H200 gate refused the all-lane 4-byte
    // stores, whose one phase keeps a lower lane). With 8 lanes or fewer, Triton's 8- and 4-byte
    // stores put the row in one phase, as these 4-byte stores do: the same lanes write.
    constexpr int FIRST_WRITER = CHUNKS > 8 ? CHUNKS - 8 : 0;
    float out[4];
    r.results(a, m, s, t, out);
    if (lane >= FIRST_WRITER) {
#pragma unroll
      for (int k = 0; k < 4; ++k) kept[k][slot] = out[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = kept[k][slot];
    __syncthreads();  // the next pass writes the slots again
    if (lane == 0 && r.ok) r.store(a, out);
  }
}

// 33 .. 64 chunks: a row's chunks on two warps (chunk = (warp & 1) * 32 + lane, two rows a pass). Each
// warp reduces its 32 lanes as slp_merge_kernel does, lane 0 writes the warp's partial to shared
// memory (Triton's kernel: that store is predicated on lane 0), and the two partials combine in one
// symmetric step (max, or the sum p0 + p1) that every thread of the row reads back.
template <typename T, int MERGE_ROWS, bool ENT, bool ROW_INDEX, bool PER_ROW_T>
__global__ void __launch_bounds__(128) slp_merge64_kernel(Args a) {
  __shared__ float part[2][2];  // [row of the pass][warp half]
  const int lane = threadIdx.x & 31, half = (threadIdx.x >> 5) & 1, sub = threadIdx.x >> 6;
  auto combine = [&](float v, bool is_max) {  // the pass's two rows at once
    if (lane == 0) part[sub][half] = v;
    __syncthreads();
    const float r = is_max ? fmaxf(part[sub][0], part[sub][1]) : __fadd_rn(part[sub][0], part[sub][1]);
    __syncthreads();
    return r;
  };
#pragma unroll  // (straight-line code: the emulator runs loops only with a uniform back edge)
  for (int base = 0; base < MERGE_ROWS; base += 2) {
    const MergeRow<T, ENT, ROW_INDEX, PER_ROW_T> r(a, (int64_t)blockIdx.x * MERGE_ROWS + base + sub, half * 32 + lane);
    float m, s, t;
    merge_state<32, ENT>(r, combine, m, s, t);
    if (threadIdx.x % 64 == 0 && r.ok) r.store(a, m, s, t);  // every thread of the row holds the results
  }
}

constexpr int MERGE_ROWS = 32;  // rlk_triton/ops/selected_logp.py MERGE_ROWS (rows never mix: speed only)

template <typename T, int BLOCK_V, int VEC, bool ENT, bool ROW_INDEX, bool PER_ROW_T>
int launch(const Args& a, int chunk_v, cudaStream_t stream) {
  if (a.n_chunks > 64) return 1;  // the merge layouts: 2 .. 32 lanes of a warp, or two warps, per row
  const dim3 grid((unsigned)a.n_rows, (unsigned)a.n_chunks);
  if (a.n_chunks == 1) {
    slp_chunk_kernel<T, BLOCK_V, VEC, ENT, ROW_INDEX, PER_ROW_T, true><<<grid, 32, 0, stream>>>(a, chunk_v);
  } else {
    slp_chunk_kernel<T, BLOCK_V, VEC, ENT, ROW_INDEX, PER_ROW_T, false><<<grid, 32, 0, stream>>>(a, chunk_v);
    const unsigned blocks = (unsigned)((a.n_rows + MERGE_ROWS - 1) / MERGE_ROWS);
#define RLK_MERGE(C) slp_merge_kernel<T, C, MERGE_ROWS, ENT, ROW_INDEX, PER_ROW_T><<<blocks, 128, 0, stream>>>(a)
    if (a.n_chunks <= 2) RLK_MERGE(2);
    else if (a.n_chunks <= 4) RLK_MERGE(4);
    else if (a.n_chunks <= 8) RLK_MERGE(8);
    else if (a.n_chunks <= 16) RLK_MERGE(16);
    else if (a.n_chunks <= 32) RLK_MERGE(32);
    else slp_merge64_kernel<T, MERGE_ROWS, ENT, ROW_INDEX, PER_ROW_T><<<blocks, 128, 0, stream>>>(a);
#undef RLK_MERGE
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

template <typename T, int BLOCK_V, int VEC>
int launch_flags(const Args& a, int chunk_v, bool ent, cudaStream_t stream) {
  const bool ri = a.row_index != nullptr, prt = a.temperature_rows != nullptr;
#define RLK_FLAGS(E, R, P) \
  if (ent == E && ri == R && prt == P) return launch<T, BLOCK_V, VEC, E, R, P>(a, chunk_v, stream);
  RLK_FLAGS(false, false, false) RLK_FLAGS(false, false, true) RLK_FLAGS(false, true, false) RLK_FLAGS(false, true, true)
  RLK_FLAGS(true, false, false) RLK_FLAGS(true, false, true) RLK_FLAGS(true, true, false) RLK_FLAGS(true, true, true)
#undef RLK_FLAGS
  return 1;
}

// ---- backward: d logits, elementwise (no reduction, so no layout in the bits) ----
// Per element, Triton's _bwd_kernel as its PTX computes it (no contraction left to ptxas, checked):
//   log_p = fma(inv_t, x, -row_max) - row_logsum; p = ex2.approx.ftz(log_p * log2 e);
//   g = target == ignore_index ? 0 : grad_logp; dx = fma(-p, g, lane == target ? g : 0);
//   with the entropy's gradient h: dx = fma(-(p > 0 ? p * (log_p + entropy) : 0), h, dx);
//   dx = inv_t * dx, rounded once to the logits' dtype.
// A scored row that is not a row of the logits (bad row index) writes nothing.
struct BwdArgs {
  const void* logits; int64_t stride; const void* target; const void* row_index; const float* temperature_rows;
  float temperature; const float *row_max, *row_logsum, *entropy, *grad_logp, *grad_entropy;
  void* grad; int64_t V, ignore_index, total_rows; int target_32, row_index_32;
};

__device__ __forceinline__ unsigned short round_to(__half, float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ unsigned short round_to(__nv_bfloat16, float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ unsigned round_to(float, float v) { return __float_as_uint(v); }

// grid (scored rows, V / (BWD_THREADS * UNROLL * VEC) blocks) of BWD_THREADS threads; a thread's u-th
// access is VEC consecutive elements at ((u * BWD_THREADS) + thread) * VEC of its block: each access is
// one coalesced sweep of the block, as Triton's 2-warp layout has four 16-byte accesses a thread. The
// loads go out first (they need only the row), so they are in flight while the row's scalars arrive.
constexpr int BWD_THREADS = 64;

template <typename T, int VEC, int UNROLL, bool ENT, bool ROW_INDEX, bool PER_ROW_T>
__global__ void __launch_bounds__(BWD_THREADS) slp_bwd_kernel(BwdArgs a) {
  using R = typename Raw<T>::type;
  const int64_t pid = blockIdx.x;
  const int64_t row = ROW_INDEX ? index_at(a.row_index, a.row_index_32, pid) : pid;
  if (row < 0 || row >= a.total_rows) return;  // not a row: no gradient anywhere
  const R* x = reinterpret_cast<const R*>(a.logits) + row * a.stride;
  R* out = reinterpret_cast<R*>(a.grad) + row * a.V;
  const int64_t base = (int64_t)blockIdx.y * (BWD_THREADS * UNROLL * VEC) + threadIdx.x * VEC;
  constexpr bool WIDE = VEC * sizeof(R) == 16;  // one 16-byte access where the vector is whole
  union Vec { uint4 v; R e[VEC]; } xin[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t lane0 = base + u * (BWD_THREADS * VEC);
    if (WIDE && lane0 + VEC <= a.V) {
      xin[u].v = __ldcs(reinterpret_cast<const uint4*>(x + lane0));
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) xin[u].e[j] = lane0 + j < a.V ? x[lane0 + j] : R(0);
    }
  }
  const float inv_t = div_full(1.0f, PER_ROW_T ? a.temperature_rows[pid] : a.temperature);
  const float neg_max = -a.row_max[pid], logsum = a.row_logsum[pid];
  const int64_t target = index_at(a.target, a.target_32, pid);
  const float g = target == a.ignore_index ? 0.0f : a.grad_logp[pid];
  const float h = ENT ? a.grad_entropy[pid] : 0.0f, ent = ENT ? a.entropy[pid] : 0.0f;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t lane0 = base + u * (BWD_THREADS * VEC);
    if (lane0 >= a.V) break;  // later accesses start further right
    Vec dout;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t lane = lane0 + j;
      const float log_p = __fsub_rn(__fmaf_rn(inv_t, to_f32(T(), xin[u].e[j]), neg_max), logsum);
      const float p = ex2_approx(__fmul_rn(log_p, LOG2E));
      float dx = __fmaf_rn(-p, g, lane == target ? g : 0.0f);
      if constexpr (ENT) dx = __fmaf_rn(-(p > 0.0f ? __fmul_rn(p, __fadd_rn(log_p, ent)) : 0.0f), h, dx);
      dout.e[j] = (R)round_to(T(), __fmul_rn(inv_t, dx));
    }
    if (WIDE && lane0 + VEC <= a.V) {
      __stcs(reinterpret_cast<uint4*>(out + lane0), dout.v);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (lane0 + j < a.V) out[lane0 + j] = dout.e[j];
    }
  }
}

// vectors a thread: four 16-byte accesses (Triton's count); sixteen scalars where rows are not aligned
template <int VEC>
constexpr int bwd_unroll() { return VEC == 1 ? 16 : 4; }

template <typename T, int VEC>
int launch_bwd(const BwdArgs& a, int n_rows, bool ent, cudaStream_t stream) {
  constexpr int U = bwd_unroll<VEC>(), PER_BLOCK = BWD_THREADS * U * VEC;
  const dim3 grid((unsigned)n_rows, (unsigned)((a.V + PER_BLOCK - 1) / PER_BLOCK));
  const bool ri = a.row_index != nullptr, prt = a.temperature_rows != nullptr;
#define RLK_BWD(E, R, P) \
  if (ent == E && ri == R && prt == P) slp_bwd_kernel<T, VEC, U, E, R, P><<<grid, BWD_THREADS, 0, stream>>>(a);
  RLK_BWD(false, false, false) RLK_BWD(false, false, true) RLK_BWD(false, true, false) RLK_BWD(false, true, true)
  RLK_BWD(true, false, false) RLK_BWD(true, false, true) RLK_BWD(true, true, false) RLK_BWD(true, true, true)
#undef RLK_BWD
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

}  // namespace

// The backward: grad [total_rows, V] in the logits' dtype, contiguous (rows not scored are the caller's:
// zeros when row_index is given). vec: 16 bytes' worth when the logits' row stride and V keep every
// vector aligned (the caller decides), else 1; speed only, never bits. grad_entropy / entropy null
// without the entropy's gradient. Returns 0, 1 (no kernel) or 2 (launch error).
extern "C" int rlk_selected_logp_bwd(int dtype, const void* logits, int64_t stride, const void* target,
                                     const void* row_index, int index_32, const float* temperature_rows,
                                     float temperature, const float* row_max, const float* row_logsum,
                                     const float* entropy, const float* grad_logp, const float* grad_entropy,
                                     void* grad, int64_t V, int64_t ignore_index, int n_rows, int64_t total_rows,
                                     int vec, void* stream_ptr) {
  const BwdArgs a{logits, stride, target, row_index, temperature_rows, temperature, row_max, row_logsum, entropy,
                  grad_logp, grad_entropy, grad, V, ignore_index, total_rows, index_32 & 1, (index_32 >> 1) & 1};
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_ptr);
  if (n_rows == 0 || V == 0) return 0;
  const bool ent = grad_entropy != nullptr;
  switch (dtype * 100 + vec) {
    case 208: return launch_bwd<__nv_bfloat16, 8>(a, n_rows, ent, stream);
    case 201: return launch_bwd<__nv_bfloat16, 1>(a, n_rows, ent, stream);
    case 108: return launch_bwd<__half, 8>(a, n_rows, ent, stream);
    case 101: return launch_bwd<__half, 1>(a, n_rows, ent, stream);
    case 4: return launch_bwd<float, 4>(a, n_rows, ent, stream);
    case 1: return launch_bwd<float, 1>(a, n_rows, ent, stream);
    default: return 1;
  }
}

// dtype: 0 float32, 1 float16, 2 bfloat16. block_v / chunk_v: the locked tile and chunk widths; vec:
// the Triton layout's lanes per vector. target / row_index: int32 (index_32 bit 0 / bit 1) or int64;
// row_index and temperature_rows null when absent; entropy null without entropy; state [2 or 3,
// n_rows, n_chunks] fp32 (unused with one chunk). Returns 0 on success, 1 for a configuration this
// file has no kernel for (the caller refuses the call), 2 for a CUDA launch error.
extern "C" int rlk_selected_logp_fwd(int dtype, const void* logits, int64_t stride_outer, int64_t stride_inner,
                                     int64_t inner_size, const void* target, const void* row_index, int index_32,
                                     const float* temperature_rows, float temperature, float* logp, float* entropy,
                                     float* row_max, float* row_logsum, float* state, int64_t V,
                                     int64_t ignore_index, int n_rows, int n_chunks, int64_t total_rows,
                                     int block_v, int chunk_v, int vec, void* stream_ptr) {
  const Args a{logits, stride_outer, stride_inner, inner_size, target, row_index, temperature_rows, temperature,
               logp, entropy, row_max, row_logsum, state, V, ignore_index, n_rows, n_chunks, total_rows,
               index_32 & 1, (index_32 >> 1) & 1};
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_ptr);
  if (n_rows == 0) return 0;
  const bool ent = entropy != nullptr;
  // the locked (dtype, BLOCK_V) pairs of sm90, one warp each (configs "selected_logp_fwd")
  if (dtype == 2 && block_v == 2048 && vec == 8) return launch_flags<__nv_bfloat16, 2048, 8>(a, chunk_v, ent, stream);
  if (dtype == 2 && block_v == 1024 && vec == 8) return launch_flags<__nv_bfloat16, 1024, 8>(a, chunk_v, ent, stream);
  if (dtype == 1 && block_v == 2048 && vec == 8) return launch_flags<__half, 2048, 8>(a, chunk_v, ent, stream);
  if (dtype == 1 && block_v == 1024 && vec == 8) return launch_flags<__half, 1024, 8>(a, chunk_v, ent, stream);
  if (dtype == 0 && block_v == 1024 && vec == 4) return launch_flags<float, 1024, 4>(a, chunk_v, ent, stream);
  // rows whose starts are not known 16-byte aligned: Triton's layout has one lane per vector
  if (dtype == 2 && block_v == 2048 && vec == 1) return launch_flags<__nv_bfloat16, 2048, 1>(a, chunk_v, ent, stream);
  if (dtype == 2 && block_v == 1024 && vec == 1) return launch_flags<__nv_bfloat16, 1024, 1>(a, chunk_v, ent, stream);
  if (dtype == 1 && block_v == 2048 && vec == 1) return launch_flags<__half, 2048, 1>(a, chunk_v, ent, stream);
  if (dtype == 1 && block_v == 1024 && vec == 1) return launch_flags<__half, 1024, 1>(a, chunk_v, ent, stream);
  if (dtype == 0 && block_v == 1024 && vec == 1) return launch_flags<float, 1024, 1>(a, chunk_v, ent, stream);
  return 1;
}
