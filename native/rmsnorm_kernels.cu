// rms_norm forward, with or without the fused residual add, and backward (below: "backward"), written to
// give the Triton kernels' bits: rlk_triton/ops/rmsnorm.py
// _fwd_kernel's one-tile path and _fwd_rows_kernel, with the locked config's BLOCK_H lanes and
// num_warps (rlk_triton/configs.py "rmsnorm_fwd"). The caller passes the layout's vector width VEC
// (rlk_triton/native.py _rmsnorm_config): the order depends on it. ROWS rows per block (the rows
// kernel's count) is speed only: rows are independent.
//
// The order is Triton 3.6's (the GPU machine's), read from the kernels' sm90 PTX compiled with the 3.6
// wheel under the JIT's specialization (16-byte aligned pointers, ints divisible by 16 marked: without
// it every layout has VEC 1, which is what the first version of this file followed), and checked by
// running that PTX and this file's PTX in an emulator on the gate's cases:
//   0. blocked layout: sizePerThread VEC, 32 threads per warp, num_warps warps, so thread t holds
//      register r = 0 .. E - 1 at lane (r / VEC) * VEC * threads + t * VEC + r % VEC (VEC
//      consecutive lanes, then the next VEC * threads lanes further on). VEC is 16 bytes' worth, at
//      most E; 1 in the rows kernel when neither H nor the row stride is a multiple of 16;
//   1. per thread, a chain in register order with each product contracted into the add:
//        acc = fma(h0, h0, h1 * h1), then acc = fma(hr, hr, acc) for r = 2 .. E - 1;
//      with E = 1 the product is contracted into the first shuffle's add instead:
//        s = fma(h0, h0, shfl_xor(h0 * h0, 16))   (lanes then hold different sums: lane 0's counts);
//   2. per warp, butterfly adds with shuffle distances 16 (unless taken by 1.), 8, 4, 2, 1;
//   3. across warps: lane 0's sum of each warp to shared memory, then butterfly adds of those sums
//      with distances num_warps / 2 .. 1 (symmetric adds: every lane gets lane 0's result);
//   4. rstd = 1 / sqrt_rn(sum / H + eps) with IEEE division and square root; y = (rstd * h) * (w +
//      weight_offset), rounded once to the output dtype. Masked lanes hold 0 and add exact zeros.
// With the residual (RES), h = dtype(x + residual) replaces x before step 1 (add_words: the
// instructions Triton emits for it) and is stored as the next residual. The layouts are the same; the
// one fused layout with no rule here is refused by the caller (rlk_triton/native.py _rmsnorm_config).
// ptxas contracts none of Triton's plain mul.f32 / add.f32 here (the same SASS with them made .rn).
// Triton 3.9 reduces within a thread in a pairwise tree instead: these bits are 3.6's, and the
// admission fingerprint carries the triton version. Every operation is an explicit _rn intrinsic
// (also built with --fmad=false). `rlk-triton native admit` checks the bits on the GPU.
// Speed, as Triton: VEC lanes per load / store (16-byte accesses on aligned rows), the rows kept as
// packed 16-bit bits (converted again for y: exact), the weight read after the sums. Rows of exactly
// one tile with aligned row starts (FULL: H = BLOCK_H, the row stride a multiple of VEC; the host
// decides) take a path without per-vector bounds or alignment branches, so that every load of a row
// is issued before the first use. x is read and y written once: streaming cache hints (ld / st .cs,
// RLK_STREAMING, default on) keep them from evicting the weight. The backward goes without them
// (RLK_BWD_STREAMING, default off): 2-3% faster on an H100 without the residual
// (docs/reports/h100-native-2026-12-06.json); and reads its rows with plain ld.global, as Triton does,
// not the read-only path nvcc takes for const __restrict__ (RLK_BWD_READONLY_LOADS=1 restores that).
// None of these changes an operation.
// No torch headers: CI compiles this file for sm_90a with nvcc alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace {

// Elements travel as raw bits, packed as in memory (a 16-bit element's low lane in the low half of a
// 32-bit word): a row of bf16 / fp16 stays in half the registers, converted to fp32 where used (exact).
template <typename T> struct Bits { using type = unsigned short; static constexpr int per_word = 2; };
template <> struct Bits<float> { using type = unsigned; static constexpr int per_word = 1; };

__device__ __forceinline__ float to_f32(float, unsigned b) { return __uint_as_float(b); }
__device__ __forceinline__ float to_f32(__half, unsigned b) { return __half2float(__ushort_as_half((unsigned short)b)); }

