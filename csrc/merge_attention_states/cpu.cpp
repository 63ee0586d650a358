// Merges two attention outputs over disjoint sets of keys by their
// log-sum-exps, exactly: each row is the mean of the two weighted by its
// share of the softmax mass (AttentionState::share_of).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "common/attention_state.h"
#include "merge_attention_states/cpu.h"

namespace specextend {
namespace {

// A part's state from its log-sum-exp: max_logit lse, denominator 1 (empty at
// +-inf).
AttentionState state_of(float lse) {
  if (std::isinf(lse)) {
    return {};
  }
  return {lse, 1.0f};
}

}  // namespace

void merge_attention_states_cpu(at::Tensor& output,
                                const at::Tensor& prefix_output,
                                const at::Tensor& prefix_lse,
                                const at::Tensor& suffix_output,
                                const at::Tensor& suffix_lse) {
  TORCH_CHECK(output.dim() == 3 && prefix_output.sizes() == output.sizes() &&
                  suffix_output.sizes() == output.sizes(),
              "merge_attention_states: output, prefix_output and "
              "suffix_output must be [T, H, D] alike, got ",
              output.sizes(), ", ", prefix_output.sizes(), " and ",
              suffix_output.sizes());
  const int64_t num_tokens = output.size(0);
  const int64_t num_heads = output.size(1);
  const int64_t head_dim = output.size(2);
  TORCH_CHECK(prefix_lse.dim() == 2 && prefix_lse.size(0) == num_heads &&
                  prefix_lse.size(1) == num_tokens &&
                  suffix_lse.sizes() == prefix_lse.sizes(),
              "merge_attention_states: prefix_lse and suffix_lse must be [H, "
              "T] = [",
              num_heads, ", ", num_tokens, "], got ", prefix_lse.sizes(),
              " and ", suffix_lse.sizes());
  TORCH_CHECK(output.is_contiguous(),
              "merge_attention_states: output must be contiguous");
  const at::Tensor prefix = prefix_output.to(at::kFloat).contiguous();
  const at::Tensor suffix = suffix_output.to(at::kFloat).contiguous();
  const at::Tensor prefix_lse_f = prefix_lse.to(at::kFloat).contiguous();
  const at::Tensor suffix_lse_f = suffix_lse.to(at::kFloat).contiguous();
  const float* prefix_ptr = prefix.data_ptr<float>();
  const float* suffix_ptr = suffix.data_ptr<float>();
  const float* prefix_lse_ptr = prefix_lse_f.data_ptr<float>();
  const float* suffix_lse_ptr = suffix_lse_f.data_ptr<float>();
  const int64_t num_rows = num_tokens * num_heads;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, output.scalar_type(),
      "merge_attention_states_cpu", [&] {
        scalar_t* output_ptr = output.data_ptr<scalar_t>();
        const int64_t grain_size =
            num_rows * head_dim < at::internal::GRAIN_SIZE
                ? std::max<int64_t>(num_rows, 1)
                : 1;
        at::parallel_for(0, num_rows, grain_size, [&](int64_t begin,
                                                      int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t t = row / num_heads;
            const int64_t head = row % num_heads;
            const AttentionState prefix_state =
                state_of(prefix_lse_ptr[head * num_tokens + t]);
            const AttentionState suffix_state =
                state_of(suffix_lse_ptr[head * num_tokens + t]);
            AttentionState total = prefix_state;
            total.merge(suffix_state);
            const float prefix_share =
                prefix_state.denominator == 0.0f
                    ? 0.0f
                    : prefix_state.share_of(total);
            const float suffix_share =
                suffix_state.denominator == 0.0f
                    ? 0.0f
                    : suffix_state.share_of(total);
            const float* prefix_row = prefix_ptr + row * head_dim;
            const float* suffix_row = suffix_ptr + row * head_dim;
            scalar_t* out = output_ptr + row * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) {
              out[d] = static_cast<scalar_t>(prefix_share * prefix_row[d] +
                                             suffix_share * suffix_row[d]);
            }
          }
        });
      });
}

}  // namespace specextend
