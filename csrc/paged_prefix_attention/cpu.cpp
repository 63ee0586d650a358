// Attention of each request's query tokens over its cached prefix on the CPU,
// with no mask: the prefix half of hybrid tree attention, whose output and
// log-sum-exp are merged with attention over the speculative tokens. Keys and
// values are read from paged caches through strided [num_blocks, block_size,
// num_kv_heads, head_dim] views.
//
// The work is split into runs of blocks of one request and KV head, each for
// the tile of rows (query token i, query head g of the KV head's group) at row
// i * group_size + g, so that every block is read once. A split keeps, per
// row, the AttentionState of the logits it has seen and the softmax-weighted
// mean of their values; the splits of a row are combined by their shares of
// the row's softmax mass.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/attention_state.h"
#include "common/checks.h"
#include "common/paged_cache_cpu.h"
#include "paged_prefix_attention/cpu.h"

namespace specextend {
namespace {

int64_t ceil_div(int64_t numerator, int64_t denominator) {
  return (numerator + denominator - 1) / denominator;
}

// Validates the query offsets, the prefix lengths and the block ids they reach.
void check_requests(const PagedPrefixAttentionShape& shape,
                    const int32_t* block_table, const int32_t* prefix_lens,
                    const int32_t* query_start_loc) {
  TORCH_CHECK(query_start_loc[0] == 0,
              "paged_prefix_attention: query_start_loc[0] must be 0, got ",
              query_start_loc[0]);
  for (int64_t r = 0; r < shape.num_requests; ++r) {
    TORCH_CHECK(query_start_loc[r] <= query_start_loc[r + 1] &&
                    query_start_loc[r + 1] <= shape.num_tokens,
                "paged_prefix_attention: query_start_loc must be "
                "non-decreasing and at most the number of query tokens, ",
                shape.num_tokens, ", got query_start_loc[", r, "] = ",
                query_start_loc[r], " and query_start_loc[", r + 1, "] = ",
                query_start_loc[r + 1]);
    const int64_t prefix_len = prefix_lens[r];
    TORCH_CHECK(prefix_len >= 0 &&
                    prefix_len <= shape.block_table_width * shape.block_size,
                "paged_prefix_attention: prefix_lens[", r, "] = ", prefix_len,
                " is outside [0, block_table width * block_size = ",
                shape.block_table_width * shape.block_size, "]");
    for (int64_t i = 0; i < ceil_div(prefix_len, shape.block_size); ++i) {
      const int64_t block = block_table[r * shape.block_table_width + i];
      TORCH_CHECK(block >= 0 && block < shape.num_blocks,
                  "paged_prefix_attention: block_table[", r, ", ", i, "] = ",
                  block, " is outside [0, ", shape.num_blocks, ")");
    }
  }
}

// Blocks [first_block, end_block) of one request's prefix and one KV head.
struct Split {
  int64_t request;
  int64_t kv_head;
  int64_t first_block;
  int64_t end_block;
  int64_t first_row;  // of its tile in the partial results of all splits
};

struct SplitPlan {
  std::vector<Split> splits;  // by request, then KV head, then block
  std::vector<int64_t> first_split;  // [R]
  std::vector<int64_t> splits_per_head;  // [R]; 0 without queries or prefix
  int64_t num_rows = 0;  // of all tiles together
  int64_t max_tile_rows = 0;
  int64_t work = 0;  // multiply-adds
};

constexpr int64_t kSplitsPerThread = 4;
constexpr int64_t kMinSplitTokens = 512;

// Splits the prefix of every (request, KV head) into runs of whole blocks:
// one run each on a single thread, else about kSplitsPerThread per thread in
// all, so that threads get parts of similar size however many requests there
// are, but none shorter than kMinSplitTokens, so that combining them stays
// cheap.
SplitPlan plan_splits(const PagedPrefixAttentionShape& shape,
                      const int32_t* prefix_lens,
                      const int32_t* query_start_loc) {
  const int64_t group_size = shape.num_q_heads / shape.num_kv_heads;
  int64_t prefix_tokens = 0;
  for (int64_t r = 0; r < shape.num_requests; ++r) {
    if (query_start_loc[r + 1] > query_start_loc[r]) {
      prefix_tokens += prefix_lens[r];
    }
  }
  const int64_t num_threads = at::get_num_threads();
  const int64_t target_splits =
      num_threads == 1 ? 1 : kSplitsPerThread * num_threads;
  const int64_t split_blocks = ceil_div(
      std::max(kMinSplitTokens,
               ceil_div(prefix_tokens * shape.num_kv_heads, target_splits)),
      shape.block_size);

  SplitPlan plan;
  plan.first_split.resize(shape.num_requests);
  plan.splits_per_head.resize(shape.num_requests);
  for (int64_t r = 0; r < shape.num_requests; ++r) {
    const int64_t tile_rows =
        (query_start_loc[r + 1] - query_start_loc[r]) * group_size;
    const int64_t num_blocks =
        tile_rows > 0 ? ceil_div(prefix_lens[r], shape.block_size) : 0;
    const int64_t num_splits = ceil_div(num_blocks, split_blocks);
    plan.first_split[r] = static_cast<int64_t>(plan.splits.size());
    plan.splits_per_head[r] = num_splits;
    if (num_splits == 0) {
      continue;
    }
    plan.max_tile_rows = std::max(plan.max_tile_rows, tile_rows);
    plan.work += shape.num_kv_heads * tile_rows * prefix_lens[r] *
                 shape.head_dim * 2;
    for (int64_t kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
      for (int64_t s = 0; s < num_splits; ++s) {
        plan.splits.push_back({r, kv_head, s * num_blocks / num_splits,
                               (s + 1) * num_blocks / num_splits,
                               plan.num_rows});
        plan.num_rows += tile_rows;
      }
    }
  }
  return plan;
}

// A register tile of kRows query rows by kVectors vectors of keys (or value
// dims) keeps its accumulators in kRows * kVectors vector registers.
template <int64_t kRows, int64_t kVectors>
struct TileShape;

// Wide tiles read whole 512-byte rows of keys and values, in memory order;
// tall tiles reuse each loaded vector for more rows. On AVX-512 (24 of 32
// registers each) tall tiles win from kMinTallTileRows rows on (5 tokens of a
// GQA group of 6), wide ones below (measured); on AVX2 (12 of 16) and SSE (6
// of 16) one shape serves both.
#if defined(__AVX512F__)
constexpr int64_t kVectorFloats = 16;
using WideTile = TileShape<3, 8>;
using TallTile = TileShape<6, 4>;
#elif defined(__AVX__)
constexpr int64_t kVectorFloats = 8;
using WideTile = TileShape<3, 4>;
using TallTile = WideTile;
#else
constexpr int64_t kVectorFloats = 4;
using WideTile = TileShape<3, 2>;
using TallTile = WideTile;
#endif
constexpr int64_t kMinTallTileRows = 24;

template <int64_t kRows, int64_t kVectors>
struct TileShape {
  static constexpr int64_t kRowTile = kRows;
  static constexpr int64_t kColumnTile = kVectors * kVectorFloats;
};

// Keys' dims, and values' tokens, are summed over this many at a time, so that
// the part of a block that every row tile reads again (32 KB of float keys of
// 128 tokens) stays in the L1 cache.
constexpr int64_t kReductionSpan = 64;

template <int64_t kCount>
using Count = std::integral_constant<int64_t, kCount>;

// Calls tile(Count<n>{}, first_row) once for the last n = num_rows < kRows
// rows of a tile.
template <int64_t kRows, typename TileFn>
inline void last_row_tile(int64_t num_rows, int64_t first_row, TileFn& tile) {
  if constexpr (kRows > 1) {
    if (num_rows == kRows - 1) {
      tile(Count<kRows - 1>{}, first_row);
    } else {
      last_row_tile<kRows - 1>(num_rows, first_row, tile);
    }
  }
}

// Calls tile(Count<n>{}, first_row) for consecutive tiles of n = kRowTile
// rows, then once for the rest of num_rows.
template <int64_t kRowTile, typename TileFn>
inline void for_each_row_tile(int64_t num_rows, TileFn&& tile) {
  int64_t first_row = 0;
  for (; first_row + kRowTile <= num_rows; first_row += kRowTile) {
    tile(Count<kRowTile>{}, first_row);
  }
  last_row_tile<kRowTile>(num_rows - first_row, first_row, tile);
}

// Calls tile(Count<n>{}, first) over the columns [first, num_columns) in
// chunks of n = kColumns, kColumns / 2, ... down to one vector, each as often
// as it fits, then once with n = 0 for the columns of a last partial vector.
template <int64_t kColumns, typename TileFn>
inline void for_each_column_tile(int64_t num_columns, int64_t first,
                                 TileFn&& tile) {
  if constexpr (kColumns >= kVectorFloats) {
    for (; first + kColumns <= num_columns; first += kColumns) {
      tile(Count<kColumns>{}, first);
    }
    for_each_column_tile<kColumns / 2>(num_columns, first, tile);
  } else if (first < num_columns) {
    tile(Count<0>{}, first);
  }
}

// How many tiles for_each_column_tile<kColumns> visits over num_columns columns:
// 128 columns in tiles of 64 are 2; 100 in tiles of 64 (16-float vectors) are
// 64 + 32 + one partial vector, 3.
template <int64_t kColumns>
constexpr int64_t column_tile_count(int64_t num_columns) {
  if constexpr (kColumns >= kVectorFloats) {
    return num_columns / kColumns +
           column_tile_count<kColumns / 2>(num_columns % kColumns);
  } else {
    return num_columns > 0 ? 1 : 0;
  }
}
static_assert(column_tile_count<4 * kVectorFloats>(8 * kVectorFloats) == 2);
static_assert(column_tile_count<4 * kVectorFloats>(6 * kVectorFloats + 1) == 3);

// The cache lines of the next block's keys and values, a few requested at each
// step of the current block's loops, so that reading the prefix from memory
// overlaps the arithmetic instead of waiting at each block's start. The tile
// loops step a local copy, whose cursor then stays in a register.
class NextBlockPrefetch {
 public:
  struct Span {
    const char* begin;
    const char* end;
  };

