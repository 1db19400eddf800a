// torch bindings of the native selected_logp forward and backward (built by rlk_triton/native.py with
// torch.utils.cpp_extension, only where a CUDA torch and nvcc exist). Shapes, dtypes, values and the
// launch config are checked in Python; this file checks only what would otherwise be undefined
// behaviour. Only torch/extension.h: CI (a CPU torch) checks this file's syntax.
#include <torch/extension.h>

extern "C" int rlk_selected_logp_fwd(int dtype, const void* logits, int64_t stride_outer, int64_t stride_inner,
                                     int64_t inner_size, const void* target, const void* row_index, int index_32,
                                     const float* temperature_rows, float temperature, float* logp, float* entropy,
                                     float* row_max, float* row_logsum, float* state, int64_t V,
                                     int64_t ignore_index, int n_rows, int n_chunks, int64_t total_rows,
                                     int block_v, int chunk_v, int vec, void* stream);

extern "C" int rlk_selected_logp_bwd(int dtype, const void* logits, int64_t stride, const void* target,
                                     const void* row_index, int index_32, const float* temperature_rows,
                                     float temperature, const float* row_max, const float* row_logsum,
                                     const float* entropy, const float* grad_logp, const float* grad_entropy,
                                     void* grad, int64_t V, int64_t ignore_index, int n_rows, int64_t total_rows,
                                     int vec, void* stream);

static bool is_index(const at::Tensor& t) {
  return t.is_cuda() && t.dim() == 1 && t.is_contiguous() &&
         (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt);
}

// (logp, entropy, row_max, row_logsum) for logits [rows, V] (unit stride along V) and n = target.numel()
// scored rows; entropy is empty without with_entropy.
std::vector<at::Tensor> selected_logp_fwd(const at::Tensor& logits, const at::Tensor& target,
                                          const std::optional<at::Tensor>& row_index,
                                          const std::optional<at::Tensor>& temperature_rows, double temperature,
                                          int64_t ignore_index, bool with_entropy, int64_t block_v, int64_t chunk_v,
                                          int64_t vec, int64_t stream) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1,
              "rlk native selected_logp: logits must be CUDA [rows, V] with unit stride along V");
  int dtype = -1;
  switch (logits.scalar_type()) {
    case at::kFloat: dtype = 0; break;
    case at::kHalf: dtype = 1; break;
    case at::kBFloat16: dtype = 2; break;
    default: TORCH_CHECK(false, "rlk native selected_logp: logits dtype ", logits.scalar_type(), " is not supported");
  }
  TORCH_CHECK(is_index(target), "rlk native selected_logp: target must be a contiguous 1-D int32/int64 CUDA tensor");
  const int64_t n = target.numel(), V = logits.size(1);
  TORCH_CHECK(chunk_v > 0 && block_v > 0, "rlk native selected_logp: bad tile widths");
  const at::Tensor* ri = row_index.has_value() ? &row_index.value() : nullptr;
  const at::Tensor* tr = temperature_rows.has_value() ? &temperature_rows.value() : nullptr;
  TORCH_CHECK(!ri || (is_index(*ri) && ri->numel() == n), "rlk native selected_logp: row_index must match target");
  TORCH_CHECK(ri || logits.size(0) >= n, "rlk native selected_logp: fewer logits rows than targets");
  TORCH_CHECK(!tr || (tr->is_cuda() && tr->scalar_type() == at::kFloat && tr->is_contiguous() && tr->numel() == n),
              "rlk native selected_logp: temperature_rows must be float32 [n], contiguous");
  const int64_t n_chunks = std::max<int64_t>((V + chunk_v - 1) / chunk_v, 1);
  auto f32 = logits.options().dtype(at::kFloat);
  auto logp = at::empty({n}, f32), row_max = at::empty({n}, f32), row_logsum = at::empty({n}, f32);
  auto entropy = at::empty({with_entropy ? n : 0}, f32);
  auto state = at::empty({n_chunks > 1 ? (with_entropy ? 3 : 2) * n * n_chunks : 0}, f32);
  const int index_32 = (target.scalar_type() == at::kInt ? 1 : 0) | (ri && ri->scalar_type() == at::kInt ? 2 : 0);
  const int rc = rlk_selected_logp_fwd(
      dtype, logits.data_ptr(), logits.stride(0), 0, 1, target.data_ptr(), ri ? ri->data_ptr() : nullptr, index_32,
      tr ? tr->data_ptr<float>() : nullptr, (float)temperature, logp.data_ptr<float>(),
      with_entropy ? entropy.data_ptr<float>() : nullptr, row_max.data_ptr<float>(), row_logsum.data_ptr<float>(),
      n_chunks > 1 ? state.data_ptr<float>() : nullptr, V, ignore_index, (int)n, (int)n_chunks, logits.size(0),
      (int)block_v, (int)chunk_v, (int)vec, reinterpret_cast<void*>(stream));
  TORCH_CHECK(rc != 1, "rlk native selected_logp: no kernel for block_v ", block_v, ", vec ", vec, ", ", n_chunks,
              " chunks");
  TORCH_CHECK(rc == 0, "rlk native selected_logp: CUDA launch failed");
  return {logp, entropy, row_max, row_logsum};
}

