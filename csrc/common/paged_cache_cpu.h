// Reading a paged key or value cache view [num_blocks, block_size, kv_heads,
// head_dim] of any strides on the CPU: its strides by logical dimension, and
// the copy of one (block, kv head) of keys into a dim-major float tile.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace specextend {

struct CacheStrides {
  int64_t block;
  int64_t token;
  int64_t head;
  int64_t dim;
};

inline CacheStrides strides_of(const at::Tensor& cache) {
  return {cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3)};
}

// tile[d * tile_stride + t] = keys[t, d] for num_tokens keys of head_dim each.
template <typename scalar_t>
void pack_keys_dim_major(const scalar_t* keys, const CacheStrides& strides,
                         int64_t head_dim, int64_t num_tokens, float* tile,
                         int64_t tile_stride) {
  if (strides.token == 1) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const scalar_t* key_row = keys + d * strides.dim;
      float* tile_row = tile + d * tile_stride;
      for (int64_t t = 0; t < num_tokens; ++t) {
        tile_row[t] = static_cast<float>(key_row[t]);
      }
    }
    return;
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    const scalar_t* key = keys + t * strides.token;
    for (int64_t d = 0; d < head_dim; ++d) {
      tile[d * tile_stride + t] = static_cast<float>(key[d * strides.dim]);
    }
  }
}

}  // namespace specextend