  void reset(Span keys, Span values, int64_t lines_per_step) {
    cursor_ = keys.begin;
    end_ = keys.end;
    then_ = values;
    lines_per_step_ = lines_per_step;
  }

  void clear() { *this = NextBlockPrefetch(); }

  inline void step() {
    for (int64_t i = 0; i < lines_per_step_ && cursor_ < end_; ++i) {
      __builtin_prefetch(cursor_, 0, 1);
      cursor_ += kCacheLine;
      if (cursor_ >= end_) {
        cursor_ = then_.begin;
        end_ = then_.end;
        then_ = {};
      }
    }
  }

  static constexpr int64_t kCacheLine = 64;

 private:
  const char* cursor_ = nullptr;
  const char* end_ = nullptr;
  Span then_ = {};  // the values, once the keys are requested
  int64_t lines_per_step_ = 0;
};

// logits[r * logits_stride + t] (+)= the dot products of kRows query rows (row
// stride head_dim) with kTokens keys stored dim-major (keys[d * dim_stride +
// t]), or num_tokens < kVectorFloats keys when kTokens is 0, over num_dims
// dims; added to the logits already there when add_to_logits. With the tile's
// size known at compile time its accumulators stay in registers.
template <int64_t kRows, int64_t kTokens>
inline void dot_tile(const float* queries, int64_t head_dim, int64_t num_dims,
                     const float* keys, int64_t dim_stride, int64_t num_tokens,
                     float* logits, int64_t logits_stride, bool add_to_logits,
                     NextBlockPrefetch& prefetch) {
  constexpr int64_t kMaxTokens = kTokens > 0 ? kTokens : kVectorFloats;
  const int64_t tile_tokens = kTokens > 0 ? kTokens : num_tokens;
  float accumulators[kRows][kMaxTokens] = {};
  if (add_to_logits) {
    for (int64_t r = 0; r < kRows; ++r) {
      std::copy_n(logits + r * logits_stride, tile_tokens, accumulators[r]);
    }
  }
  NextBlockPrefetch local_prefetch = prefetch;
  for (int64_t d = 0; d < num_dims; ++d) {
    local_prefetch.step();
    const float* key_row = keys + d * dim_stride;
    for (int64_t r = 0; r < kRows; ++r) {
      const float q = queries[r * head_dim + d];
      for (int64_t t = 0; t < tile_tokens; ++t) {
        accumulators[r][t] += q * key_row[t];
      }
    }
  }
  prefetch = local_prefetch;
  for (int64_t r = 0; r < kRows; ++r) {
    std::copy_n(accumulators[r], tile_tokens, logits + r * logits_stride);
  }
}

// logits[r * logits_stride + t] = dot(queries[r], keys[:, t]) for a tile of
// num_rows query rows and a block of num_tokens keys stored dim-major. Each
// tile of keys is reused from cache by every tile of rows.
template <typename Tile>
void block_logits(const float* queries, int64_t num_rows, int64_t head_dim,
                  const float* keys, int64_t dim_stride, int64_t num_tokens,
                  float* logits, int64_t logits_stride,
                  NextBlockPrefetch& prefetch) {
  for (int64_t first_dim = 0; first_dim < head_dim;
       first_dim += kReductionSpan) {
    const int64_t num_dims = std::min(kReductionSpan, head_dim - first_dim);
    for_each_column_tile<Tile::kColumnTile>(
        num_tokens, 0, [&](auto tokens, int64_t first) {
          for_each_row_tile<Tile::kRowTile>(num_rows, [&](auto rows,
                                                         int64_t r) {
            dot_tile<decltype(rows)::value, decltype(tokens)::value>(
                queries + r * head_dim + first_dim, head_dim, num_dims,
                keys + first_dim * dim_stride + first, dim_stride,
                num_tokens - first, logits + r * logits_stride + first,
                logits_stride, first_dim > 0, prefetch);
          });
        });
  }
}

// exp(x) for x <= 0 from Cephes' expf polynomial on [-ln 2 / 2, ln 2 / 2] (a
// relative error of about 1e-7), in plain float and integer arithmetic that
// vectorizes, unlike std::exp; 0 below -87, where exp(x) leaves the normal
// floats.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMin = -87.0f;
  // Adding 1.5 * 2^23 rounds to an integer, which is left in the low bits of
  // the sum's mantissa (a float-to-int conversion would keep GCC from
  // vectorizing the loop).
  constexpr float kRound = 12582912.0f;
  const float clamped = std::max(x, kMin);
  const float rounded = clamped * kLog2e + kRound;
  const float n = rounded - kRound;
  const float r = clamped - n * kLn2Hi - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = p * r * r + r + 1.0f;
  // __builtin_bit_cast is std::bit_cast, which torch before 2.13 does not get: it builds
  // extensions as C++17.
  const int32_t n_bits =
      __builtin_bit_cast(int32_t, rounded) - __builtin_bit_cast(int32_t, kRound);
  const float two_to_n = __builtin_bit_cast(float, (n_bits + 127) << 23);
  return x < kMin ? 0.0f : exp_r * two_to_n;
}

constexpr int64_t kLanes = 16;

// Replaces a row of logits by exp(logit - their maximum) and pads it with
// zeros to a multiple of kLanes; returns the logits' state. The maximum and the
// sum are taken in kLanes independent lanes, so that the loops vectorize
// without reassociating float arithmetic.
AttentionState exponentiate(float* row, int64_t num_tokens) {
  const int64_t padded_tokens = ceil_div(num_tokens, kLanes) * kLanes;
  std::fill(row + num_tokens, row + padded_tokens,
            -std::numeric_limits<float>::infinity());
  float lane_max[kLanes];
  std::fill_n(lane_max, kLanes, -std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < padded_tokens; t += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      lane_max[l] = std::max(lane_max[l], row[t + l]);
    }
  }
  const float max_logit = *std::max_element(lane_max, lane_max + kLanes);
  float lane_sum[kLanes] = {};
  for (int64_t t = 0; t < padded_tokens; t += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      row[t + l] = exp_nonpositive(row[t + l] - max_logit);
      lane_sum[l] += row[t + l];
    }
  }
  return {max_logit, std::accumulate(lane_sum, lane_sum + kLanes, 0.0f)};
}

