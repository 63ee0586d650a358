// CUDA chunk scores for Cross-model Retrieval, in three passes: the logits of
// every (request, query head, token), each row's log-sum-exp, and per (request,
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

// Merge over the thread block; every thread gets the result.
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
  return warp_merge(lane < kWarpsPerBlock
                        ? AttentionState{warp_maxes[lane], warp_denominators[lane]}
                        : AttentionState{});
}

__device__ __forceinline__ int context_len(const ChunkScoresParams& p, int b) {
  return min(max(p.context_lens[b], 0), p.max_tokens);
}

// One warp per (token, kv head): logits[b, h, t] = scale * q[b, h] . k[t] for
// the query heads h of that kv head. Grid: (token tiles, kv heads, batch).
template <typename KeyT>
__global__ void logits_kernel(const ChunkScoresParams p) {
  const int b = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (t >= context_len(p, b)) {
    return;
  }
  const int64_t block = p.block_table[b * p.block_table_stride + t / p.block_size];
  const KeyT* key = static_cast<const KeyT*>(p.key_cache.data) +
                    block * p.key_cache.stride_block +
                    (t % p.block_size) * p.key_cache.stride_token +
                    kv_head * p.key_cache.stride_head;
  const int group_size = p.num_q_heads / p.num_kv_heads;
  for (int g = 0; g < group_size; ++g) {
    const int64_t row = static_cast<int64_t>(b) * p.num_q_heads + kv_head * group_size + g;
    const float* q = p.query + row * p.head_dim;
    float partial = 0.0f;
    for (int d = lane; d < p.head_dim; d += kWarpSize) {
      partial += q[d] * to_float(key[d * p.key_cache.stride_dim]);
    }
    const float dot = warp_sum(partial);
    if (lane == 0) {
      p.logits[row * p.max_tokens + t] = p.scale * dot;
    }
  }
}

// One thread block per row (b, h): row_lse[b, h] = log-sum-exp of
// logits[b, h, :L_b].
__global__ void row_lse_kernel(const ChunkScoresParams p) {
  const int row = blockIdx.x;
  const int row_len = context_len(p, row / p.num_q_heads);
  const float* row_logits = p.logits + static_cast<int64_t>(row) * p.max_tokens;
  AttentionState state;
  for (int t = threadIdx.x; t < row_len; t += blockDim.x) {
    state.update(row_logits[t]);
  }
  state = block_merge(state);
  if (threadIdx.x == 0) {
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
  const dim3 grid((params.max_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock,
                  params.num_kv_heads, params.batch);
  logits_kernel<KeyT><<<grid, kThreadsPerBlock, 0, stream>>>(params);
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
  row_lse_kernel<<<params.batch * params.num_q_heads, kThreadsPerBlock, 0,
                   stream>>>(params);
  chunk_average_kernel<<<dim3(params.num_chunks, params.batch),
                         kThreadsPerBlock, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace specextend