__device__ __forceinline__ unsigned from_f32(float, float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned from_f32(__half, float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ unsigned from_f32(__nv_bfloat16, float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Element r of packed words, and setting it (the low half of a word first).
template <typename T>
__device__ __forceinline__ unsigned elem(const unsigned* raw, int r) {
  if constexpr (Bits<T>::per_word == 1) return raw[r];
  else return (raw[r / 2] >> (16 * (r % 2))) & 0xffffu;
}
template <typename T>
__device__ __forceinline__ void set_elem(unsigned* raw, int r, unsigned b) {
  if constexpr (Bits<T>::per_word == 1) raw[r] = b;
  else if (r % 2 == 0) raw[r / 2] = b;
  else raw[r / 2] |= b << 16;
}
template <typename T>
__device__ __forceinline__ float elem_f32(const unsigned* raw, int r) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)  // bf16 is fp32's upper half: one shift or mask, exact
    return __uint_as_float(r % 2 ? raw[r / 2] & 0xffff0000u : raw[r / 2] << 16);
  else return to_f32(T(), elem<T>(raw, r));
}

// The residual add, one 32-bit word of packed elements: Triton 3.6 compiles dtype(fp32(x) + fp32(r))
// to these instructions (one rounding of the exact sum; equal to rounding the fp32 sum, which is exact
// for fp32 and innocuous double rounding for the 16-bit types), so the same instructions here.
__device__ __forceinline__ unsigned add_words(float, unsigned a, unsigned b) {
  return __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(b)));
}
__device__ __forceinline__ unsigned add_words(__half, unsigned a, unsigned b) {
  unsigned d;
  asm("add.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ unsigned add_words(__nv_bfloat16, unsigned a, unsigned b) {
  unsigned d;
  asm("add.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// One access of BYTES bytes (an aligned vector) as 32-bit words.
template <int BYTES> struct Access;
template <> struct Access<16> { using type = uint4; };
template <> struct Access<8> { using type = uint2; };
template <> struct Access<4> { using type = unsigned; };

__device__ __forceinline__ void words(uint4 v, unsigned* w) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void words(uint2 v, unsigned* w) { w[0] = v.x; w[1] = v.y; }
__device__ __forceinline__ void words(unsigned v, unsigned* w) { w[0] = v; }
__device__ __forceinline__ void pack(uint4& v, const unsigned* w) { v = make_uint4(w[0], w[1], w[2], w[3]); }
__device__ __forceinline__ void pack(uint2& v, const unsigned* w) { v = make_uint2(w[0], w[1]); }
__device__ __forceinline__ void pack(unsigned& v, const unsigned* w) { v = w[0]; }

#ifndef RLK_STREAMING
#define RLK_STREAMING 1
#endif
#ifndef RLK_BWD_STREAMING  // the backward's loads and stores: the default policy, as Triton's (measured faster)
#define RLK_BWD_STREAMING 0
#endif
#ifndef RLK_BWD_READONLY_LOADS  // the backward's row loads: plain ld.global, as Triton's (see load_vec)
#define RLK_BWD_READONLY_LOADS 0
#endif
// How a vector is read: STREAM, read once (ld.global.cs, evict first); PLAIN, ld.global with no
// qualifier, as Triton emits (nvcc would take the read-only path, ld.global.nc, for a const __restrict__
// pointer); DEFAULT, the compiler's choice.
enum LoadPath { DEFAULT, STREAM, PLAIN };
__device__ __forceinline__ uint4 ld_plain(const uint4* p) {
  uint4 v;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_plain(const uint2* p) {
  uint2 v;
  asm("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned ld_plain(const unsigned* p) {
  unsigned v;
  asm("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
template <LoadPath PATH, typename A>
__device__ __forceinline__ A load_vec(const A* p) {
  if constexpr (PATH == STREAM && RLK_STREAMING) return __ldcs(p);
  else if constexpr (PATH == PLAIN) return ld_plain(p);
  else return *p;
}
// One vector store; STREAM: written once (evict first), else the default policy.
template <bool STREAM, typename A>
__device__ __forceinline__ void store_vec(A* p, A v) {
  if constexpr (STREAM && RLK_STREAMING) __stcs(p, v);
  else *p = v;
}

// Lanes lane0 .. lane0 + V - 1 of a row into elements r0 .. r0 + V - 1 of raw (0 beyond H); one
// vector access when all V are in the row and the row is aligned for it (FULL: known to be).
template <typename T, int V, bool FULL = false, LoadPath PATH = DEFAULT>
__device__ __forceinline__ void load_lanes(const T* row, int lane0, int H, bool aligned, unsigned* raw, int r0) {
  using B = typename Bits<T>::type;
  const B* p = reinterpret_cast<const B*>(row) + lane0;
  constexpr int BYTES = V * (int)sizeof(B);
  if constexpr (BYTES >= 4) {
    if (FULL || (aligned && lane0 + V <= H)) {
      words(load_vec<PATH>(reinterpret_cast<const typename Access<BYTES>::type*>(p)), raw + r0 / Bits<T>::per_word);
      return;
    }
  }
  if constexpr (!(FULL && BYTES >= 4)) {  // else unreachable
#pragma unroll
    for (int j = 0; j < V; ++j) set_elem<T>(raw, r0 + j, lane0 + j < H ? (unsigned)p[j] : 0u);
  }
}

template <typename T, int V, bool FULL = false, bool STREAM = true>
__device__ __forceinline__ void store_lanes(T* row, int lane0, int H, bool aligned, const unsigned* raw) {
  using B = typename Bits<T>::type;
  B* p = reinterpret_cast<B*>(row) + lane0;
  constexpr int BYTES = V * (int)sizeof(B);
  if constexpr (BYTES >= 4) {
    if (FULL || (aligned && lane0 + V <= H)) {
      typename Access<BYTES>::type v;
      pack(v, raw);
      store_vec<STREAM>(reinterpret_cast<typename Access<BYTES>::type*>(p), v);
      return;
    }
  }
  if constexpr (!(FULL && BYTES >= 4)) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (lane0 + j < H) p[j] = (B)elem<T>(raw, j);
  }
}

template <typename T>
__device__ __forceinline__ bool aligned_for(const T* p, int vec) {
  return reinterpret_cast<uintptr_t>(p) % (vec * sizeof(T)) == 0;
}

// The row kernels' blocked layout: E registers per thread in CHUNKS vectors of VEC lanes; register
// r = c * VEC + j of thread t holds lane c * VEC * THREADS + t * VEC + j. Rows travel as WORDS packed words.
template <typename T, int E, int VEC, int WARPS>
struct RowLayout {
  static_assert(E % VEC == 0, "a thread holds whole vectors");
  static constexpr int THREADS = WARPS * 32, CHUNKS = E / VEC;
  static constexpr int WORDS = (E + Bits<T>::per_word - 1) / Bits<T>::per_word;
  static constexpr int VWORDS = (VEC + Bits<T>::per_word - 1) / Bits<T>::per_word;
};

// The full vector: 16 bytes' worth of lanes, at most E.
template <typename T, int E>
constexpr int full_vec() { return 16 / (int)sizeof(T) < E ? 16 / (int)sizeof(T) : E; }

// Step 3: the warps' lane-0 sums, read back from shared memory, in butterfly adds WARPS / 2 .. 1 (every
// lane gets lane 0's result).
template <int WARPS>
__device__ __forceinline__ float across_warps(const float* warp_sums, int t) {
  float s = warp_sums[(t & 31) % WARPS];
#pragma unroll
  for (int d = WARPS / 2; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, d));
  return s;
}

// Step 1 for E >= 2: the sum of squares of a thread's registers, chained in register order.
template <typename T, int E>
__device__ __forceinline__ float chain_squares(const unsigned* raw) {
  float acc = __fmaf_rn(elem_f32<T>(raw, 0), elem_f32<T>(raw, 0), __fmul_rn(elem_f32<T>(raw, 1), elem_f32<T>(raw, 1)));
#pragma unroll
  for (int k = 2; k < E; ++k) acc = __fmaf_rn(elem_f32<T>(raw, k), elem_f32<T>(raw, k), acc);
  return acc;
}

// RES: the fused residual add. h = dtype(x + residual) is stored to res_out ([N, H], contiguous) and
// normalized: the same order on h as on x without the residual.
template <typename T, int E, int VEC, int WARPS, int ROWS, bool FULL, bool RES>
__global__ void __launch_bounds__(WARPS * 32) rms_norm_fwd_kernel(
    const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ r, int64_t r_row_stride,
    const T* __restrict__ w, T* __restrict__ y, T* __restrict__ res_out,
    float* __restrict__ rstd_out, int64_t N, int H, float h_count, float eps, float weight_offset) {
  using L = RowLayout<T, E, VEC, WARPS>;
  constexpr int THREADS = L::THREADS, CHUNKS = L::CHUNKS, WORDS = L::WORDS, VWORDS = L::VWORDS;
  const int t = threadIdx.x;
  const int64_t row0 = (int64_t)blockIdx.x * ROWS;
  unsigned h[ROWS][WORDS];  // the rows' raw bits
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {  // all rows' loads first: more bytes in flight
    const int64_t row = row0 + i;
    const T* xr = x + (row < N ? row : 0) * x_row_stride;
    const bool ok = FULL || aligned_for(xr, VEC);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      if (row < N) {
        load_lanes<T, VEC, FULL, STREAM>(xr, c * VEC * THREADS + t * VEC, H, ok, h[i], c * VEC);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) set_elem<T>(h[i], c * VEC + j, 0u);
      }
    }
  }
  if constexpr (RES) {  // h = dtype(x + residual), stored as the next residual; masked lanes: 0 + 0
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int64_t row = row0 + i;
      if (row >= N) continue;
      const T* rr = r + row * r_row_stride;
      T* out = res_out + row * (int64_t)H;
      const bool r_ok = FULL || aligned_for(rr, VEC);
      const bool o_ok = FULL || aligned_for(out, VEC);
      unsigned rb[WORDS];
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) load_lanes<T, VEC, FULL, STREAM>(rr, c * VEC * THREADS + t * VEC, H, r_ok, rb, c * VEC);
#pragma unroll
      for (int k = 0; k < WORDS; ++k) h[i][k] = add_words(T(), h[i][k], rb[k]);
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        unsigned b[VWORDS];
#pragma unroll
        for (int j = 0; j < VEC; ++j) set_elem<T>(b, j, elem<T>(h[i], c * VEC + j));
        store_lanes<T, VEC, FULL>(out, c * VEC * THREADS + t * VEC, H, o_ok, b);
      }
    }
  }
  __shared__ float warp_sums[ROWS][WARPS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    float s;
    if constexpr (E == 1) {
      const float h0 = elem_f32<T>(h[i], 0);
      s = __fmaf_rn(h0, h0, __shfl_xor_sync(0xffffffffu, __fmul_rn(h0, h0), 16));
    } else {
      s = chain_squares<T, E>(h[i]);
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 16));
    }