static bool is_rows(const at::Tensor& t, int64_t n) {
  return t.is_cuda() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous() && t.numel() == n;
}

// d logits [rows, V] in the logits' dtype, contiguous: zeros on rows not scored when row_index is given.
at::Tensor selected_logp_bwd(const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy,
                             const at::Tensor& logits, const at::Tensor& target,
                             const std::optional<at::Tensor>& row_index,
                             const std::optional<at::Tensor>& temperature_rows, double temperature,
                             int64_t ignore_index, const at::Tensor& row_max, const at::Tensor& row_logsum,
                             const at::Tensor& entropy, int64_t vec, int64_t stream) {
  TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1,
              "rlk native selected_logp: logits must be CUDA [rows, V] with unit stride along V");
  const int dtype = logits.scalar_type() == at::kFloat ? 0 : logits.scalar_type() == at::kHalf ? 1
                    : logits.scalar_type() == at::kBFloat16 ? 2 : -1;
  TORCH_CHECK(dtype >= 0, "rlk native selected_logp: logits dtype ", logits.scalar_type(), " is not supported");
  TORCH_CHECK(is_index(target), "rlk native selected_logp: target must be a contiguous 1-D int32/int64 CUDA tensor");
  const int64_t n = target.numel(), V = logits.size(1), rows = logits.size(0);
  const at::Tensor* ri = row_index.has_value() ? &row_index.value() : nullptr;
  const at::Tensor* tr = temperature_rows.has_value() ? &temperature_rows.value() : nullptr;
  const at::Tensor* ge = grad_entropy.has_value() ? &grad_entropy.value() : nullptr;
  TORCH_CHECK(!ri || (is_index(*ri) && ri->numel() == n), "rlk native selected_logp: row_index must match target");
  TORCH_CHECK(ri || rows >= n, "rlk native selected_logp: fewer logits rows than targets");
  TORCH_CHECK(!tr || is_rows(*tr, n), "rlk native selected_logp: temperature_rows must be float32 [n], contiguous");
  TORCH_CHECK(is_rows(grad_logp, n) && is_rows(row_max, n) && is_rows(row_logsum, n) && (!ge || (is_rows(*ge, n) &&
              is_rows(entropy, n))), "rlk native selected_logp: row tensors must be float32 [n], contiguous");
  auto grad = ri ? at::zeros({rows, V}, logits.options()) : at::empty({rows, V}, logits.options());
  const int index_32 = (target.scalar_type() == at::kInt ? 1 : 0) | (ri && ri->scalar_type() == at::kInt ? 2 : 0);
  const int rc = rlk_selected_logp_bwd(
      dtype, logits.data_ptr(), logits.stride(0), target.data_ptr(), ri ? ri->data_ptr() : nullptr, index_32,
      tr ? tr->data_ptr<float>() : nullptr, (float)temperature, row_max.data_ptr<float>(),
      row_logsum.data_ptr<float>(), ge ? entropy.data_ptr<float>() : nullptr, grad_logp.data_ptr<float>(),
      ge ? ge->data_ptr<float>() : nullptr, grad.data_ptr(), V, ignore_index, (int)n, rows, (int)vec,
      reinterpret_cast<void*>(stream));
  TORCH_CHECK(rc != 1, "rlk native selected_logp: no backward kernel for vec ", vec);
  TORCH_CHECK(rc == 0, "rlk native selected_logp: CUDA launch failed");
  return grad;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("selected_logp_fwd", &selected_logp_fwd, "selected_logp forward (the Triton kernels' order)");
  m.def("selected_logp_bwd", &selected_logp_bwd, "selected_logp backward: d logits (the Triton kernel's arithmetic)");
}