// Folds a block's logits into the row states, replacing them by weights: a
// row's output becomes keep[r] * its output + add[r] * sum_t weight[t] *
// value[t], its softmax-weighted mean over the logits seen so far.
void fold_block(float* logits, int64_t logits_stride, int64_t num_rows,
                int64_t num_tokens, AttentionState* states, float* keep,
                float* add) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const AttentionState block =
        exponentiate(logits + r * logits_stride, num_tokens);
    AttentionState merged = states[r];
    merged.merge(block);
    keep[r] = states[r].share_of(merged);
    add[r] = block.share_of(merged) / block.denominator;
    states[r] = merged;
  }
}

// outputs[r, d] = keep[r] * outputs[r, d] + add[r] * sum_t weights[r, t] *
// values[t, d] for kRows rows and kDims dims of num_tokens value rows (row
// stride value_stride), or num_dims < kVectorFloats dims when kDims is 0; keep
// is taken as 1 unless rescale. With the tile's size known at compile time its
// accumulators stay in registers.
template <int64_t kRows, int64_t kDims>
inline void accumulate_tile(const float* weights, int64_t weights_stride,
                            const float* values, int64_t value_stride,
                            int64_t num_tokens, int64_t num_dims,
                            const float* keep, const float* add, bool rescale,
                            float* outputs, int64_t output_stride,
                            NextBlockPrefetch& prefetch) {
  constexpr int64_t kMaxDims = kDims > 0 ? kDims : kVectorFloats;
  const int64_t tile_dims = kDims > 0 ? kDims : num_dims;
  float accumulators[kRows][kMaxDims] = {};
  NextBlockPrefetch local_prefetch = prefetch;
  for (int64_t t = 0; t < num_tokens; ++t) {
    local_prefetch.step();
    const float* value = values + t * value_stride;
    for (int64_t r = 0; r < kRows; ++r) {
      const float weight = weights[r * weights_stride + t];
      for (int64_t d = 0; d < tile_dims; ++d) {
        accumulators[r][d] += weight * value[d];
      }
    }
  }
  prefetch = local_prefetch;
  for (int64_t r = 0; r < kRows; ++r) {
    const float row_keep = rescale ? keep[r] : 1.0f;
    float* output = outputs + r * output_stride;
    for (int64_t d = 0; d < tile_dims; ++d) {
      output[d] = row_keep * output[d] + add[r] * accumulators[r][d];
    }
  }
}

