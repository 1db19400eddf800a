// rms_norm forward (no residual), written to give the Triton kernel's bits: rlk_triton/ops/rmsnorm.py
// _fwd_kernel's one-tile path (and _fwd_rows_kernel, whose rows use the same per-row layout), with
// the locked config's BLOCK_H lanes and num_warps (rlk_triton/configs.py "rmsnorm_fwd").
//
// The order is Triton 3.6's (the GPU machine's), read from the kernel's sm90 PTX compiled with the 3.6
// wheel (blocked layout: sizePerThread 1, 32 threads per warp, num_warps warps, so thread t holds
// lanes t + k * threads, k = 0 .. E - 1):
//   1. per thread, a chain in k order with each product contracted into the add:
//        acc = fma(h0, h0, h1 * h1), then acc = fma(hk, hk, acc) for k = 2 .. E - 1;
//      with E = 1 the product is contracted into the first shuffle's add instead:
//        s = fma(h0, h0, shfl_xor(h0 * h0, 16))   (lanes then hold different sums: lane 0's counts);
//   2. per warp, butterfly adds with shuffle distances 16 (unless taken by 1.), 8, 4, 2, 1;
//   3. across warps: lane 0's sum of each warp to shared memory, then butterfly adds of those sums
//      with distances num_warps / 2 .. 1 (symmetric adds: every lane gets lane 0's result);
//   4. rstd = 1 / sqrt_rn(sum / H + eps) with IEEE division and square root; y = (rstd * h) * (w +
//      weight_offset), rounded once to the output dtype. Masked lanes hold 0 and add exact zeros.
// Triton 3.9 reduces within a thread in a pairwise tree instead: these bits are 3.6's, and the
// admission fingerprint carries the triton version. Every operation is an explicit _rn intrinsic
// (also built with --fmad=false). `rlk-triton native admit` checks the bits on the GPU.
// No torch headers: CI compiles this file for sm_90a with nvcc alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Step 1 for E >= 2: the sum of squares of a thread's lanes, chained in lane order.
template <int E>
__device__ __forceinline__ float chain_squares(const float* h) {
  float acc = __fmaf_rn(h[0], h[0], __fmul_rn(h[1], h[1]));
#pragma unroll
  for (int k = 2; k < E; ++k) acc = __fmaf_rn(h[k], h[k], acc);
  return acc;
}

template <typename T, int E, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) rms_norm_fwd_kernel(
    const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ w, T* __restrict__ y,
    float* __restrict__ rstd_out, int H, float h_count, float eps, float weight_offset) {
  constexpr int THREADS = WARPS * 32;
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x;
  const T* xr = x + row * x_row_stride;
  float h[E];
#pragma unroll
  for (int k = 0; k < E; ++k) {
    const int lane = t + k * THREADS;
    h[k] = lane < H ? to_f32(xr[lane]) : 0.0f;
  }
  float s;
  if constexpr (E == 1) {
    s = __fmaf_rn(h[0], h[0], __shfl_xor_sync(0xffffffffu, __fmul_rn(h[0], h[0]), 16));
  } else {
    s = chain_squares<E>(h);
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 16));
  }
#pragma unroll
  for (int d = 8; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, d));
  __shared__ float warp_sums[WARPS];
  if ((t & 31) == 0) warp_sums[t >> 5] = s;
  __syncthreads();
  s = warp_sums[(t & 31) % WARPS];
#pragma unroll
  for (int d = WARPS / 2; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, d));
  const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, h_count), eps)));
  T* yr = y + row * (int64_t)H;
#pragma unroll
  for (int k = 0; k < E; ++k) {
    const int lane = t + k * THREADS;
    if (lane < H) {
      const float wk = __fadd_rn(to_f32(w[lane]), weight_offset);
      yr[lane] = from_f32<T>(__fmul_rn(__fmul_rn(rstd, h[k]), wk));
    }
  }
  if (t == 0) rstd_out[row] = rstd;
}

template <typename T, int WARPS>
int launch_warps(const void* x, int64_t stride, const void* w, void* y, float* rstd, int64_t N, int H,
                 int block_h, float eps, float weight_offset, cudaStream_t stream) {
  const int e = block_h / (WARPS * 32);
  const float h_count = (float)H;
  const T* xx = (const T*)x;
  const T* ww = (const T*)w;
  T* yy = (T*)y;
#define RLK_E(E)                                                                                        \
  case E:                                                                                               \
    rms_norm_fwd_kernel<T, E, WARPS><<<(unsigned)N, WARPS * 32, 0, stream>>>(xx, stride, ww, yy, rstd, H, \
                                                                            h_count, eps, weight_offset); \
    break;
  switch (e) {
    RLK_E(1) RLK_E(2) RLK_E(4) RLK_E(8) RLK_E(16) RLK_E(32) RLK_E(64)
    default:
      return 1;  // not a layout this kernel has
  }
#undef RLK_E
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

template <typename T>
int launch_dtype(const void* x, int64_t stride, const void* w, void* y, float* rstd, int64_t N, int H,
                 int block_h, int num_warps, float eps, float weight_offset, cudaStream_t stream) {
  switch (num_warps) {
    case 4: return launch_warps<T, 4>(x, stride, w, y, rstd, N, H, block_h, eps, weight_offset, stream);
    case 8: return launch_warps<T, 8>(x, stride, w, y, rstd, N, H, block_h, eps, weight_offset, stream);
    case 16: return launch_warps<T, 16>(x, stride, w, y, rstd, N, H, block_h, eps, weight_offset, stream);
    default: return 1;
  }
}

}  // namespace

// dtype: 0 float32, 1 float16, 2 bfloat16. Returns 0 on success, 1 for a (block_h, num_warps) this
// kernel does not implement (the caller refuses the call), 2 for a CUDA launch error.
extern "C" int rlk_rms_norm_fwd(int dtype, const void* x, int64_t x_row_stride, const void* w, void* y,
                                float* rstd, int64_t N, int H, int block_h, int num_warps, float eps,
                                float weight_offset, void* stream_ptr) {
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_ptr);
  if (N == 0) return 0;
  if (block_h < H || block_h % (num_warps * 32) != 0) return 1;
  switch (dtype) {
    case 0: return launch_dtype<float>(x, x_row_stride, w, y, rstd, N, H, block_h, num_warps, eps, weight_offset, stream);
    case 1: return launch_dtype<__half>(x, x_row_stride, w, y, rstd, N, H, block_h, num_warps, eps, weight_offset, stream);
    case 2: return launch_dtype<__nv_bfloat16>(x, x_row_stride, w, y, rstd, N, H, block_h, num_warps, eps, weight_offset, stream);
    default: return 1;
  }
}
