// specextend::chunk_scores on CUDA tensors: checks the inputs, allocates the
// outputs and launches the kernels of cuda.cu on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "chunk_scores/cuda.h"
#include "common/checks.h"

namespace specextend {
namespace {

KeyDType key_dtype(at::ScalarType dtype) {
  if (dtype == at::kHalf) {
    return KeyDType::kFloat16;
  }
  return dtype == at::kBFloat16 ? KeyDType::kBFloat16 : KeyDType::kFloat32;
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
  const ChunkScoresShape shape = check_chunk_scores_inputs(
      query, key_cache, block_table, context_lens, chunk_size, num_chunks);
  // The logits pass keeps a kv head's query heads in shared memory.
  const int64_t group_query_bytes = static_cast<int64_t>(sizeof(float)) *
                                    shape.head_dim *
                                    (shape.num_q_heads / shape.num_kv_heads);
  TORCH_CHECK(group_query_bytes <= 48 * 1024,
              "chunk_scores: the query heads of one kv head take ",
              group_query_bytes, " bytes; the CUDA kernel holds at most 48 KiB");
  const c10::cuda::CUDAGuard device_guard(query.device());
  const at::Tensor query_f32 = query.to(at::kFloat).contiguous();
  const at::Tensor block_table_c = block_table.contiguous();
  const at::Tensor context_lens_c = context_lens.contiguous();
  const int64_t max_tokens = std::min(shape.block_table_width * shape.block_size,
                                      num_chunks * chunk_size);
  const at::TensorOptions float_options = query.options().dtype(at::kFloat);
  at::Tensor logits =
      at::empty({shape.batch, shape.num_q_heads, max_tokens}, float_options);
  const int64_t num_token_tiles =
      (max_tokens + kLogitsTileTokens - 1) / kLogitsTileTokens;
  at::Tensor tile_states = at::empty(
      {shape.batch, shape.num_q_heads, num_token_tiles, 2}, float_options);
  at::Tensor row_lse = at::empty({shape.batch, shape.num_q_heads}, float_options);
  at::Tensor scores = at::empty({shape.batch, num_chunks}, float_options);

  const ChunkScoresParams params{
      query_f32.data_ptr<float>(),
      KeyCacheView{key_cache.data_ptr(), key_dtype(key_cache.scalar_type()),
                   key_cache.stride(0), key_cache.stride(1),
                   key_cache.stride(2), key_cache.stride(3)},
      block_table_c.data_ptr<int32_t>(),
      block_table_c.stride(0),
      context_lens_c.data_ptr<int32_t>(),
      checked_int(shape.batch, "batch"),
      checked_int(shape.num_q_heads, "num_q_heads"),
      checked_int(shape.num_kv_heads, "num_kv_heads"),
      checked_int(shape.head_dim, "head_dim"),
      checked_int(shape.block_size, "block_size"),
      checked_int(max_tokens, "max_tokens"),
      checked_int(chunk_size, "chunk_size"),
      checked_int(num_chunks, "num_chunks"),
      static_cast<float>(scale),
      logits.data_ptr<float>(),
      tile_states.data_ptr<float>(),
      checked_int(num_token_tiles, "num_token_tiles"),
      row_lse.data_ptr<float>(),
      scores.data_ptr<float>()};
  const cudaError_t status =
      launch_chunk_scores(params, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess, "chunk_scores: CUDA launch failed: ",
              cudaGetErrorString(status));
  return scores;
}

}  // namespace

TORCH_LIBRARY_IMPL(specextend, CUDA, m) {
  m.impl("chunk_scores", &chunk_scores_cuda);
}

}  // namespace specextend
