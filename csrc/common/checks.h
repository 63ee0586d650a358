// Input checks shared by the CPU and CUDA entry points of the ops.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace specextend {

struct ChunkScoresShape {
  int64_t batch;
  int64_t num_q_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t num_blocks;
  int64_t block_table_width;
};

inline bool is_supported_float(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
}

// An int32 index tensor of `dims` dimensions, e.g. "chunk_scores: block_table
// must be a 2-D int32 tensor, got [3] Long".
inline void check_int32_tensor(const at::Tensor& tensor, int64_t dims,
                               const char* op, const char* name) {
  TORCH_CHECK(tensor.dim() == dims && tensor.scalar_type() == at::kInt, op,
              ": ", name, " must be a ", dims, "-D int32 tensor, got ",
              tensor.sizes(), " ", tensor.scalar_type());
}

// Everything about the arguments of chunk_scores that is known without reading
// device memory; context lengths and block ids are the caller's to check.
inline ChunkScoresShape check_chunk_scores_inputs(
    const at::Tensor& query,         // [B, Hq, D]
    const at::Tensor& key_cache,     // [num_blocks, block_size, Hkv, D]
    const at::Tensor& block_table,   // [B, W] int32
    const at::Tensor& context_lens,  // [B] int32
    int64_t chunk_size, int64_t num_chunks) {
  TORCH_CHECK(query.dim() == 3, "chunk_scores: query must be [B, Hq, D], got ",
              query.sizes());
  TORCH_CHECK(key_cache.dim() == 4,
              "chunk_scores: key_cache must be a [num_blocks, block_size, "
              "num_kv_heads, head_dim] view, got ",
              key_cache.sizes());
  check_int32_tensor(block_table, 2, "chunk_scores", "block_table");
  check_int32_tensor(context_lens, 1, "chunk_scores", "context_lens");
  TORCH_CHECK(is_supported_float(query.scalar_type()) &&
                  is_supported_float(key_cache.scalar_type()),
              "chunk_scores: query and key_cache must be float32, float16 or "
              "bfloat16, got ",
              query.scalar_type(), " and ", key_cache.scalar_type());
  for (const at::Tensor* tensor : {&key_cache, &block_table, &context_lens}) {
    TORCH_CHECK(tensor->device() == query.device(),
                "chunk_scores: all inputs must be on the device of query (",
                query.device(), "), got a tensor on ", tensor->device());
  }
  const ChunkScoresShape shape{query.size(0),     query.size(1),
                               key_cache.size(2), query.size(2),
                               key_cache.size(1), key_cache.size(0),
                               block_table.size(1)};
  TORCH_CHECK(key_cache.size(3) == shape.head_dim,
              "chunk_scores: key_cache head_dim ", key_cache.size(3),
              " does not match query head_dim ", shape.head_dim);
  TORCH_CHECK(shape.num_kv_heads > 0 &&
                  shape.num_q_heads % shape.num_kv_heads == 0,
              "chunk_scores: num query heads ", shape.num_q_heads,
              " must be a multiple of num kv heads ", shape.num_kv_heads);
  TORCH_CHECK(block_table.size(0) == shape.batch &&
                  context_lens.size(0) == shape.batch,
              "chunk_scores: block_table and context_lens must have batch size ",
              shape.batch, ", got ", block_table.size(0), " and ",
              context_lens.size(0));
  TORCH_CHECK(shape.block_table_width >= 1,
              "chunk_scores: block_table must have at least one column");
  TORCH_CHECK(chunk_size > 0, "chunk_scores: chunk_size must be positive, got ",
              chunk_size);
  TORCH_CHECK(num_chunks >= 0, "chunk_scores: num_chunks must be >= 0, got ",
              num_chunks);
  return shape;
}

struct PagedPrefixAttentionShape {
  int64_t num_tokens;
  int64_t num_requests;
  int64_t num_q_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t num_blocks;
  int64_t block_table_width;
};

// Everything about the arguments of paged_prefix_attention that is known
// without reading device memory; prefix lengths, query offsets and block ids
// are the caller's to check.
inline PagedPrefixAttentionShape check_paged_prefix_attention_inputs(
    const at::Tensor& query,             // [T, Hq, D]
    const at::Tensor& key_cache,         // [num_blocks, block_size, Hkv, D]
    const at::Tensor& value_cache,       // [num_blocks, block_size, Hkv, D]
    const at::Tensor& block_table,       // [R, W] int32
    const at::Tensor& prefix_lens,       // [R] int32
    const at::Tensor& query_start_loc) {  // [R + 1] int32
  TORCH_CHECK(query.dim() == 3,
              "paged_prefix_attention: query must be [T, Hq, D], got ",
              query.sizes());
  TORCH_CHECK(key_cache.dim() == 4,
              "paged_prefix_attention: key_cache must be a [num_blocks, "
              "block_size, num_kv_heads, head_dim] view, got ",
              key_cache.sizes());
  TORCH_CHECK(value_cache.sizes() == key_cache.sizes(),
              "paged_prefix_attention: value_cache must have the shape of "
              "key_cache, ",
              key_cache.sizes(), ", got ", value_cache.sizes());
  check_int32_tensor(block_table, 2, "paged_prefix_attention", "block_table");
  check_int32_tensor(prefix_lens, 1, "paged_prefix_attention", "prefix_lens");
  check_int32_tensor(query_start_loc, 1, "paged_prefix_attention",
                     "query_start_loc");
  TORCH_CHECK(is_supported_float(query.scalar_type()) &&
                  is_supported_float(key_cache.scalar_type()),
              "paged_prefix_attention: query and key_cache must be float32, "
              "float16 or bfloat16, got ",
              query.scalar_type(), " and ", key_cache.scalar_type());
  TORCH_CHECK(value_cache.scalar_type() == key_cache.scalar_type(),
              "paged_prefix_attention: value_cache must have the dtype of "
              "key_cache, ",
              key_cache.scalar_type(), ", got ", value_cache.scalar_type());
  for (const at::Tensor* tensor : {&key_cache, &value_cache, &block_table,
                                   &prefix_lens, &query_start_loc}) {
    TORCH_CHECK(tensor->device() == query.device(),
                "paged_prefix_attention: all inputs must be on the device of "
                "query (",
                query.device(), "), got a tensor on ", tensor->device());
  }
  const PagedPrefixAttentionShape shape{
      query.size(0),     prefix_lens.size(0), query.size(1),
      key_cache.size(2), query.size(2),       key_cache.size(1),
      key_cache.size(0), block_table.size(1)};
  TORCH_CHECK(key_cache.size(3) == shape.head_dim,
              "paged_prefix_attention: key_cache head_dim ", key_cache.size(3),
              " does not match query head_dim ", shape.head_dim);
  TORCH_CHECK(shape.num_kv_heads > 0 &&
                  shape.num_q_heads % shape.num_kv_heads == 0,
              "paged_prefix_attention: num query heads ", shape.num_q_heads,
              " must be a multiple of num kv heads ", shape.num_kv_heads);
  TORCH_CHECK(shape.block_size > 0,
              "paged_prefix_attention: key_cache block_size must be positive");
  TORCH_CHECK(block_table.size(0) == shape.num_requests,
              "paged_prefix_attention: block_table must have one row per "
              "request, ",
              shape.num_requests, ", got ", block_table.size(0));
  TORCH_CHECK(query_start_loc.size(0) == shape.num_requests + 1,
              "paged_prefix_attention: query_start_loc must have num "
              "requests + 1 = ",
              shape.num_requests + 1, " entries, got ",
              query_start_loc.size(0));
  return shape;
}
}  // namespace specextend
