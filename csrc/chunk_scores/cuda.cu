// CUDA chunk scores for Cross-model Retrieval, in three passes: the logits of
// every (request, query head, token) with the softmax state of each tile of
// them, each row's log-sum-exp merged from its tiles' states, and per (request,
// chunk) the mean softmax probability over heads and chunk tokens.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "chunk_scores/cuda.h"
#include "common/attention_state.h"

namespace specextend {
namespace {

constexpr int kWarpSize = 32;
constexpr int kThreadsPerBlock = 256;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
constexpr unsigned kFullWarp = 0xffffffffu;
static_assert(kLogitsTileTokens == kThreadsPerBlock,
              "the logits pass merges its states with block_merge");

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__half value) {
  return __half2float(value);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullWarp, value, offset);
  }
  return value;
}

__device__ __forceinline__ AttentionState warp_merge(AttentionState state) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const AttentionState other{
        __shfl_xor_sync(kFullWarp, state.max_logit, offset),
        __shfl_xor_sync(kFullWarp, state.denominator, offset)};
    state.merge(other);
  }
  return state;
}

// Sum over the thread block; every thread gets the result.
__device__ float block_sum(float value) {
  __shared__ float warp_sums[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  value = warp_sum(value);
  if (lane == 0) {
    warp_sums[warp] = value;
  }
  __syncthreads();
  return warp_sum(lane < kWarpsPerBlock ? warp_sums[lane] : 0.0f);
}

// Merge over the thread block; every thread gets the result. Safe to call again
// right after: the shared slots are read before anyone writes them again.
__device__ AttentionState block_merge(AttentionState state) {
  __shared__ float warp_maxes[kWarpsPerBlock];
  __shared__ float warp_denominators[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  state = warp_merge(state);
  if (lane == 0) {
    warp_maxes[warp] = state.max_logit;
    warp_denominators[warp] = state.denominator;
  }
  __syncthreads();
  const AttentionState merged = warp_merge(
      lane < kWarpsPerBlock
          ? AttentionState{warp_maxes[lane], warp_denominators[lane]}
          : AttentionState{});
  __syncthreads();
  return merged;
}

__device__ __forceinline__ int context_len(const ChunkScoresParams& p, int b) {
  return min(max(p.context_lens[b], 0), p.max_tokens);
}

// The query heads of one kv head a thread takes at once: their partial dot
// products stay in registers.
constexpr int kGroupTile = 8;

// dots[g] += query[g, :] . key[:] for g < num_heads; query in shared memory
// ([num_heads, head_dim], scaled), key one token's row of one kv head. Rows whose
// elements are contiguous and 16-byte aligned are read 16 bytes at a time.
template <typename KeyT>
__device__ __forceinline__ void accumulate_dots(const KeyT* key,
                                                int64_t stride_dim,
                                                int head_dim,
                                                const float* query,
                                                int num_heads,
                                                float (&dots)[kGroupTile]) {
  constexpr int kVector = 16 / sizeof(KeyT);
  const bool vectorized = stride_dim == 1 && head_dim % kVector == 0 &&
                          reinterpret_cast<uintptr_t>(key) % 16 == 0;
  if (vectorized) {
    for (int d0 = 0; d0 < head_dim; d0 += kVector) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(key + d0));
      const KeyT* values = reinterpret_cast<const KeyT*>(&raw);
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        const float k = to_float(values[i]);
#pragma unroll
        for (int g = 0; g < kGroupTile; ++g) {
          if (g < num_heads) {
            dots[g] += query[g * head_dim + d0 + i] * k;
          }
        }
      }
    }
    return;
  }
  for (int d = 0; d < head_dim; ++d) {
    const float k = to_float(key[d * stride_dim]);
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      if (g < num_heads) {
        dots[g] += query[g * head_dim + d] * k;
      }
    }
  }
}