// outputs[r, :] = keep[r] * outputs[r, :] + add[r] * weights[r, :] . values
// for a tile of num_rows rows (row stride head_dim) and a block of num_tokens
// value rows. Each tile of value columns is reused from cache by every tile of
// rows.
template <typename Tile>
void block_outputs(const float* weights, int64_t weights_stride,
                   int64_t num_rows, const float* values, int64_t value_stride,
                   int64_t num_tokens, int64_t head_dim, const float* keep,
                   const float* add, float* outputs,
                   NextBlockPrefetch& prefetch) {
  for (int64_t first_token = 0; first_token < num_tokens;
       first_token += kReductionSpan) {
    const int64_t span_tokens =
        std::min(kReductionSpan, num_tokens - first_token);
    for_each_column_tile<Tile::kColumnTile>(
        head_dim, 0, [&](auto dims, int64_t first) {
          for_each_row_tile<Tile::kRowTile>(num_rows, [&](auto rows,
                                                         int64_t r) {
            accumulate_tile<decltype(rows)::value, decltype(dims)::value>(
                weights + r * weights_stride + first_token, weights_stride,
                values + first_token * value_stride + first, value_stride,
                span_tokens, head_dim - first, keep + r, add + r,
                first_token == 0, outputs + r * head_dim + first, head_dim,
                prefetch);
          });
        });
  }
}

