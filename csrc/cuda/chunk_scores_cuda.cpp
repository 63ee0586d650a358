// CUDA implementation of specextend::chunk_scores (the schema is defined in
// csrc/cpu/chunk_scores.cpp, built into specextend_vllm._C).
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>

extern "C" cudaError_t specextend_chunk_scores_cuda(
    const float* query, const void* key_cache, int key_dtype,
    int64_t key_stride_block, int64_t key_stride_token, int64_t key_stride_head,
    int64_t key_stride_dim, const int32_t* block_table,
    int64_t block_table_stride, const int32_t* context_lens, int batch,
    int num_q_heads, int num_kv_heads, int head_dim, int block_size,
    int max_tokens, int chunk_size, int num_chunks, float scale,
    float* scratch, float* scores, cudaStream_t stream);

namespace specextend {
namespace {

int key_dtype_code(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return 0;
    case at::kHalf:
      return 1;
    case at::kBFloat16:
      return 2;
    default:
      TORCH_CHECK(false,
                  "chunk_scores: key_cache must be float32, float16 or "
                  "bfloat16, got ",
                  dtype);
  }
}

int checked_int(int64_t value, const char* name) {
  TORCH_CHECK(value >= 0 && value <= std::numeric_limits<int>::max(),
              "chunk_scores: ", name, " = ", value, " does not fit in int32");
  return static_cast<int>(value);
}

// Context lengths and block ids are not validated here: that would need a
// device-to-host copy. Context lengths are clamped to the block table capacity.
at::Tensor chunk_scores_cuda(const at::Tensor& query,
                             const at::Tensor& key_cache,
                             const at::Tensor& block_table,
                             const at::Tensor& context_lens, int64_t chunk_size,
                             double scale, int64_t num_chunks) {
  TORCH_CHECK(query.dim() == 3, "chunk_scores: query must be [B, Hq, D], got ",
              query.sizes());
  TORCH_CHECK(key_cache.dim() == 4,
              "chunk_scores: key_cache must be a [num_blocks, block_size, "
              "num_kv_heads, head_dim] view, got ",
              key_cache.sizes());
  TORCH_CHECK(block_table.dim() == 2 && block_table.scalar_type() == at::kInt,
              "chunk_scores: block_table must be a 2-D int32 tensor");
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.scalar_type() == at::kInt,
              "chunk_scores: context_lens must be a 1-D int32 tensor");
  TORCH_CHECK(query.scalar_type() == at::kFloat ||
                  query.scalar_type() == at::kHalf ||
                  query.scalar_type() == at::kBFloat16,
              "chunk_scores: query must be float32, float16 or bfloat16, got ",
              query.scalar_type());
  for (const at::Tensor* tensor : {&key_cache, &block_table, &context_lens}) {
    TORCH_CHECK(tensor->device() == query.device(),
                "chunk_scores: all inputs must be on ", query.device(),
                ", got a tensor on ", tensor->device());
  }
  const int64_t batch = query.size(0);
  const int64_t num_q_heads = query.size(1);
  const int64_t head_dim = query.size(2);
  const int64_t block_size = key_cache.size(1);
  const int64_t num_kv_heads = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == head_dim,
              "chunk_scores: key_cache head_dim ", key_cache.size(3),
              " does not match query head_dim ", head_dim);
  TORCH_CHECK(num_kv_heads > 0 && num_q_heads % num_kv_heads == 0,
              "chunk_scores: num query heads ", num_q_heads,
              " must be a multiple of num kv heads ", num_kv_heads);
  TORCH_CHECK(block_table.size(0) == batch && context_lens.size(0) == batch,
              "chunk_scores: block_table and context_lens must have batch size ",
              batch);
  TORCH_CHECK(block_table.size(1) >= 1,
              "chunk_scores: block_table must have at least one column");
  TORCH_CHECK(chunk_size > 0, "chunk_scores: chunk_size must be positive, got ",
              chunk_size);
  TORCH_CHECK(num_chunks >= 0, "chunk_scores: num_chunks must be >= 0, got ",
              num_chunks);

  const c10::cuda::CUDAGuard device_guard(query.device());
  const at::Tensor query_f32 = query.to(at::kFloat).contiguous();
  const at::Tensor block_table_c = block_table.contiguous();
  const at::Tensor context_lens_c = context_lens.contiguous();
  const int64_t max_tokens = std::min(block_table.size(1) * block_size,
                                      num_chunks * chunk_size);
  const at::TensorOptions float_options = query.options().dtype(at::kFloat);
  at::Tensor scratch =
      at::empty({batch * num_q_heads * (max_tokens + 2)}, float_options);
  at::Tensor scores = at::empty({batch, num_chunks}, float_options);

  const cudaError_t status = specextend_chunk_scores_cuda(
      query_f32.data_ptr<float>(), key_cache.data_ptr(),
      key_dtype_code(key_cache.scalar_type()), key_cache.stride(0),
      key_cache.stride(1), key_cache.stride(2), key_cache.stride(3),
      block_table_c.data_ptr<int32_t>(), block_table_c.stride(0),
      context_lens_c.data_ptr<int32_t>(), checked_int(batch, "batch"),
      checked_int(num_q_heads, "num_q_heads"),
      checked_int(num_kv_heads, "num_kv_heads"),
      checked_int(head_dim, "head_dim"), checked_int(block_size, "block_size"),
      checked_int(max_tokens, "max_tokens"),
      checked_int(chunk_size, "chunk_size"),
      checked_int(num_chunks, "num_chunks"), static_cast<float>(scale),
      scratch.data_ptr<float>(), scores.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess, "chunk_scores: CUDA launch failed: ",
              cudaGetErrorString(status));
  return scores;
}

}  // namespace

TORCH_LIBRARY_IMPL(specextend, CUDA, m) {
  m.impl("chunk_scores", &chunk_scores_cuda);
}

}  // namespace specextend

// Lets `import specextend_vllm._C_cuda` load this library and run the
// registration above.
extern "C" PyObject* PyInit__C_cuda(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C_cuda", nullptr,
                                   -1, nullptr};
  return PyModule_Create(&module_def);
}