#pragma unroll
    for (int d = 8; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, d));
    if ((t & 31) == 0) warp_sums[i][t >> 5] = s;
  }
  __syncthreads();
  float rstd[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const float s = across_warps<WARPS>(warp_sums[i], t);
    rstd[i] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, h_count), eps)));
  }
  // The weight after the sums, as Triton (fewer live registers), one vector at a time for all rows.
  const bool w_ok = aligned_for(w, VEC);
  bool y_ok[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) y_ok[i] = FULL || aligned_for(y + (row0 + i) * (int64_t)H, VEC);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int lane0 = c * VEC * THREADS + t * VEC;
    unsigned wb[VWORDS];
    load_lanes<T, VEC, FULL>(w, lane0, H, w_ok, wb, 0);
    float wk[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) wk[j] = __fadd_rn(elem_f32<T>(wb, j), weight_offset);
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      if (row0 + i >= N) continue;
      unsigned b[VWORDS];
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        set_elem<T>(b, j, from_f32(T(), __fmul_rn(__fmul_rn(rstd[i], elem_f32<T>(h[i], c * VEC + j)), wk[j])));
      store_lanes<T, VEC, FULL>(y + (row0 + i) * (int64_t)H, lane0, H, y_ok[i], b);
    }
  }
  if (t == 0) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
      if (row0 + i < N) rstd_out[row0 + i] = rstd[i];
  }
}

