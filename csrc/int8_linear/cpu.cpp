// A linear layer with int8 weights (one scale per output row) for a few rows
// of fp32 activations, each quantized to int8 with one scale per row (the
// W8A8 "per channel, dynamic per token" scheme): a matrix-vector product that
// streams the weights once, for the small batches of a draft model's decoding
// steps. The integer dot products are exact, so the result is reproducible to
// the bit by the reference (specextend_vllm/ops/int8_linear.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "int8_linear/cpu.h"

namespace specextend {
namespace {

// Weight rows per task: enough work to share between threads, few enough
// that a layer with 896 rows still splits evenly over them.
constexpr int64_t kRowsPerTask = 16;
// Weight rows multiplied together (kRowsPerTask is a multiple).
constexpr int64_t kRowsPerBlock = 4;

// row [K] -> its values quantized to int8, rounded half to even, plus 128
// (as uint8), and the row's scale: amax / 127 (all 128 for an all-zero row).
float quantize_row(const float* row, int64_t size, uint8_t* shifted) {
  float amax = 0.0f;
  for (int64_t k = 0; k < size; ++k) amax = std::max(amax, std::abs(row[k]));
  const float scale = amax / 127.0f;
  for (int64_t k = 0; k < size; ++k) {
    const int32_t value =
        scale == 0.0f ? 0 : static_cast<int32_t>(std::nearbyint(row[k] / scale));
    shifted[k] = static_cast<uint8_t>(value + 128);
  }
  return scale;
}

// sums[m * kRowsPerBlock + r] = dot(quantized activation row m, weight row r)
// for kRowsPerBlock weight rows of `size` values, in exact integer arithmetic;
// activation rows arrive shifted by +128.
void dot_rows_portable(const uint8_t* shifted_activations, int64_t num_rows,
                       const int8_t* weights, int64_t size, int32_t* sums) {
  for (int64_t m = 0; m < num_rows; ++m) {
    for (int64_t r = 0; r < kRowsPerBlock; ++r) {
      int32_t sum = 0;
      for (int64_t k = 0; k < size; ++k) {
        sum += (static_cast<int32_t>(shifted_activations[m * size + k]) - 128) *
               static_cast<int32_t>(weights[r * size + k]);
      }
      sums[m * kRowsPerBlock + r] = sum;
    }
  }
}

#if defined(__x86_64__)
// dot_rows_portable with AVX-512 VNNI's unsigned-by-signed byte multiply-add
// (vpdpbusd: 64 products a instruction). It takes the activations shifted to
// unsigned and subtracts 128 * the weight row's sum, summed by the same
// instruction from a vector of ones. Every (activation row, weight row) pair
// has its own accumulator so the multiply-adds do not wait for each other;
// activation rows go 4 at a time; the weight rows are prefetched two blocks
// ahead (the hardware prefetcher alone left a core at ~10 GB/s here).
//
// Example, one 64-value stretch: activations q = [1, -2, 0, ...] arrive as
// [129, 126, 128, ...]; with weights w = [3, 4, 5, ...] the shifted products
// sum to 129*3 + 126*4 + 128*5 + ... and 128 * (3 + 4 + 5 + ...) is taken off,
// leaving 1*3 - 2*4 + 0*5 + ... = dot(q, w).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void dot_rows_avx512(
    const uint8_t* shifted_activations, int64_t num_rows, const int8_t* weights,
    int64_t size, int32_t* sums) {
  constexpr int64_t kActivationRowsPerPass = 4;
  constexpr int64_t kPrefetchBlocks = 2;
  const int64_t vector_end = size - size % 64;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t first = 0; first < num_rows; first += kActivationRowsPerPass) {
    const int64_t rows = std::min(kActivationRowsPerPass, num_rows - first);
    __m512i accumulators[kActivationRowsPerPass][kRowsPerBlock];
    __m512i weight_sums[kRowsPerBlock];
    for (int64_t r = 0; r < kRowsPerBlock; ++r) {
      weight_sums[r] = _mm512_setzero_si512();
      for (int64_t m = 0; m < kActivationRowsPerPass; ++m) {
        accumulators[m][r] = _mm512_setzero_si512();
      }
    }
    for (int64_t k = 0; k < vector_end; k += 64) {
      __m512i weight_values[kRowsPerBlock];
      for (int64_t r = 0; r < kRowsPerBlock; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(
                         weights + (r + kPrefetchBlocks * kRowsPerBlock) * size + k),
                     _MM_HINT_T0);
        weight_values[r] = _mm512_loadu_si512(weights + r * size + k);
        weight_sums[r] = _mm512_dpbusd_epi32(weight_sums[r], ones, weight_values[r]);
      }
      for (int64_t m = 0; m < rows; ++m) {
        const __m512i activation_values =
            _mm512_loadu_si512(shifted_activations + (first + m) * size + k);
        for (int64_t r = 0; r < kRowsPerBlock; ++r) {
          accumulators[m][r] = _mm512_dpbusd_epi32(
              accumulators[m][r], activation_values, weight_values[r]);
        }
      }
    }
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t r = 0; r < kRowsPerBlock; ++r) {
        int32_t sum = _mm512_reduce_add_epi32(accumulators[m][r]) -
                      128 * _mm512_reduce_add_epi32(weight_sums[r]);
        for (int64_t k = vector_end; k < size; ++k) {
          sum += (static_cast<int32_t>(
                      shifted_activations[(first + m) * size + k]) -
                  128) *
                 static_cast<int32_t>(weights[r * size + k]);
        }
        sums[(first + m) * kRowsPerBlock + r] = sum;
      }
    }
  }
}
#endif

