// Parameters and launcher of the CUDA chunk-scores kernels (cuda.cu). No torch
// dependency: cuda.cu compiles on its own.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specextend {

// Tokens per thread block of the logits pass, one thread each: the unit of the
// softmax states it leaves for the row log-sum-exp.
constexpr int kLogitsTileTokens = 256;

enum class KeyDType { kFloat32, kFloat16, kBFloat16 };

// A [num_blocks, block_size, num_kv_heads, head_dim] view of a paged key
// cache; strides in elements.
struct KeyCacheView {
  const void* data;
  KeyDType dtype;
  int64_t stride_block;
  int64_t stride_token;
  int64_t stride_head;
  int64_t stride_dim;
};

struct ChunkScoresParams {
  const float* query;  // [batch, num_q_heads, head_dim], contiguous
  KeyCacheView key_cache;
  const int32_t* block_table;  // [batch] rows of block_table_stride elements
  int64_t block_table_stride;
  const int32_t* context_lens;  // [batch]; clamped to [0, max_tokens]
  int batch;
  int num_q_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
  int max_tokens;  // an upper bound of every context length
  int chunk_size;
  int num_chunks;
  float scale;
  float* logits;       // scratch [batch, num_q_heads, max_tokens]
  float* tile_states;  // scratch [batch, num_q_heads, num_token_tiles, 2]: the
                       // (max, denominator) of each tile of a row's logits
  int num_token_tiles;  // ceil(max_tokens / kLogitsTileTokens)
  float* row_lse;       // [batch, num_q_heads]: log-sum-exp of each row of logits
  float* scores;   // [batch, num_chunks], contiguous
};

// Computes params.scores (see specextend_vllm/ops/chunk_scores.py) on `stream`;
// returns the launch error.
cudaError_t launch_chunk_scores(const ChunkScoresParams& params,
                                cudaStream_t stream);

}  // namespace specextend
