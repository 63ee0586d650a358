// CUDA chunk scores for Cross-model Retrieval, in three passes over a float
// scratch buffer: logits, per-(request, head) softmax statistics, per-(request,
// chunk) averages. No torch dependency; see specextend_chunk_scores_cuda.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kWarpSize = 32;
constexpr int kThreadsPerBlock = 256;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;

struct KeyCacheView {
  const void* data;
  int64_t stride_block;
  int64_t stride_token;
  int64_t stride_head;
  int64_t stride_dim;
};

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__half value) {
  return __half2float(value);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sum (or max) over the thread block; every thread gets the result.
template <bool kIsMax>
__device__ float block_reduce(float value) {
  __shared__ float warp_results[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  value = kIsMax ? warp_max(value) : warp_sum(value);
  if (lane == 0) {
    warp_results[warp] = value;
  }
  __syncthreads();
  const float identity = kIsMax ? -INFINITY : 0.0f;
  value = lane < kWarpsPerBlock ? warp_results[lane] : identity;
  value = kIsMax ? warp_max(value) : warp_sum(value);
  __syncthreads();
  return value;
}

__device__ __forceinline__ int clamped_context_len(const int32_t* context_lens,
                                                   int b, int max_tokens) {
  return min(max(context_lens[b], 0), max_tokens);
}

// One warp per (token, kv head): logits[b, h, t] = scale * q[b, h] . k[t] for
// the query heads h of that kv head. Grid: (token tiles, kv heads, batch).
template <typename KeyT>
__global__ void logits_kernel(const float* __restrict__ query,
                              KeyCacheView key_cache,
                              const int32_t* __restrict__ block_table,
                              int64_t block_table_stride,
                              const int32_t* __restrict__ context_lens,
                              int num_q_heads, int num_kv_heads, int head_dim,
                              int block_size, int max_tokens, float scale,
                              float* __restrict__ logits) {
  const int b = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (t >= clamped_context_len(context_lens, b, max_tokens)) {
    return;
  }
  const int64_t block = block_table[b * block_table_stride + t / block_size];
  const KeyT* key = static_cast<const KeyT*>(key_cache.data) +
                    block * key_cache.stride_block +
                    (t % block_size) * key_cache.stride_token +
                    kv_head * key_cache.stride_head;
  const int group_size = num_q_heads / num_kv_heads;
  for (int g = 0; g < group_size; ++g) {
    const int h = kv_head * group_size + g;
    const float* q = query + (static_cast<int64_t>(b) * num_q_heads + h) * head_dim;
    float partial = 0.0f;
    for (int d = lane; d < head_dim; d += kWarpSize) {
      partial += q[d] * to_float(key[d * key_cache.stride_dim]);
    }
    const float dot = warp_sum(partial);
    if (lane == 0) {
      logits[(static_cast<int64_t>(b) * num_q_heads + h) * max_tokens + t] =
          scale * dot;
    }
  }
}

// One thread block per (b, h): row_max[b, h] and inv_denominator[b, h] of the
// softmax over logits[b, h, :L_b].
__global__ void softmax_stats_kernel(const float* __restrict__ logits,
                                     const int32_t* __restrict__ context_lens,
                                     int num_q_heads, int max_tokens,
                                     float* __restrict__ row_max,
                                     float* __restrict__ inv_denominator) {
  const int row = blockIdx.x;
  const int context_len =
      clamped_context_len(context_lens, row / num_q_heads, max_tokens);
  const float* row_logits = logits + static_cast<int64_t>(row) * max_tokens;
  float local_max = -INFINITY;
  for (int t = threadIdx.x; t < context_len; t += blockDim.x) {
    local_max = fmaxf(local_max, row_logits[t]);
  }
  const float max_logit = block_reduce<true>(local_max);
  float local_sum = 0.0f;
  for (int t = threadIdx.x; t < context_len; t += blockDim.x) {
    local_sum += expf(row_logits[t] - max_logit);
  }
  const float denominator = block_reduce<false>(local_sum);
  if (threadIdx.x == 0) {
    row_max[row] = max_logit;
    inv_denominator[row] = 1.0f / denominator;
  }
}

// One thread block per (b, chunk): mean over heads and chunk tokens of the
// softmax probabilities, or -inf for chunks past the context.
__global__ void chunk_average_kernel(const float* __restrict__ logits,
                                     const float* __restrict__ row_max,
                                     const float* __restrict__ inv_denominator,
                                     const int32_t* __restrict__ context_lens,
                                     int num_q_heads, int max_tokens,
                                     int chunk_size, int num_chunks,
                                     float* __restrict__ scores) {
  const int b = blockIdx.y;
  const int chunk = blockIdx.x;
  const int first_token = chunk * chunk_size;
  const int context_len = clamped_context_len(context_lens, b, max_tokens);
  const int chunk_tokens = min(chunk_size, context_len - first_token);
  float* score = scores + static_cast<int64_t>(b) * num_chunks + chunk;
  if (chunk_tokens <= 0) {
    if (threadIdx.x == 0) {
      *score = -INFINITY;
    }
    return;
  }
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < num_q_heads * chunk_tokens; i += blockDim.x) {
    const int row = b * num_q_heads + i / chunk_tokens;
    const int t = first_token + i % chunk_tokens;
    local_sum +=
        expf(logits[static_cast<int64_t>(row) * max_tokens + t] - row_max[row]) *
        inv_denominator[row];
  }
  const float total = block_reduce<false>(local_sum);
  if (threadIdx.x == 0) {
    *score = total / static_cast<float>(num_q_heads * chunk_tokens);
  }
}

template <typename KeyT>
void launch_logits(const float* query, KeyCacheView key_cache,
                   const int32_t* block_table, int64_t block_table_stride,
                   const int32_t* context_lens, int batch, int num_q_heads,
                   int num_kv_heads, int head_dim, int block_size,
                   int max_tokens, float scale, float* logits,
                   cudaStream_t stream) {
  const dim3 grid((max_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock,
                  num_kv_heads, batch);
  logits_kernel<KeyT><<<grid, kThreadsPerBlock, 0, stream>>>(
      query, key_cache, block_table, block_table_stride, context_lens,
      num_q_heads, num_kv_heads, head_dim, block_size, max_tokens, scale,
      logits);
}

}  // namespace

// Computes scores[b, c] (see the op's documentation) on `stream`.
//   query: [batch, num_q_heads, head_dim] float32, contiguous.
//   key_cache: element strides of the [num_blocks, block_size, num_kv_heads,
//     head_dim] view; key_dtype 0 = float32, 1 = float16, 2 = bfloat16.
//   block_table: int32 rows of block_table_stride elements; context_lens:
//     int32 [batch], clamped to [0, max_tokens].
//   max_tokens: an upper bound of every context length.
//   scratch: batch * num_q_heads * (max_tokens + 2) floats.
//   scores: [batch, num_chunks] float32, contiguous.
// Returns the launch error, or cudaErrorInvalidValue for an unknown key_dtype.
extern "C" cudaError_t specextend_chunk_scores_cuda(
    const float* query, const void* key_cache, int key_dtype,
    int64_t key_stride_block, int64_t key_stride_token, int64_t key_stride_head,
    int64_t key_stride_dim, const int32_t* block_table,
    int64_t block_table_stride, const int32_t* context_lens, int batch,
    int num_q_heads, int num_kv_heads, int head_dim, int block_size,
    int max_tokens, int chunk_size, int num_chunks, float scale,
    float* scratch, float* scores, cudaStream_t stream) {
  if (batch == 0 || num_chunks == 0) {
    return cudaSuccess;
  }
  const KeyCacheView key_view{key_cache, key_stride_block, key_stride_token,
                              key_stride_head, key_stride_dim};
  const int64_t num_rows = static_cast<int64_t>(batch) * num_q_heads;
  float* logits = scratch;
  float* row_max = logits + num_rows * max_tokens;
  float* inv_denominator = row_max + num_rows;

  switch (key_dtype) {
    case 0:
      launch_logits<float>(query, key_view, block_table, block_table_stride,
                           context_lens, batch, num_q_heads, num_kv_heads,
                           head_dim, block_size, max_tokens, scale, logits,
                           stream);
      break;
    case 1:
      launch_logits<__half>(query, key_view, block_table, block_table_stride,
                            context_lens, batch, num_q_heads, num_kv_heads,
                            head_dim, block_size, max_tokens, scale, logits,
                            stream);
      break;
    case 2:
      launch_logits<__nv_bfloat16>(query, key_view, block_table,
                                   block_table_stride, context_lens, batch,
                                   num_q_heads, num_kv_heads, head_dim,
                                   block_size, max_tokens, scale, logits,
                                   stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  softmax_stats_kernel<<<num_rows, kThreadsPerBlock, 0, stream>>>(
      logits, context_lens, num_q_heads, max_tokens, row_max, inv_denominator);
  chunk_average_kernel<<<dim3(num_chunks, batch), kThreadsPerBlock, 0, stream>>>(
      logits, row_max, inv_denominator, context_lens, num_q_heads, max_tokens,
      chunk_size, num_chunks, scores);
  return cudaGetLastError();
}