// Copies num_tokens values of one (block, kv head) into a token-major float
// tile tile[t * head_dim + d].
template <typename scalar_t>
void pack_values(const scalar_t* values, const CacheStrides& strides,
                 int64_t head_dim, int64_t num_tokens, float* tile) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const scalar_t* value = values + t * strides.token;
    float* tile_row = tile + t * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) {
      tile_row[d] = static_cast<float>(value[d * strides.dim]);
    }
  }
}

// The bytes of one (block, KV head) of a paged cache view.
template <typename scalar_t>
NextBlockPrefetch::Span block_span(const scalar_t* first,
                                   const CacheStrides& strides,
                                   int64_t block_size, int64_t head_dim) {
  const int64_t last =
      (block_size - 1) * strides.token + (head_dim - 1) * strides.dim;
  return {reinterpret_cast<const char*>(first),
          reinterpret_cast<const char*>(first + last + 1)};
}

// The steps of one block's loops, which spread the next block's prefetch: one
// per dim of every (row tile, token tile) of the logits, one per token of every
// (row tile, dim tile) of the outputs. A 6-row, 64-column tile over 30 rows,
// 128 dims and 128-token blocks: 5 * (2 * 128 + 2 * 128) = 2560.
template <typename Tile>
int64_t steps_per_block(int64_t num_rows, int64_t head_dim,
                        int64_t block_size) {
  return ceil_div(num_rows, Tile::kRowTile) *
         (column_tile_count<Tile::kColumnTile>(block_size) * head_dim +
          column_tile_count<Tile::kColumnTile>(head_dim) * block_size);
}

