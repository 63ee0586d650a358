// The CPU entry point of specextend::merge_attention_states, registered in
// bindings.cpp.
#pragma once

#include <ATen/ATen.h>

namespace specextend {

// output [T, H, D] = the attention over the keys of both parts, from each
// part's output [T, H, D] and log-sum-exp [H, T]; 0 where both parts are empty
// (lse -inf; +inf counts as -inf, as in vLLM's merge_attn_states). See
// specextend_vllm/ops/merge_attention_states.py.
void merge_attention_states_cpu(at::Tensor& output,
                                const at::Tensor& prefix_output,
                                const at::Tensor& prefix_lse,
                                const at::Tensor& suffix_output,
                                const at::Tensor& suffix_lse);

}  // namespace specextend
