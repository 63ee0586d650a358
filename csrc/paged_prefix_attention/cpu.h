// The CPU entry point of specextend::paged_prefix_attention, registered in
// bindings.cpp.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace specextend {

// (output [T, Hq, D] float32, lse [Hq, T] float32) of query [T, Hq, D] over
// the paged keys and values key_cache, value_cache [num_blocks, block_size,
// Hkv, D] (any strides) of each request's prefix, named by block_table [R, W]
// int32 for prefix_lens [R] int32; request r's query rows are
// query_start_loc[r]..query_start_loc[r + 1] - 1. See
// specextend_vllm/ops/paged_prefix_attention.py.
std::tuple<at::Tensor, at::Tensor> paged_prefix_attention_cpu(
    const at::Tensor& query, const at::Tensor& key_cache,
    const at::Tensor& value_cache, const at::Tensor& block_table,
    const at::Tensor& prefix_lens, const at::Tensor& query_start_loc,
    double scale);

}  // namespace specextend