// Runs every split: fills its rows of states (AttentionState of the row's
// logits over the split's blocks) and of outputs [rows, head_dim] (the
// softmax-weighted mean of their values).
template <typename scalar_t>
void attend_splits(const PagedPrefixAttentionShape& shape,
                   const SplitPlan& plan, const float* scaled_query,
                   const scalar_t* key_cache, const CacheStrides& key_strides,
                   const scalar_t* value_cache,
                   const CacheStrides& value_strides,
                   const int32_t* block_table, const int32_t* prefix_lens,
                   const int32_t* query_start_loc, AttentionState* states,
                   float* outputs) {
  const int64_t group_size = shape.num_q_heads / shape.num_kv_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t block_size = shape.block_size;
  const int64_t num_splits = static_cast<int64_t>(plan.splits.size());
  const int64_t logits_stride = ceil_div(block_size, kLanes) * kLanes;
  // fp32 keys with contiguous tokens and fp32 values with contiguous dims are
  // used in place; anything else is packed into a float tile first.
  constexpr bool kFloatCache = std::is_same<scalar_t, float>::value;
  const bool keys_in_place = kFloatCache && key_strides.token == 1;
  const bool values_in_place = kFloatCache && value_strides.dim == 1;
  const int64_t grain_size =
      plan.work < at::internal::GRAIN_SIZE ? std::max<int64_t>(1, num_splits)
                                           : 1;

  at::parallel_for(0, num_splits, grain_size, [&](int64_t begin, int64_t end) {
    std::vector<float> queries(plan.max_tile_rows * head_dim);
    std::vector<float> logits(plan.max_tile_rows * logits_stride);
    std::vector<float> keep(plan.max_tile_rows);
    std::vector<float> add(plan.max_tile_rows);
    std::vector<float> key_tile(keys_in_place ? 0 : head_dim * block_size);
    std::vector<float> value_tile(values_in_place ? 0 : block_size * head_dim);
    NextBlockPrefetch prefetch;
    for (int64_t index = begin; index < end; ++index) {
      const Split& split = plan.splits[index];
      const int64_t first_token = query_start_loc[split.request];
      const int64_t num_query_tokens =
          query_start_loc[split.request + 1] - first_token;
      const int64_t num_rows = num_query_tokens * group_size;
      for (int64_t i = 0; i < num_query_tokens; ++i) {
        std::copy_n(scaled_query + ((first_token + i) * shape.num_q_heads +
                                    split.kv_head * group_size) *
                                       head_dim,
                    group_size * head_dim,
                    queries.data() + i * group_size * head_dim);
      }
      AttentionState* row_states = states + split.first_row;
      float* row_outputs = outputs + split.first_row * head_dim;
      const int64_t prefix_len = prefix_lens[split.request];
      const int32_t* request_blocks =
          block_table + split.request * shape.block_table_width;
      const auto keys_of = [&](int64_t b) {
        return key_cache + request_blocks[b] * key_strides.block +
               split.kv_head * key_strides.head;
      };
      const auto values_of = [&](int64_t b) {
        return value_cache + request_blocks[b] * value_strides.block +
               split.kv_head * value_strides.head;
      };
      const auto attend_blocks = [&](auto tile) {
        using Tile = decltype(tile);
        const int64_t prefetch_steps =
            steps_per_block<Tile>(num_rows, head_dim, block_size);
        for (int64_t b = split.first_block; b < split.end_block; ++b) {
          const int64_t num_tokens =
              std::min(block_size, prefix_len - b * block_size);
          const scalar_t* keys = keys_of(b);
          const scalar_t* values = values_of(b);
          if (b + 1 < split.end_block) {
            const NextBlockPrefetch::Span next_keys =
                block_span(keys_of(b + 1), key_strides, block_size, head_dim);
            const NextBlockPrefetch::Span next_values = block_span(
                values_of(b + 1), value_strides, block_size, head_dim);
            const int64_t bytes = (next_keys.end - next_keys.begin) +
                                  (next_values.end - next_values.begin);
            const int64_t lines =
                ceil_div(bytes, NextBlockPrefetch::kCacheLine);
            prefetch.reset(next_keys, next_values,
                           ceil_div(lines, prefetch_steps));
          } else {
            prefetch.clear();
          }
          const float* key_rows = key_tile.data();
          int64_t key_dim_stride = block_size;
          if (keys_in_place) {
            key_rows = reinterpret_cast<const float*>(keys);
            key_dim_stride = key_strides.dim;
          } else {
            pack_keys_dim_major(keys, key_strides, head_dim, num_tokens,
                                key_tile.data(), block_size);
          }
          const float* value_rows = value_tile.data();
          int64_t value_stride = head_dim;
          if (values_in_place) {
            value_rows = reinterpret_cast<const float*>(values);
            value_stride = value_strides.token;
          } else {
            pack_values(values, value_strides, head_dim, num_tokens,
                        value_tile.data());
          }
          block_logits<Tile>(queries.data(), num_rows, head_dim, key_rows,
                             key_dim_stride, num_tokens, logits.data(),
                             logits_stride, prefetch);
          fold_block(logits.data(), logits_stride, num_rows, num_tokens,
                     row_states, keep.data(), add.data());
          block_outputs<Tile>(logits.data(), logits_stride, num_rows,
                              value_rows, value_stride, num_tokens, head_dim,
                              keep.data(), add.data(), row_outputs, prefetch);
        }
      };
      if (num_rows >= kMinTallTileRows) {
        attend_blocks(TallTile{});
      } else {
        attend_blocks(WideTile{});
      }
    }
  });
}