// One thread per (token, kv head): logits[b, h, t] = scale * q[b, h] . k[t] for
// the query heads h of that kv head, and per thread block (a tile of
// kLogitsTileTokens tokens) the softmax state of each head's logits there.
// Grid: (token tiles, kv heads, batch); dynamic shared memory: the kv head's
// query heads, [group_size, head_dim] floats.
template <typename KeyT>
__global__ void logits_kernel(const ChunkScoresParams p) {
  extern __shared__ float group_query[];
  const int b = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int row_len = context_len(p, b);
  const int first_token = blockIdx.x * kLogitsTileTokens;
  if (first_token >= row_len) {
    return;  // the whole tile is past the context: no state is read for it
  }
  const int group_size = p.num_q_heads / p.num_kv_heads;
  const int64_t first_row =
      static_cast<int64_t>(b) * p.num_q_heads + kv_head * group_size;
  for (int i = threadIdx.x; i < group_size * p.head_dim; i += blockDim.x) {
    group_query[i] = p.scale * p.query[first_row * p.head_dim + i];
  }
  __syncthreads();

  const int t = first_token + threadIdx.x;
  const bool in_context = t < row_len;
  const KeyT* key = nullptr;
  if (in_context) {
    const int64_t block =
        p.block_table[b * p.block_table_stride + t / p.block_size];
    key = static_cast<const KeyT*>(p.key_cache.data) +
          block * p.key_cache.stride_block +
          (t % p.block_size) * p.key_cache.stride_token +
          kv_head * p.key_cache.stride_head;
  }
  for (int g0 = 0; g0 < group_size; g0 += kGroupTile) {
    const int num_heads = min(kGroupTile, group_size - g0);
    float dots[kGroupTile] = {};
    if (in_context) {
      accumulate_dots(key, p.key_cache.stride_dim, p.head_dim,
                      group_query + g0 * p.head_dim, num_heads, dots);
    }
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      if (g < num_heads) {
        const int64_t row = first_row + g0 + g;
        AttentionState state;
        if (in_context) {
          p.logits[row * p.max_tokens + t] = dots[g];
          state.update(dots[g]);
        }
        state = block_merge(state);
        if (threadIdx.x == 0) {
          float* tile_state =
              p.tile_states + 2 * (row * p.num_token_tiles + blockIdx.x);
          tile_state[0] = state.max_logit;
          tile_state[1] = state.denominator;
        }
      }
    }
  }
}

// One warp per row (b, h): row_lse[b, h] = log-sum-exp of logits[b, h, :L_b],
// merged from the softmax states of the row's tiles in the context.
__global__ void row_lse_kernel(const ChunkScoresParams p) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= p.batch * p.num_q_heads) {
    return;
  }
  const int row_len = context_len(p, row / p.num_q_heads);
  const int num_tiles = (row_len + kLogitsTileTokens - 1) / kLogitsTileTokens;
  const float* row_states =
      p.tile_states + 2 * static_cast<int64_t>(row) * p.num_token_tiles;
  AttentionState state;
  for (int tile = lane; tile < num_tiles; tile += kWarpSize) {
    state.merge(AttentionState{row_states[2 * tile], row_states[2 * tile + 1]});
  }
  state = warp_merge(state);
  if (lane == 0) {
    p.row_lse[row] = state.lse();
  }
}

// One thread block per (b, chunk): mean over heads and chunk tokens of the
// softmax probabilities exp(logit - row_lse), or -inf for chunks past the
// context.
__global__ void chunk_average_kernel(const ChunkScoresParams p) {
  const int b = blockIdx.y;
  const int chunk = blockIdx.x;
  const int first_token = chunk * p.chunk_size;
  const int chunk_tokens = min(p.chunk_size, context_len(p, b) - first_token);
  float* score = p.scores + static_cast<int64_t>(b) * p.num_chunks + chunk;
  if (chunk_tokens <= 0) {
    if (threadIdx.x == 0) {
      *score = -INFINITY;
    }
    return;
  }
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < p.num_q_heads * chunk_tokens; i += blockDim.x) {
    const int64_t row = static_cast<int64_t>(b) * p.num_q_heads + i / chunk_tokens;
    const int t = first_token + i % chunk_tokens;
    local_sum += expf(p.logits[row * p.max_tokens + t] - p.row_lse[row]);
  }
  const float total = block_sum(local_sum);
  if (threadIdx.x == 0) {
    *score = total / static_cast<float>(p.num_q_heads * chunk_tokens);
  }
}

template <typename KeyT>
void launch_logits(const ChunkScoresParams& params, cudaStream_t stream) {
  const dim3 grid(params.num_token_tiles, params.num_kv_heads, params.batch);
  const size_t query_bytes = sizeof(float) * params.head_dim *
                             (params.num_q_heads / params.num_kv_heads);
  logits_kernel<KeyT>
      <<<grid, kLogitsTileTokens, query_bytes, stream>>>(params);
}

}  // namespace

cudaError_t launch_chunk_scores(const ChunkScoresParams& params,
                                cudaStream_t stream) {
  if (params.batch == 0 || params.num_chunks == 0) {
    return cudaSuccess;
  }
  switch (params.key_cache.dtype) {
    case KeyDType::kFloat32:
      launch_logits<float>(params, stream);
      break;
    case KeyDType::kFloat16:
      launch_logits<__half>(params, stream);
      break;
    case KeyDType::kBFloat16:
      launch_logits<__nv_bfloat16>(params, stream);
      break;
  }
  const int num_rows = params.batch * params.num_q_heads;
  row_lse_kernel<<<(num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock,
                   kThreadsPerBlock, 0, stream>>>(params);
  chunk_average_kernel<<<dim3(params.num_chunks, params.batch),
                         kThreadsPerBlock, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace specextend
