// Chunk scores for Cross-model Retrieval on the CPU: per chunk of each
// request's context, the mean over query heads of the softmax attention mass of
// one query token, averaged over the tokens of the chunk. Keys are read from a
// paged key cache through a strided [num_blocks, block_size, num_kv_heads,
// head_dim] view.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "chunk_scores/cpu.h"
#include "common/attention_state.h"
#include "common/checks.h"
#include "common/paged_cache_cpu.h"

namespace specextend {
namespace {

// Validates context lengths and the block ids they reach; returns the longest
// context.
int64_t check_context(const ChunkScoresShape& shape, const int32_t* block_table,
                      const int32_t* context_lens, int64_t chunk_size,
                      int64_t num_chunks) {
  int64_t max_context_len = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t context_len = context_lens[b];
    TORCH_CHECK(context_len >= 1 &&
                    context_len <= shape.block_table_width * shape.block_size,
                "chunk_scores: context_lens[", b, "] = ", context_len,
                " is outside [1, block_table width * block_size = ",
                shape.block_table_width * shape.block_size, "]");
    const int64_t used_blocks =
        (context_len + shape.block_size - 1) / shape.block_size;
    for (int64_t i = 0; i < used_blocks; ++i) {
      const int64_t block = block_table[b * shape.block_table_width + i];
      TORCH_CHECK(block >= 0 && block < shape.num_blocks,
                  "chunk_scores: block_table[", b, ", ", i, "] = ", block,
                  " is outside [0, ", shape.num_blocks, ")");
    }
    max_context_len = std::max(max_context_len, context_len);
  }
  TORCH_CHECK(num_chunks * chunk_size >= max_context_len,
              "chunk_scores: num_chunks = ", num_chunks,
              " chunks of chunk_size = ", chunk_size,
              " cannot cover the longest context of ", max_context_len,
              " tokens");
  return max_context_len;
}

constexpr int64_t kTokenTile = 32;

// out[t] = dot(query, keys[:, t]) for t < num_tokens <= kTokenTile, keys stored
// dim-major (key_rows[d * dim_stride + t]). kFixedTokens is num_tokens when
// known at compile time (then the accumulators stay in vector registers), else 0.
template <int64_t kFixedTokens>
inline void dot_token_tile(const float* query, int64_t head_dim,
                           const float* key_rows, int64_t dim_stride,
                           int64_t num_tokens, float* out) {
  const int64_t tile_tokens = kFixedTokens > 0 ? kFixedTokens : num_tokens;
  float accumulators[kTokenTile] = {};
  for (int64_t d = 0; d < head_dim; ++d) {
    const float q = query[d];
    const float* key_row = key_rows + d * dim_stride;
    for (int64_t t = 0; t < tile_tokens; ++t) {
      accumulators[t] += q * key_row[t];
    }
  }
  std::copy_n(accumulators, tile_tokens, out);
}

// logits[g * logits_head_stride + t] = dot(query_group[g], key[:, t]) for a
// block of num_tokens keys stored dim-major. Each tile of keys is reused from
// L1 by all query heads of the group.
void block_logits(const float* query_group, int64_t group_size,
                  int64_t head_dim, const float* key_rows, int64_t dim_stride,
                  int64_t num_tokens, float* logits, int64_t logits_head_stride) {
  for (int64_t first = 0; first < num_tokens; first += kTokenTile) {
    const int64_t tile_tokens = std::min(kTokenTile, num_tokens - first);
    for (int64_t g = 0; g < group_size; ++g) {
      const float* query = query_group + g * head_dim;
      float* out = logits + g * logits_head_stride + first;
      if (tile_tokens == kTokenTile) {
        dot_token_tile<kTokenTile>(query, head_dim, key_rows + first,
                                   dim_stride, tile_tokens, out);
      } else {
        dot_token_tile<0>(query, head_dim, key_rows + first, dim_stride,
                          tile_tokens, out);
      }
    }
  }
}

// Fills logits[b, h, t] = scale * q[b, h] . k[b, t, h // group] for every token
// of every request. Work items are (request, kv head, block) triples.
template <typename scalar_t>
void compute_logits(const ChunkScoresShape& shape, const float* scaled_query,
                    const scalar_t* key_cache, const CacheStrides& strides,
                    const int32_t* block_table, const int32_t* context_lens,
                    int64_t max_context_len, float* logits) {
  const int64_t group_size = shape.num_q_heads / shape.num_kv_heads;
  const int64_t max_blocks =
      (max_context_len + shape.block_size - 1) / shape.block_size;
  const int64_t num_items = shape.batch * shape.num_kv_heads * max_blocks;
  const int64_t work_per_item = group_size * shape.head_dim * shape.block_size;
  const int64_t grain_size =
      std::max<int64_t>(1, at::internal::GRAIN_SIZE / work_per_item);
  // fp32 keys with contiguous tokens are used in place; anything else is
  // packed into a float tile first.
  const bool read_in_place =
      std::is_same<scalar_t, float>::value && strides.token == 1;

  at::parallel_for(0, num_items, grain_size, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(read_in_place ? 0 : shape.head_dim * shape.block_size);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t block_index = item % max_blocks;
      const int64_t kv_head = (item / max_blocks) % shape.num_kv_heads;
      const int64_t b = item / (max_blocks * shape.num_kv_heads);
      const int64_t first_token = block_index * shape.block_size;
      const int64_t num_tokens =
          std::min<int64_t>(shape.block_size, context_lens[b] - first_token);
      if (num_tokens <= 0) {
        continue;
      }
      const int64_t block =
          block_table[b * shape.block_table_width + block_index];
      const scalar_t* keys =
          key_cache + block * strides.block + kv_head * strides.head;
      const float* key_rows;
      int64_t dim_stride;
      if (read_in_place) {
        key_rows = reinterpret_cast<const float*>(keys);
        dim_stride = strides.dim;
      } else {
        pack_keys_dim_major(keys, strides, shape.head_dim, num_tokens, tile.data(),
                       shape.block_size);
        key_rows = tile.data();
        dim_stride = shape.block_size;
      }
      const int64_t first_head = kv_head * group_size;
      block_logits(
          scaled_query + (b * shape.num_q_heads + first_head) * shape.head_dim,
          group_size, shape.head_dim, key_rows, dim_stride, num_tokens,
          logits + (b * shape.num_q_heads + first_head) * max_context_len +
              first_token,
          max_context_len);
    }
  });
}