using DotRows = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t,
                         int32_t*);

DotRows pick_dot_rows() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni")) {
    return dot_rows_avx512;
  }
#endif
  return dot_rows_portable;
}

}  // namespace

at::Tensor int8_linear_cpu(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& weight_scales,
                           const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat,
              "int8_linear: input must be a 2-D float32 tensor, got ",
              input.sizes(), " ", input.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar &&
                  weight.is_contiguous(),
              "int8_linear: weight must be a contiguous 2-D int8 tensor, got ",
              weight.sizes(), " ", weight.scalar_type());
  const int64_t num_rows = input.size(0);
  const int64_t in_features = input.size(1);
  const int64_t out_features = weight.size(0);
  TORCH_CHECK(weight.size(1) == in_features, "int8_linear: weight is [",
              out_features, ", ", weight.size(1), "], input has ", in_features,
              " features");
  TORCH_CHECK(weight_scales.dim() == 1 &&
                  weight_scales.size(0) == out_features &&
                  weight_scales.scalar_type() == at::kFloat,
              "int8_linear: weight_scales must be [", out_features,
              "] float32, got ", weight_scales.sizes(), " ",
              weight_scales.scalar_type());
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_features &&
                    bias->scalar_type() == at::kFloat,
                "int8_linear: bias must be [", out_features,
                "] float32, got ", bias->sizes(), " ", bias->scalar_type());
  }
  for (const at::Tensor* tensor : {&weight, &weight_scales}) {
    TORCH_CHECK(tensor->device() == input.device(),
                "int8_linear: all inputs must be on the device of input");
  }

  const at::Tensor rows = input.contiguous();
  const at::Tensor scales = weight_scales.contiguous();
  at::Tensor output = at::empty({num_rows, out_features}, input.options());

  std::vector<uint8_t> quantized(num_rows * in_features);
  std::vector<float> row_scales(num_rows);
  for (int64_t m = 0; m < num_rows; ++m) {
    row_scales[m] = quantize_row(rows.data_ptr<float>() + m * in_features,
                                 in_features, &quantized[m * in_features]);
  }

  const int8_t* weight_data = weight.data_ptr<int8_t>();
  const float* scale_data = scales.data_ptr<float>();
  float* output_data = output.data_ptr<float>();
  const int64_t num_tasks = (out_features + kRowsPerTask - 1) / kRowsPerTask;
  static const DotRows dot_rows = pick_dot_rows();
  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> padded_rows;  // a last block short of kRowsPerBlock rows
    std::vector<int32_t> sums(num_rows * kRowsPerBlock);
    for (int64_t block = begin * kRowsPerTask / kRowsPerBlock;
         block * kRowsPerBlock < std::min(end * kRowsPerTask, out_features);
         ++block) {
      const int64_t first = block * kRowsPerBlock;
      const int64_t block_rows = std::min(kRowsPerBlock, out_features - first);
      const int8_t* weight_rows = weight_data + first * in_features;
      if (block_rows < kRowsPerBlock) {
        padded_rows.assign(kRowsPerBlock * in_features, 0);
        std::copy(weight_rows, weight_rows + block_rows * in_features,
                  padded_rows.begin());
        weight_rows = padded_rows.data();
      }
      dot_rows(quantized.data(), num_rows, weight_rows, in_features,
               sums.data());
      for (int64_t m = 0; m < num_rows; ++m) {
        for (int64_t r = 0; r < block_rows; ++r) {
          output_data[m * out_features + first + r] =
              static_cast<float>(sums[m * kRowsPerBlock + r]) * row_scales[m] *
              scale_data[first + r];
        }
      }
    }
  });
  // Added apart, so that no compiler contracts it with the scaling into one
  // fused multiply-add, which the reference does not round alike.
  if (bias.has_value()) output.add_(*bias);
  return output;
}

}  // namespace specextend
