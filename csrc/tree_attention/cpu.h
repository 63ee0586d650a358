// The CPU entry point of specextend::tree_attention, registered in bindings.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace specextend {

// (output [T, Hq, D] float32, lse [Hq, T] float32) of each request's query
// tokens over its own new tokens: rows query_start_loc[r]..query_start_loc[r +
// 1] - 1 of query [T, Hq, D] attend to the same rows of key, value [T, Hkv, D],
// row i to row j where ancestor_mask[r, i, j] ([R, L, L] bool, L >=
// max_query_len), or j <= i without a mask. See
// specextend_vllm/ops/tree_attention.py.
std::tuple<at::Tensor, at::Tensor> tree_attention_cpu(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& query_start_loc, int64_t max_query_len, double scale,
    const std::optional<at::Tensor>& ancestor_mask);

}  // namespace specextend