// A launch's arguments (r and res_out null without the residual).
struct FwdArgs {
  const void* x; int64_t x_row_stride; const void* r; int64_t r_row_stride; const void* w;
  void* y; void* res_out; float* rstd; int64_t N; int H; float eps; float weight_offset; cudaStream_t stream;
};

template <typename T, int E, int VEC, int WARPS, bool FULL, bool RES>
int launch_rows(const FwdArgs& a, int rows) {
#define RLK_ROWS(R)                                                                                            \
  case R:                                                                                                      \
    rms_norm_fwd_kernel<T, E, VEC, WARPS, R, FULL, RES><<<(unsigned)((a.N + R - 1) / R), WARPS * 32, 0, a.stream>>>( \
        (const T*)a.x, a.x_row_stride, (const T*)a.r, a.r_row_stride, (const T*)a.w, (T*)a.y, (T*)a.res_out,    \
        a.rstd, a.N, a.H, (float)a.H, a.eps, a.weight_offset);                                                  \
    break;
  switch (rows) {
    RLK_ROWS(1) RLK_ROWS(2)
    default:
      return 1;
  }
#undef RLK_ROWS
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

template <typename T, int E, int VEC, int WARPS, bool FULL>
int launch_res(const FwdArgs& a, int rows) {
  return a.r ? launch_rows<T, E, VEC, WARPS, FULL, true>(a, rows) : launch_rows<T, E, VEC, WARPS, FULL, false>(a, rows);
}

// vec: the full vector (16 bytes, at most E lanes) or 1 (the rows kernel when neither H nor the row
// stride is a multiple of 16).
template <typename T, int E, int WARPS>
int launch_vec(const FwdArgs& a, int vec, int rows) {
  constexpr int WIDE = full_vec<T, E>();
  if (vec == WIDE) {
    // FULL: every lane of the tile is in the row and every row start is vector-aligned (x and the
    // residual are; res_out and y are [N, H] with H the tile)
    if (a.H == E * WARPS * 32 && a.x_row_stride % WIDE == 0 && (!a.r || a.r_row_stride % WIDE == 0))
      return launch_res<T, E, WIDE, WARPS, true>(a, rows);
    return launch_res<T, E, WIDE, WARPS, false>(a, rows);
  }
  if constexpr (WIDE != 1) {
    if (vec == 1) return launch_res<T, E, 1, WARPS, false>(a, rows);
  }
  return 1;
}

template <typename T>
int launch_dtype(const FwdArgs& a, int block_h, int num_warps, int vec, int rows) {
  const int e = block_h / (num_warps * 32);
  // the (num_warps, E) pairs of the locked table: tiles 128 .. 1024 on 4 warps, 2048 .. 8192 on 8, 16384 on 16
#define RLK_CFG(W, E) \
  if (num_warps == W && e == E) return launch_vec<T, E, W>(a, vec, rows);
  RLK_CFG(4, 1) RLK_CFG(4, 2) RLK_CFG(4, 4) RLK_CFG(4, 8)
  RLK_CFG(8, 8) RLK_CFG(8, 16) RLK_CFG(8, 32)
  RLK_CFG(16, 32)
#undef RLK_CFG
  return 1;  // not a layout this kernel has
}


// ---- backward: _bwd_kernel's one-tile path and _dw_reduce_kernel ----
// The order, again Triton 3.6's sm90 PTX (scripts/native_ptx_compare.py checks it):
//   layout: the forward's blocked layout with the full VEC (16 bytes, at most E lanes) for every H and
//     row stride (Triton keeps it where it falls back to scalar accesses);
//   per row: w' = offset + w, gw = w' * g, xhat = rstd * h; p = fma(gw, xhat, +0) (the fold of
//     reduction.fold_products into a zero tile, contracted by LLVM); per thread a chain in register
//     order, acc = p0 + p1, then acc = p_r + acc; steps 2-3 of the forward (warp butterfly 16 .. 1,
//     lane 0 of each warp through shared memory, butterfly WARPS / 2 .. 1); c = sum / H (IEEE div);
//     dh = fma(-xhat, c, gw) * rstd, or fma(fma(-xhat, c, gw), rstd, d residual_out) (contracted by LLVM);
//   dW partial of a block of R rows (the locked "rmsnorm_dw_rows"): per lane, dw = fma(xhat, g, dw)
//     over the block's rows in increasing order, from +0; stored as the block's fp32 row.
// The partial rows are then summed by rms_norm_dw_reduce_kernel (below).
template <typename T, int E, int VEC, int WARPS, bool FULL, bool GRES, bool DRES>
__global__ void __launch_bounds__(WARPS * 32) rms_norm_bwd_kernel(
    const T* __restrict__ g, const T* __restrict__ gres, const T* __restrict__ h, int64_t h_row_stride,
    const T* __restrict__ w, const float* __restrict__ rstd, T* __restrict__ dx, T* __restrict__ dres,
    float* __restrict__ partial, int64_t N, int H, float h_count, float weight_offset, int rows_per_block,
    bool with_dw) {
  using L = RowLayout<T, E, VEC, WARPS>;
  constexpr int THREADS = L::THREADS, CHUNKS = L::CHUNKS, WORDS = L::WORDS, VWORDS = L::VWORDS;
  const int t = threadIdx.x;
  const int64_t row0 = (int64_t)blockIdx.x * rows_per_block;
  const int64_t row_end = row0 + rows_per_block < N ? row0 + rows_per_block : N;
  // Registers: the rows stay raw bits. KEEP, where the register file has room (an estimate of the live
  // registers), holds w + offset for the block and xhat / gw for the row, as Triton's kernel does;
  // otherwise (the 16-warp tiles) they are recomputed where used, the same operations and so the same
  // bits, so that the next row's loads stay in flight without spilling. PREFETCH likewise.
  constexpr int REGS = 65536 / THREADS < 255 ? 65536 / THREADS : 255;
  constexpr bool PREFETCH = 5 * WORDS + E + 32 <= REGS;
  constexpr bool KEEP = PREFETCH && 5 * WORDS + 4 * E + 40 <= REGS;
  unsigned wb[WORDS];
  {
    const bool w_ok = aligned_for(w, VEC);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) load_lanes<T, VEC, FULL>(w, c * VEC * THREADS + t * VEC, H, w_ok, wb, c * VEC);
  }
  float dw[E], wk[KEEP ? E : 1];
#pragma unroll
  for (int k = 0; k < E; ++k) {
    dw[k] = 0.0f;
    if constexpr (KEEP) wk[k] = __fadd_rn(weight_offset, elem_f32<T>(wb, k));
  }
  __shared__ float warp_sums[2][WARPS];  // two rows' buffers: one barrier per row
  // A row's h, g (and the residual_out gradient) as raw bits. With PREFETCH, as Triton's kernel, the
  // next row's loads are issued before this row's reduction (the last row is read twice rather than
  // branched around).
  unsigned hn[WORDS], gn[WORDS], rn[GRES ? WORDS : 1];
  constexpr bool BWD_STREAM = RLK_BWD_STREAMING;
  constexpr LoadPath ROW_LOADS = BWD_STREAM ? STREAM : RLK_BWD_READONLY_LOADS ? DEFAULT : PLAIN;
  // row pointers advanced by a row each step (no 64-bit multiply per row)
  const T* hr_next = h + row0 * h_row_stride;
  const T* gr_next = g + row0 * (int64_t)H;
  const T* rr_next = GRES ? gres + row0 * (int64_t)H : g;
  auto load_row = [&]() {
    const T* hr = hr_next;
    const T* gr = gr_next;
    const bool h_ok = FULL || aligned_for(hr, VEC), g_ok = FULL || aligned_for(gr, VEC);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int lane0 = c * VEC * THREADS + t * VEC;
      load_lanes<T, VEC, FULL, ROW_LOADS>(hr, lane0, H, h_ok, hn, c * VEC);
      load_lanes<T, VEC, FULL, ROW_LOADS>(gr, lane0, H, g_ok, gn, c * VEC);
      if constexpr (GRES) load_lanes<T, VEC, FULL, ROW_LOADS>(rr_next, lane0, H, g_ok, rn, c * VEC);
    }
  };
  auto advance = [&](bool step) {
    if (step) { hr_next += h_row_stride; gr_next += H; if constexpr (GRES) rr_next += H; }
  };
  if (PREFETCH && row0 < row_end) load_row();
  for (int64_t row = row0; row < row_end; ++row) {
    if (!PREFETCH) { load_row(); advance(true); }
    unsigned hb[WORDS], gb[WORDS], rb[GRES ? WORDS : 1];
#pragma unroll
    for (int k = 0; k < WORDS; ++k) {
      hb[k] = hn[k];
      gb[k] = gn[k];
      if constexpr (GRES) rb[k] = rn[k];
    }
    if (PREFETCH) { advance(row + 1 < row_end); load_row(); }
    const float r = rstd[row];
    float xk[KEEP ? E : 1], gk[KEEP ? E : 1];
    if constexpr (KEEP) {
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const float gf = elem_f32<T>(gb, k);
        xk[k] = __fmul_rn(r, elem_f32<T>(hb, k));
        gk[k] = __fmul_rn(wk[k], gf);
        // dW's fold here, not after the row's reduction: the same fma on the same operands in the same
        // row order (so the same bits), g converted once, and independent work beside the shuffles
        dw[k] = __fmaf_rn(xk[k], gf, dw[k]);  // stored only with_dw
      }
    }
    auto xhat = [&](int k) {
      if constexpr (KEEP) return xk[k];
      else return __fmul_rn(r, elem_f32<T>(hb, k));
    };
    auto gw = [&](int k) {
      if constexpr (KEEP) return gk[k];
      else return __fmul_rn(__fadd_rn(weight_offset, elem_f32<T>(wb, k)), elem_f32<T>(gb, k));
    };
    float s = __fmaf_rn(gw(0), xhat(0), 0.0f);
    if constexpr (E > 1) {
      s = __fadd_rn(s, __fmaf_rn(gw(1), xhat(1), 0.0f));
#pragma unroll
      for (int k = 2; k < E; ++k) s = __fadd_rn(__fmaf_rn(gw(k), xhat(k), 0.0f), s);
    }
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, d));
    float* sums = warp_sums[(row - row0) & 1];
    if ((t & 31) == 0) sums[t >> 5] = s;
    __syncthreads();
    s = across_warps<WARPS>(sums, t);
    const float c_mean = __fdiv_rn(s, h_count);
    T* dxr = dx + row * (int64_t)H;
    T* drr = dres + row * (int64_t)H;
    const bool dx_ok = FULL || aligned_for(dxr, VEC);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      unsigned b[VWORDS];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int k = c * VEC + j;
        float dh = __fmaf_rn(-xhat(k), c_mean, gw(k));
        if constexpr (GRES) dh = __fmaf_rn(dh, r, elem_f32<T>(rb, k));
        else dh = __fmul_rn(dh, r);
        set_elem<T>(b, j, from_f32(T(), dh));
      }
      const int lane0 = c * VEC * THREADS + t * VEC;
      store_lanes<T, VEC, FULL, BWD_STREAM>(dxr, lane0, H, dx_ok, b);
      if constexpr (DRES) store_lanes<T, VEC, FULL, BWD_STREAM>(drr, lane0, H, dx_ok, b);
    }
    if (with_dw && !KEEP) {
#pragma unroll
      for (int k = 0; k < E; ++k) dw[k] = __fmaf_rn(xhat(k), elem_f32<T>(gb, k), dw[k]);
    }
  }
  if (with_dw) {
    float* part = partial + (int64_t)blockIdx.x * H;
    if constexpr (FULL) {  // H is the tile: a thread's VEC lanes are in the row and 16-byte aligned
      constexpr int F = VEC < 4 ? VEC : 4;  // floats a store
      using A = typename Access<F * 4>::type;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
        for (int j = 0; j < VEC; j += F) {
          unsigned bits[F];
#pragma unroll
          for (int i = 0; i < F; ++i) bits[i] = __float_as_uint(dw[c * VEC + j + i]);
          A v;
          pack(v, bits);
          *reinterpret_cast<A*>(part + c * VEC * THREADS + t * VEC + j) = v;
        }
    } else {
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int lane = c * VEC * THREADS + t * VEC + j;
          if (lane < H) part[lane] = dw[c * VEC + j];
        }
    }
  }
}