// chunk_mass[b, h, c] = softmax(logits[b, h, :L_b]) summed over chunk c. The
// softmax state of each chunk is built on its own and merged into the row's, so
// the denominator is summed chunk by chunk, which keeps its rounding error small
// for long contexts.
void compute_chunk_mass(const ChunkScoresShape& shape, const float* logits,
                        const int32_t* context_lens, int64_t max_context_len,
                        int64_t chunk_size, int64_t num_chunks,
                        float* chunk_mass) {
  const int64_t num_items = shape.batch * shape.num_q_heads;
  const int64_t grain_size = std::max<int64_t>(
      1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, max_context_len));
  at::parallel_for(0, num_items, grain_size, [&](int64_t begin, int64_t end) {
    std::vector<AttentionState> chunk_states(num_chunks);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t context_len = context_lens[item / shape.num_q_heads];
      const float* head_logits = logits + item * max_context_len;
      AttentionState row_state;
      for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t first = c * chunk_size;
        const int64_t last = std::min(first + chunk_size, context_len);
        chunk_states[c] = AttentionState{};
        for (int64_t t = first; t < last; ++t) {
          chunk_states[c].update(head_logits[t]);
        }
        row_state.merge(chunk_states[c]);
      }
      float* head_chunk_mass = chunk_mass + item * num_chunks;
      for (int64_t c = 0; c < num_chunks; ++c) {
        head_chunk_mass[c] = chunk_states[c].share_of(row_state);
      }
    }
  });
}

// scores[b, c] = sum_h chunk_mass[b, h, c] / (Hq * tokens in chunk), or -inf
// for chunks past the context.
void reduce_heads(const ChunkScoresShape& shape, const float* chunk_mass,
                  const int32_t* context_lens, int64_t chunk_size,
                  int64_t num_chunks, float* scores) {
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t context_len = context_lens[b];
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t chunk_tokens =
          std::min(chunk_size, context_len - c * chunk_size);
      if (chunk_tokens <= 0) {
        scores[b * num_chunks + c] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float mass = 0.0f;
      for (int64_t h = 0; h < shape.num_q_heads; ++h) {
        mass += chunk_mass[(b * shape.num_q_heads + h) * num_chunks + c];
      }
      scores[b * num_chunks + c] =
          mass / static_cast<float>(shape.num_q_heads * chunk_tokens);
    }
  }
}

}  // namespace

at::Tensor chunk_scores_cpu(const at::Tensor& query, const at::Tensor& key_cache,
                            const at::Tensor& block_table,
                            const at::Tensor& context_lens, int64_t chunk_size,
                            double scale, int64_t num_chunks) {
  const ChunkScoresShape shape = check_chunk_scores_inputs(
      query, key_cache, block_table, context_lens, chunk_size, num_chunks);
  const at::Tensor block_table_c = block_table.contiguous();
  const at::Tensor context_lens_c = context_lens.contiguous();
  const int32_t* block_table_ptr = block_table_c.data_ptr<int32_t>();
  const int32_t* context_lens_ptr = context_lens_c.data_ptr<int32_t>();
  const int64_t max_context_len = check_context(
      shape, block_table_ptr, context_lens_ptr, chunk_size, num_chunks);

  const at::Tensor scaled_query = (query.to(at::kFloat) * scale).contiguous();
  const at::TensorOptions float_options = query.options().dtype(at::kFloat);
  at::Tensor logits = at::empty(
      {shape.batch, shape.num_q_heads, max_context_len}, float_options);
  at::Tensor chunk_mass =
      at::empty({shape.batch, shape.num_q_heads, num_chunks}, float_options);
  at::Tensor scores = at::empty({shape.batch, num_chunks}, float_options);
  const CacheStrides strides = strides_of(key_cache);

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, key_cache.scalar_type(), "chunk_scores_cpu",
      [&] {
        compute_logits<scalar_t>(shape, scaled_query.data_ptr<float>(),
                                 key_cache.data_ptr<scalar_t>(), strides,
                                 block_table_ptr, context_lens_ptr,
                                 max_context_len, logits.data_ptr<float>());
      });
  compute_chunk_mass(shape, logits.data_ptr<float>(), context_lens_ptr,
                     max_context_len, chunk_size, num_chunks,
                     chunk_mass.data_ptr<float>());
  reduce_heads(shape, chunk_mass.data_ptr<float>(), context_lens_ptr,
               chunk_size, num_chunks, scores.data_ptr<float>());
  return scores;
}

}  // namespace specextend
