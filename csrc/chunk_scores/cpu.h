// The CPU entry point of specextend::chunk_scores, registered in bindings.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace specextend {

// scores [B, num_chunks] float32 of query [B, Hq, D] over the paged keys
// key_cache [num_blocks, block_size, Hkv, D] (any strides) named by block_table
// [B, W] int32 for context_lens [B] int32; see specextend_vllm/ops/chunk_scores.py.
at::Tensor chunk_scores_cpu(const at::Tensor& query, const at::Tensor& key_cache,
                            const at::Tensor& block_table,
                            const at::Tensor& context_lens, int64_t chunk_size,
                            double scale, int64_t num_chunks);

}  // namespace specextend
