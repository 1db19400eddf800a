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
extern "C" int rlk_rms_norm_bwd(int dtype, const void* g, const void* grad_res, const void* h, int64_t h_row_stride,
                                const void* w, const float* rstd, void* dx, void* dres, float* partial, void* dw,
                                int64_t N, int H, int block_h, int num_warps, int rows_per_block, float weight_offset,
                                void* stream);

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

// (dx, dw, d residual): launch_backward's outputs (dw and d residual empty unless asked for).
std::vector<at::Tensor> rms_norm_bwd(const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_res,
                                     const at::Tensor& h, const at::Tensor& weight, const at::Tensor& rstd,
                                     double weight_offset, bool with_dw, bool with_dres, int64_t block_h,
                                     int64_t num_warps, int64_t rows_per_block, int64_t stream) {
  TORCH_CHECK(h.is_cuda() && h.dim() == 2 && h.stride(1) == 1, "rlk native rms_norm: h must be [N, H] on CUDA, unit "
              "stride along H");
  const int64_t N = h.size(0), H = h.size(1);
  TORCH_CHECK(grad_y.is_cuda() && grad_y.is_contiguous() && grad_y.sizes() == h.sizes() &&
              grad_y.scalar_type() == h.scalar_type(), "rlk native rms_norm: grad_y must be h's shape and dtype, contiguous");
  const at::Tensor* gr = grad_res.has_value() ? &grad_res.value() : nullptr;
  if (gr) {
    TORCH_CHECK(gr->is_cuda() && gr->is_contiguous() && gr->sizes() == h.sizes() && gr->scalar_type() == h.scalar_type(),
                "rlk native rms_norm: grad_residual must be h's shape and dtype, contiguous");
  }
  TORCH_CHECK(weight.is_cuda() && weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == H &&
              weight.scalar_type() == h.scalar_type(), "rlk native rms_norm: weight must be [H], h's dtype, contiguous");
  TORCH_CHECK(rstd.is_cuda() && rstd.scalar_type() == at::kFloat && rstd.is_contiguous() && rstd.numel() == N,
              "rlk native rms_norm: rstd must be float32 [N], contiguous");
  auto dx = at::empty({N, H}, h.options());
  auto dres = at::empty({with_dres ? N : 0, with_dres ? H : 0}, h.options());
  auto dw = with_dw ? (N == 0 ? at::zeros_like(weight) : at::empty_like(weight)) : at::empty({0}, weight.options());
  const int64_t n_blocks = rows_per_block > 0 ? (N + rows_per_block - 1) / rows_per_block : 0;
  auto partial = at::empty({with_dw ? n_blocks : 0, with_dw ? H : 0}, h.options().dtype(at::kFloat));
  const int rc = rlk_rms_norm_bwd(dtype_code(h), grad_y.data_ptr(), gr ? gr->data_ptr() : nullptr, h.data_ptr(),
                                  h.stride(0), weight.data_ptr(), rstd.data_ptr<float>(), dx.data_ptr(),
                                  with_dres ? dres.data_ptr() : nullptr, with_dw ? partial.data_ptr<float>() : nullptr,
                                  with_dw ? dw.data_ptr() : nullptr, N, (int)H, (int)block_h, (int)num_warps,
                                  (int)rows_per_block, (float)weight_offset, reinterpret_cast<void*>(stream));
  TORCH_CHECK(rc != 1, "rlk native rms_norm: no backward kernel for block_h ", block_h, " with ", num_warps,
              " warps and ", rows_per_block, " rows per dW partial, or grad_y / grad_residual / h / weight not "
              "16-byte aligned");
  TORCH_CHECK(rc == 0, "rlk native rms_norm: CUDA launch failed");
  return {dx, dw, dres};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm_fwd", &rms_norm_fwd, "rms_norm forward with an optional fused residual add (the Triton kernel's order)");
  m.def("rms_norm_bwd", &rms_norm_bwd, "rms_norm backward: dx, dW through fixed row-block partials (the Triton kernels' order)");
}
