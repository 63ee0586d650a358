// Attention among the tokens a step verifies, from their own keys and values,
// under a per-request mask: the tree half of hybrid tree attention. A step
// verifies a few tokens per request (up to a tree's nodes + 1), so each (token,
// query head) row is one small dot-product loop; what this kernel saves is the
// dozens of small torch calls of the same computation.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "common/attention_state.h"
#include "tree_attention/cpu.h"

namespace specextend {
namespace {

void check_inputs(const at::Tensor& query, const at::Tensor& key,
                  const at::Tensor& value, const at::Tensor& query_start_loc,
                  int64_t max_query_len,
                  const std::optional<at::Tensor>& ancestor_mask) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "tree_attention: query, key and value must be [T, H, D], got ",
              query.sizes(), ", ", key.sizes(), " and ", value.sizes());
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == query.size(0) &&
                  key.size(2) == query.size(2),
              "tree_attention: key and value must be [T, Hkv, D] for query ",
              query.sizes(), ", got ", key.sizes(), " and ", value.sizes());
  TORCH_CHECK(key.size(1) > 0 && query.size(1) % key.size(1) == 0,
              "tree_attention: num query heads ", query.size(1),
              " must be a multiple of num kv heads ", key.size(1));
  TORCH_CHECK(query_start_loc.dim() == 1 &&
                  query_start_loc.scalar_type() == at::kInt &&
                  query_start_loc.size(0) >= 1,
              "tree_attention: query_start_loc must be a 1-D int32 tensor of "
              "R + 1 offsets, got ",
              query_start_loc.sizes(), " ", query_start_loc.scalar_type());
  if (ancestor_mask.has_value()) {
    const at::Tensor& mask = *ancestor_mask;
    TORCH_CHECK(mask.dim() == 3 && mask.scalar_type() == at::kBool &&
                    mask.size(0) >= query_start_loc.size(0) - 1 &&
                    mask.size(1) >= max_query_len &&
                    mask.size(2) >= max_query_len,
                "tree_attention: ancestor_mask must be [R, L, L] bool with L "
                ">= max_query_len = ",
                max_query_len, ", got ", mask.sizes(), " ",
                mask.scalar_type());
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> tree_attention_cpu(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& query_start_loc, int64_t max_query_len, double scale,
    const std::optional<at::Tensor>& ancestor_mask) {
  check_inputs(query, key, value, query_start_loc, max_query_len,
               ancestor_mask);
  const int64_t num_tokens = query.size(0);
  const int64_t num_q_heads = query.size(1);
  const int64_t num_kv_heads = key.size(1);
  const int64_t head_dim = query.size(2);
  const int64_t group_size = num_q_heads / num_kv_heads;
  const int64_t num_requests = query_start_loc.size(0) - 1;

  const at::Tensor q = query.to(at::kFloat).contiguous();
  const at::Tensor k = key.to(at::kFloat).contiguous();
  const at::Tensor v = value.to(at::kFloat).contiguous();
  const at::Tensor starts = query_start_loc.contiguous();
  const int32_t* start_ptr = starts.data_ptr<int32_t>();
  at::Tensor mask;
  if (ancestor_mask.has_value()) {
    mask = ancestor_mask->contiguous();
  }
  const bool* mask_ptr = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t mask_rows = mask.defined() ? mask.size(1) : 0;
  const int64_t mask_columns = mask.defined() ? mask.size(2) : 0;

  // request_of[t]: the request of token t, -1 for rows past the last request.
  std::vector<int64_t> request_of(num_tokens, -1);
  for (int64_t r = 0; r < num_requests; ++r) {
    TORCH_CHECK(start_ptr[r] <= start_ptr[r + 1] &&
                    start_ptr[r + 1] <= num_tokens &&
                    start_ptr[r + 1] - start_ptr[r] <= max_query_len,
                "tree_attention: query_start_loc must be non-decreasing, at "
                "most T = ",
                num_tokens, " and at most max_query_len = ", max_query_len,
                " apart, got ", start_ptr[r], " and ", start_ptr[r + 1]);
    for (int64_t t = start_ptr[r]; t < start_ptr[r + 1]; ++t) {
      request_of[t] = r;
    }
  }

  at::Tensor output =
      at::zeros({num_tokens, num_q_heads, head_dim}, q.options());
  at::Tensor lse = at::full({num_q_heads, num_tokens},
                            -std::numeric_limits<float>::infinity(),
                            q.options());
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = k.data_ptr<float>();
  const float* v_ptr = v.data_ptr<float>();
  float* output_ptr = output.data_ptr<float>();
  float* lse_ptr = lse.data_ptr<float>();
  const float scale_f = static_cast<float>(scale);

  const int64_t num_rows = num_tokens * num_q_heads;
  const int64_t work = num_rows * max_query_len * head_dim * 2;
  const int64_t grain_size =
      work < at::internal::GRAIN_SIZE ? std::max<int64_t>(num_rows, 1) : 1;
  at::parallel_for(0, num_rows, grain_size, [&](int64_t begin, int64_t end) {
    std::vector<float> logits(max_query_len);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / num_q_heads;
      const int64_t head = row % num_q_heads;
      const int64_t r = request_of[t];
      if (r < 0) {
        continue;
      }
      const int64_t first = start_ptr[r];
      const int64_t length = start_ptr[r + 1] - first;
      const int64_t i = t - first;
      const int64_t kv_head = head / group_size;
      const float* query_row = q_ptr + (t * num_q_heads + head) * head_dim;
      AttentionState state;
      for (int64_t j = 0; j < length; ++j) {
        const bool allowed =
            mask_ptr == nullptr
                ? j <= i
                : mask_ptr[(r * mask_rows + i) * mask_columns + j];
        if (!allowed) {
          logits[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* key_row =
            k_ptr + ((first + j) * num_kv_heads + kv_head) * head_dim;
        float dot = 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) {
          dot += query_row[d] * key_row[d];
        }
        logits[j] = dot * scale_f;
        state.update(logits[j]);
      }
      if (state.denominator == 0.0f) {
        continue;
      }
      float* out = output_ptr + (t * num_q_heads + head) * head_dim;
      for (int64_t j = 0; j < length; ++j) {
        if (logits[j] == -std::numeric_limits<float>::infinity()) {
          continue;
        }
        const float weight =
            std::exp(logits[j] - state.max_logit) / state.denominator;
        const float* value_row =
            v_ptr + ((first + j) * num_kv_heads + kv_head) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) {
          out[d] += weight * value_row[d];
        }
      }
      lse_ptr[head * num_tokens + t] = state.lse();
    }
  });
  return {output, lse};
}

}  // namespace specextend