// output[t, h] = the outputs of the splits of row (t, h), each weighted by
// its share of the row's softmax mass, and lse[h, t] = the log-sum-exp of the
// row's merged states. Rows without splits are left as they are.
void combine_splits(const PagedPrefixAttentionShape& shape,
                    const SplitPlan& plan, const int32_t* query_start_loc,
                    const AttentionState* states, const float* outputs,
                    float* output, float* lse) {
  const int64_t group_size = shape.num_q_heads / shape.num_kv_heads;
  const int64_t head_dim = shape.head_dim;
  for (int64_t r = 0; r < shape.num_requests; ++r) {
    const int64_t num_splits = plan.splits_per_head[r];
    if (num_splits == 0) {
      continue;
    }
    const int64_t first_token = query_start_loc[r];
    const int64_t num_rows =
        (query_start_loc[r + 1] - first_token) * group_size;
    for (int64_t kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head) {
      const Split* head_splits =
          plan.splits.data() + plan.first_split[r] + kv_head * num_splits;
      for (int64_t row = 0; row < num_rows; ++row) {
        AttentionState total;
        for (int64_t s = 0; s < num_splits; ++s) {
          total.merge(states[head_splits[s].first_row + row]);
        }
        const int64_t token = first_token + row / group_size;
        const int64_t head = kv_head * group_size + row % group_size;
        float* token_output =
            output + (token * shape.num_q_heads + head) * head_dim;
        for (int64_t s = 0; s < num_splits; ++s) {
          const int64_t split_row = head_splits[s].first_row + row;
          const float share = states[split_row].share_of(total);
          const float* split_output = outputs + split_row * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) {
            token_output[d] += share * split_output[d];
          }
        }
        lse[head * shape.num_tokens + token] = total.lse();
      }
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> paged_prefix_attention_cpu(
    const at::Tensor& query, const at::Tensor& key_cache,
    const at::Tensor& value_cache, const at::Tensor& block_table,
    const at::Tensor& prefix_lens, const at::Tensor& query_start_loc,
    double scale) {
  const PagedPrefixAttentionShape shape = check_paged_prefix_attention_inputs(
      query, key_cache, value_cache, block_table, prefix_lens,
      query_start_loc);
  const at::Tensor block_table_c = block_table.contiguous();
  const at::Tensor prefix_lens_c = prefix_lens.contiguous();
  const at::Tensor query_start_loc_c = query_start_loc.contiguous();
  const int32_t* block_table_ptr = block_table_c.data_ptr<int32_t>();
  const int32_t* prefix_lens_ptr = prefix_lens_c.data_ptr<int32_t>();
  const int32_t* query_start_loc_ptr = query_start_loc_c.data_ptr<int32_t>();
  check_requests(shape, block_table_ptr, prefix_lens_ptr, query_start_loc_ptr);
  const SplitPlan plan =
      plan_splits(shape, prefix_lens_ptr, query_start_loc_ptr);

  const at::Tensor scaled_query = (query.to(at::kFloat) * scale).contiguous();
  std::vector<AttentionState> states(plan.num_rows);
  std::vector<float> outputs(plan.num_rows * shape.head_dim);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, key_cache.scalar_type(),
      "paged_prefix_attention_cpu", [&] {
        attend_splits<scalar_t>(
            shape, plan, scaled_query.data_ptr<float>(),
            key_cache.data_ptr<scalar_t>(), strides_of(key_cache),
            value_cache.data_ptr<scalar_t>(), strides_of(value_cache),
            block_table_ptr, prefix_lens_ptr, query_start_loc_ptr,
            states.data(), outputs.data());
      });

  const at::TensorOptions float_options = query.options().dtype(at::kFloat);
  at::Tensor output = at::zeros(
      {shape.num_tokens, shape.num_q_heads, shape.head_dim}, float_options);
  at::Tensor lse =
      at::full({shape.num_q_heads, shape.num_tokens},
               -std::numeric_limits<float>::infinity(), float_options);
  combine_splits(shape, plan, query_start_loc_ptr, states.data(),
                 outputs.data(), output.data_ptr<float>(),
                 lse.data_ptr<float>());
  return {output, lse};
}

}  // namespace specextend