// dW = the sum of the blocks' partial rows: _dw_reduce_kernel with the locked "rmsnorm_dw_reduce"
// (128 partials per lane tile, 4 warps) and 16 columns per block. Its layout (Triton 3.6's sm90 PTX):
// CV columns per thread, 4 when H is a multiple of 16 (the JIT's divisibility: 16-byte rows), else 1;
// TC = 16 / CV threads across the columns, so a warp spans TR = 32 / TC partial rows and the 4 warps
// RT = 4 * TR; thread (warp, lane) owns partial rows b = warp * TR + lane / TC + s * RT, s = 0 .. S - 1
// (S = 128 / RT) of every group of 128. Order:
//   1. acc[s] += partial[group * 128 + b] for the groups in increasing order (+0 past the last row);
//   2. per thread, acc[0] + acc[1], then acc[s] + that for s = 2 .. S - 1;
//   3. butterfly adds over the lanes of a column, shuffle distances 16 .. TC;
//   4. the 4 warps' sums: (w0 + w2) + (w1 + w3) (Triton's butterfly 2, 1 over them in shared memory);
//   5. rounded once to the weight's dtype.
template <typename T, int CV>
__global__ void __launch_bounds__(128) rms_norm_dw_reduce_kernel(const float* __restrict__ partial, T* __restrict__ dw,
                                                               int64_t n_blocks, int H) {
  constexpr int TC = 16 / CV, TR = 32 / TC, RT = 4 * TR, S = 128 / RT;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int col0 = blockIdx.x * 16 + (lane % TC) * CV;
  const int64_t b0 = warp * TR + lane / TC;
  float acc[S][CV];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int c = 0; c < CV; ++c) acc[s][c] = 0.0f;
  for (int64_t group = 0; group < n_blocks; group += 128) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int64_t b = group + b0 + s * RT;
