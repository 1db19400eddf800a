// torch bindings of the native kernels (built by rlk_triton/native.py with torch.utils.cpp_extension,
// only where a CUDA torch and nvcc exist). Shapes, dtypes and the launch config are checked in Python;
// these functions check only what would otherwise be undefined behaviour.
// Only torch/extension.h: no CUDA headers, so CI (a CPU torch) can check this file's syntax. The
// caller passes the current CUDA stream as an integer (torch.cuda.current_stream().cuda_stream).
#include <torch/extension.h>

extern "C" int rlk_rms_norm_fwd(int dtype, const void* x, int64_t x_row_stride, const void* residual,
                                int64_t res_row_stride, const void* w, void* y, void* res_out, float* rstd,
                                int64_t N, int H, int block_h, int num_warps, int vec, int rows,
                                float eps, float weight_offset, void* stream);

static int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default: TORCH_CHECK(false, "rlk native rms_norm: dtype ", t.scalar_type(), " is not float32/float16/bfloat16");
  }
  return -1;
}

// (y, residual_out, rstd); residual_out is empty without a residual.
std::vector<at::Tensor> rms_norm_fwd(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                                     const at::Tensor& weight, double eps, double weight_offset, int64_t block_h,
                                     int64_t num_warps, int64_t vec, int64_t rows, int64_t stream) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "rlk native rms_norm: CUDA tensors only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rlk native rms_norm: x must be [N, H] with unit stride along H");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1) &&
              weight.scalar_type() == x.scalar_type(), "rlk native rms_norm: weight must be [H], x's dtype, contiguous");
  const int64_t N = x.size(0), H = x.size(1);
  const at::Tensor* r = residual.has_value() ? &residual.value() : nullptr;
  if (r) {
    TORCH_CHECK(r->is_cuda() && r->dim() == 2 && r->size(0) == N && r->size(1) == H && r->stride(1) == 1 &&
                r->scalar_type() == x.scalar_type(), "rlk native rms_norm: residual must be x's shape and dtype, "
                "unit stride along H");
  }
  auto y = at::empty({N, H}, x.options());
  auto res_out = at::empty({r ? N : 0, r ? H : 0}, x.options());
  auto rstd = at::empty({N}, x.options().dtype(at::kFloat));
  const int rc = rlk_rms_norm_fwd(dtype_code(x), x.data_ptr(), x.stride(0), r ? r->data_ptr() : nullptr,
                                  r ? r->stride(0) : 0, weight.data_ptr(), y.data_ptr(),
                                  r ? res_out.data_ptr() : nullptr, rstd.data_ptr<float>(), N, (int)H, (int)block_h,
                                  (int)num_warps, (int)vec, (int)rows, (float)eps, (float)weight_offset,
                                  reinterpret_cast<void*>(stream));
  TORCH_CHECK(rc != 1, "rlk native rms_norm: no kernel for block_h ", block_h, " with ", num_warps, " warps, vec ", vec,
              ", ", rows, " rows per block, or x / residual / weight not 16-byte aligned");
  TORCH_CHECK(rc == 0, "rlk native rms_norm: CUDA launch failed");
  return {y, res_out, rstd};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm_fwd", &rms_norm_fwd, "rms_norm forward with an optional fused residual add (the Triton kernel's order)");
}