#pragma unroll
      for (int c = 0; c < CV; ++c) {
        const float v = b < n_blocks && col0 + c < H ? partial[b * H + col0 + c] : 0.0f;
        acc[s][c] = __fadd_rn(acc[s][c], v);
      }
    }
  }
  __shared__ float warp_sums[4][16];
#pragma unroll
  for (int c = 0; c < CV; ++c) {
    float v = __fadd_rn(acc[0][c], acc[1][c]);
#pragma unroll
    for (int s = 2; s < S; ++s) v = __fadd_rn(acc[s][c], v);
#pragma unroll
    for (int d = 16; d >= TC; d >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, d));
    if (lane < TC) warp_sums[warp][lane * CV + c] = v;
  }
  __syncthreads();
  if (t < 16 && blockIdx.x * 16 + t < H) {
    const float sum = __fadd_rn(__fadd_rn(warp_sums[0][t], warp_sums[2][t]), __fadd_rn(warp_sums[1][t], warp_sums[3][t]));
    reinterpret_cast<typename Bits<T>::type*>(dw)[blockIdx.x * 16 + t] = (typename Bits<T>::type)from_f32(T(), sum);
  }
}

struct BwdArgs {
  const void* g; const void* gres; const void* h; int64_t h_row_stride; const void* w; const float* rstd;
  void* dx; void* dres; float* partial; void* dw; int64_t N; int H; float weight_offset; int rows_per_block;
  cudaStream_t stream;
};

template <typename T, int E, int WARPS, bool FULL, bool GRES, bool DRES>
int launch_bwd_rows(const BwdArgs& a) {
  constexpr int VEC = full_vec<T, E>();
  const int64_t n_blocks = (a.N + a.rows_per_block - 1) / a.rows_per_block;
  rms_norm_bwd_kernel<T, E, VEC, WARPS, FULL, GRES, DRES><<<(unsigned)n_blocks, WARPS * 32, 0, a.stream>>>(
      (const T*)a.g, (const T*)a.gres, (const T*)a.h, a.h_row_stride, (const T*)a.w, a.rstd, (T*)a.dx,
      (T*)(a.dres ? a.dres : a.dx), a.partial, a.N, a.H, (float)a.H, a.weight_offset, a.rows_per_block,
      a.partial != nullptr);
  if (a.partial) {
    const unsigned blocks = (unsigned)((a.H + 15) / 16);
    if (a.H % 16 == 0)
      rms_norm_dw_reduce_kernel<T, 4><<<blocks, 128, 0, a.stream>>>(a.partial, (T*)a.dw, n_blocks, a.H);
    else
      rms_norm_dw_reduce_kernel<T, 1><<<blocks, 128, 0, a.stream>>>(a.partial, (T*)a.dw, n_blocks, a.H);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

// GRES / DRES: the residual_out gradient is read / the residual's gradient written. Both are template
// flags, not runtime ones: a runtime d residual store made the compiler keep two copies of the store
// path and issue the next row's loads after the row's first shuffles, not before them.
template <typename T, int E, int WARPS, bool FULL>
int launch_bwd_flags(const BwdArgs& a) {
  if (a.gres)
    return a.dres ? launch_bwd_rows<T, E, WARPS, FULL, true, true>(a) : launch_bwd_rows<T, E, WARPS, FULL, true, false>(a);
  return a.dres ? launch_bwd_rows<T, E, WARPS, FULL, false, true>(a)
                : launch_bwd_rows<T, E, WARPS, FULL, false, false>(a);
}

template <typename T, int E, int WARPS>
int launch_bwd_layout(const BwdArgs& a) {
  constexpr int VEC = full_vec<T, E>();
  // FULL: every lane of the tile is in the row and every row start is vector-aligned (h's; g, dx, d
  // residual are [N, H] with H the tile)
  const bool full = a.H == E * WARPS * 32 && a.h_row_stride % VEC == 0;
  return full ? launch_bwd_flags<T, E, WARPS, true>(a) : launch_bwd_flags<T, E, WARPS, false>(a);
}

template <typename T>
int launch_bwd_dtype(const BwdArgs& a, int block_h, int num_warps) {
  const int e = block_h / (num_warps * 32);
#define RLK_CFG(W, E) \
  if (num_warps == W && e == E) return launch_bwd_layout<T, E, W>(a);
  RLK_CFG(4, 1) RLK_CFG(4, 2) RLK_CFG(4, 4) RLK_CFG(4, 8)
  RLK_CFG(8, 8) RLK_CFG(8, 16) RLK_CFG(8, 32)
  RLK_CFG(16, 32)
#undef RLK_CFG
  return 1;
}

}  // namespace

// dtype: 0 float32, 1 float16, 2 bfloat16. residual / res_out: the fused add's input and output (both
// null without it; res_out is [N, H], contiguous). vec: the Triton layout's lanes per vector; rows: rows
// per block (1 or 2). Returns 0 on success, 1 for a (block_h, num_warps, vec, rows) this kernel does not
// implement or x / residual / w not 16-byte aligned (the layout rule is only known for aligned rows; the
// caller refuses the call), 2 for a CUDA launch error.
extern "C" int rlk_rms_norm_fwd(int dtype, const void* x, int64_t x_row_stride, const void* residual,
                                int64_t res_row_stride, const void* w, void* y, void* res_out, float* rstd,
                                int64_t N, int H, int block_h, int num_warps, int vec, int rows,
                                float eps, float weight_offset, void* stream_ptr) {
  const FwdArgs a{x, x_row_stride, residual, res_row_stride, w, y, res_out, rstd, N, H, eps, weight_offset,
                  reinterpret_cast<cudaStream_t>(stream_ptr)};
  if (N == 0) return 0;
  if (block_h < H || block_h % (num_warps * 32) != 0) return 1;
  if ((residual == nullptr) != (res_out == nullptr)) return 1;
  for (const void* p : {x, w, residual})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  switch (dtype) {
    case 0: return launch_dtype<float>(a, block_h, num_warps, vec, rows);
    case 1: return launch_dtype<__half>(a, block_h, num_warps, vec, rows);
    case 2: return launch_dtype<__nv_bfloat16>(a, block_h, num_warps, vec, rows);
    default: return 1;
  }
}

// The backward of rows [N, H]: dx (and d residual, a second copy, when dres is not null) and, when
// partial is not null, dW through the [ceil(N / rows_per_block), H] fp32 partial rows into dw (the
// weight's dtype, x's here). grad_res: the gradient of residual_out, or null. g, grad_res, dx, dres:
// contiguous [N, H]; h: the forward's normalized input, unit stride along H. block_h / num_warps: the
// locked "rmsnorm_bwd" tile; rows_per_block: "rmsnorm_dw_rows". Returns 0, 1 for a layout this file
// does not implement or g / h / w not 16-byte aligned, 2 for a CUDA launch error.
extern "C" int rlk_rms_norm_bwd(int dtype, const void* g, const void* grad_res, const void* h, int64_t h_row_stride,
                                const void* w, const float* rstd, void* dx, void* dres, float* partial, void* dw,
                                int64_t N, int H, int block_h, int num_warps, int rows_per_block, float weight_offset,
                                void* stream_ptr) {
  const BwdArgs a{g, grad_res, h, h_row_stride, w, rstd, dx, dres, partial, dw, N, H, weight_offset, rows_per_block,
                  reinterpret_cast<cudaStream_t>(stream_ptr)};
  if (N == 0) return 0;
  if (block_h < H || block_h % (num_warps * 32) != 0 || rows_per_block < 1) return 1;
  for (const void* p : {g, h, w, grad_res})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  switch (dtype) {
    case 0: return launch_bwd_dtype<float>(a, block_h, num_warps);
    case 1: return launch_bwd_dtype<__half>(a, block_h, num_warps);
    case 2: return launch_bwd_dtype<__nv_bfloat16>(a, block_h, num_warps);
    default: return 1;
  }
}
