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
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "int8_linear/cpu.h"

namespace specextend {
namespace {

// Weight rows per task: enough work to share between threads, few enough
// that a layer with 896 rows still splits evenly over them.
constexpr int64_t kRowsPerTask = 16;
// Weight rows whose dot products are summed up together (kRowsPerTask is a
// multiple).
constexpr int64_t kRowsPerBlock = 4;
// Values a vector step of the AVX-512 dot products takes; the activations'
// sums cover these stretches, the rest is added apart.
constexpr int64_t kValuesPerVector = 64;

// row [K] -> its values quantized to int8, rounded half to even, and the
// row's scale: amax / 127 (all zero for an all-zero row).
float quantize_row_portable(const float* row, int64_t size, int8_t* quantized) {
  float amax = 0.0f;
  for (int64_t k = 0; k < size; ++k) amax = std::max(amax, std::abs(row[k]));
  const float scale = amax / 127.0f;
  for (int64_t k = 0; k < size; ++k) {
    quantized[k] = scale == 0.0f
                       ? 0
                       : static_cast<int8_t>(std::nearbyint(row[k] / scale));
  }
  return scale;
}

// sums[m * kRowsPerBlock + r] = dot(quantized activation row m, weight row r)
// for kRowsPerBlock weight rows of `size` values, in exact integer arithmetic.
void dot_rows_portable(const int8_t* activations, const int32_t* /*vector_sums*/,
                       int64_t num_rows, const int8_t* weights, int64_t size,
                       int32_t* sums) {
  for (int64_t m = 0; m < num_rows; ++m) {
    for (int64_t r = 0; r < kRowsPerBlock; ++r) {
      int32_t sum = 0;
      for (int64_t k = 0; k < size; ++k) {
        sum += static_cast<int32_t>(activations[m * size + k]) *
               static_cast<int32_t>(weights[r * size + k]);
      }
      sums[m * kRowsPerBlock + r] = sum;
    }
  }
}

#if defined(__x86_64__)
// quantize_row_portable 16 values at a time: the same division and rounding
// (to nearest, ties to even), so the same bytes.
__attribute__((target("avx512f,avx512bw"))) float quantize_row_avx512(
    const float* row, int64_t size, int8_t* quantized) {
  const int64_t vector_end = size - size % 16;
  __m512 amax_lanes = _mm512_setzero_ps();
  for (int64_t k = 0; k < vector_end; k += 16) {
    amax_lanes = _mm512_max_ps(amax_lanes, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
  }
  float amax = _mm512_reduce_max_ps(amax_lanes);
  for (int64_t k = vector_end; k < size; ++k) amax = std::max(amax, std::abs(row[k]));
  const float scale = amax / 127.0f;
  if (scale == 0.0f) {
    std::fill(quantized, quantized + size, int8_t{0});
    return scale;
  }
  const __m512 scales = _mm512_set1_ps(scale);
  for (int64_t k = 0; k < vector_end; k += 16) {
    const __m512 rounded = _mm512_roundscale_ps(
        _mm512_div_ps(_mm512_loadu_ps(row + k), scales),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(quantized + k),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(rounded)));
  }
  for (int64_t k = vector_end; k < size; ++k) {
    quantized[k] = static_cast<int8_t>(std::nearbyint(row[k] / scale));
  }
  return scale;
}

// [sum of a[0]'s lanes, ..., sum of a[3]'s lanes].
__attribute__((target("avx512f"))) inline __m128i reduce_add_4(const __m512i* a) {
  const __m512i pairs_01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]),
                                            _mm512_unpackhi_epi32(a[0], a[1]));
  const __m512i pairs_23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]),
                                            _mm512_unpackhi_epi32(a[2], a[3]));
  // Each 128-bit lane now holds partial sums of a[0], a[1], a[2], a[3].
  const __m512i lanes = _mm512_add_epi32(_mm512_unpacklo_epi64(pairs_01, pairs_23),
                                         _mm512_unpackhi_epi64(pairs_01, pairs_23));
  const __m256i halves = _mm256_add_epi32(_mm512_castsi512_si256(lanes),
                                          _mm512_extracti64x4_epi64(lanes, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(halves),
                       _mm256_extracti128_si256(halves, 1));
}

// One weight row times `kRows` activation rows over the vector stretches:
// lanes[m] holds 16 partial sums of the products with activation row m, the
// weight row read as unsigned (see dot_rows_avx512). Each activation row's
// products go to two accumulators in turn, so that a multiply-add does not
// wait for the one before it.
template <int kRows>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void dot_weight_row(
    const int8_t* activations, int64_t size, int64_t vector_end,
    const int8_t* weight_row, __m512i* lanes) {
  constexpr int kSets = 2;
  constexpr int64_t kPrefetchBytes = 2048;
  const __m512i top_bits = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i accumulators[kSets][kRows];
  for (int set = 0; set < kSets; ++set) {
    for (int m = 0; m < kRows; ++m) accumulators[set][m] = _mm512_setzero_si512();
  }
  int64_t k = 0;
  for (; k + kSets * kValuesPerVector <= vector_end; k += kSets * kValuesPerVector) {
    for (int set = 0; set < kSets; ++set) {
      const int64_t at = k + set * kValuesPerVector;
      _mm_prefetch(reinterpret_cast<const char*>(weight_row + at + kPrefetchBytes),
                   _MM_HINT_T0);
      const __m512i weight_values =
          _mm512_xor_si512(_mm512_loadu_si512(weight_row + at), top_bits);
      for (int m = 0; m < kRows; ++m) {
        accumulators[set][m] = _mm512_dpbusd_epi32(
            accumulators[set][m], weight_values,
            _mm512_loadu_si512(activations + m * size + at));
      }
    }
  }
  for (; k < vector_end; k += kValuesPerVector) {
    const __m512i weight_values =
        _mm512_xor_si512(_mm512_loadu_si512(weight_row + k), top_bits);
    for (int m = 0; m < kRows; ++m) {
      accumulators[0][m] = _mm512_dpbusd_epi32(
          accumulators[0][m], weight_values,
          _mm512_loadu_si512(activations + m * size + k));
    }
  }
  for (int m = 0; m < kRows; ++m) {
    lanes[m] = accumulators[0][m];
    for (int set = 1; set < kSets; ++set) {
      lanes[m] = _mm512_add_epi32(lanes[m], accumulators[set][m]);
    }
  }
}

// dot_rows_portable with AVX-512 VNNI's unsigned-by-signed byte multiply-add
// (vpdpbusd: 64 products an instruction), for up to kMaxRowsPerPass
// activation rows a pass over the weights. The weights are the unsigned side:
// flipping a weight byte's top bit adds 128 to it, so each product has
// 128 * the activation too much, and 128 * the activations' sum over the
// vector stretches (vector_sums, one per activation row) is taken off at the
// end. The weight rows are read one after another, each once for all the
// pass's activation rows, and prefetched 2 KB ahead: one stream of memory,
// which an AMD EPYC here read faster than four rows side by side (the 0.5B
// draft's 24 layers for one token in 6.80 ms against 8.84, oneDNN 7.90-8.21;
// benchmarks/results/int8_linear_cpu_amd.json and _before.json).
//
// Example, one 64-value stretch: weights w = [3, -4, 5, ...] read as
// [131, 124, 133, ...]; with activations q = [1, -2, 0, ...] the products sum
// to 131*1 - 124*2 + 133*0 + ... and 128 * (1 - 2 + 0 + ...) is taken off,
// leaving 3*1 + (-4)*(-2) + 5*0 + ... = dot(q, w).
template <int kRows>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void dot_rows_pass(
    const int8_t* activations, const int32_t* vector_sums, const int8_t* weights,
    int64_t size, int32_t* sums) {
  const int64_t vector_end = size - size % kValuesPerVector;
  __m512i lanes[kRows][kRowsPerBlock];
  for (int64_t r = 0; r < kRowsPerBlock; ++r) {
    __m512i row_lanes[kRows];
    dot_weight_row<kRows>(activations, size, vector_end, weights + r * size, row_lanes);
    for (int m = 0; m < kRows; ++m) lanes[m][r] = row_lanes[m];
  }
  for (int m = 0; m < kRows; ++m) {
    alignas(16) int32_t block_sums[kRowsPerBlock];
    _mm_store_si128(reinterpret_cast<__m128i*>(block_sums),
                    _mm_sub_epi32(reduce_add_4(lanes[m]),
                                  _mm_set1_epi32(128 * vector_sums[m])));
    for (int64_t r = 0; r < kRowsPerBlock; ++r) {
      int32_t sum = block_sums[r];
      for (int64_t k = vector_end; k < size; ++k) {
        sum += static_cast<int32_t>(activations[m * size + k]) *
               static_cast<int32_t>(weights[r * size + k]);
      }
      sums[m * kRowsPerBlock + r] = sum;
    }
  }
}

// Activation rows a pass takes: its accumulators fill 16 of the 32 vector
// registers.
constexpr int64_t kMaxRowsPerPass = 8;

// {&dot_rows_pass<1>, ..., &dot_rows_pass<kMaxRowsPerPass>}.
template <int... kRows>
constexpr auto make_passes(std::integer_sequence<int, kRows...>) {
  return std::array<decltype(&dot_rows_pass<1>), sizeof...(kRows)>{
      &dot_rows_pass<kRows + 1>...};
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void dot_rows_avx512(
    const int8_t* activations, const int32_t* vector_sums, int64_t num_rows,
    const int8_t* weights, int64_t size, int32_t* sums) {
  static constexpr auto passes =
      make_passes(std::make_integer_sequence<int, kMaxRowsPerPass>{});
  for (int64_t first = 0; first < num_rows; first += kMaxRowsPerPass) {
    const int64_t rows = std::min(kMaxRowsPerPass, num_rows - first);
    passes[rows - 1](activations + first * size, vector_sums + first, weights,
                     size, sums + first * kRowsPerBlock);
  }
}
#endif

using QuantizeRow = float (*)(const float*, int64_t, int8_t*);
using DotRows = void (*)(const int8_t*, const int32_t*, int64_t, const int8_t*,
                         int64_t, int32_t*);

struct Kernels {
  QuantizeRow quantize_row;
  DotRows dot_rows;
};

Kernels pick_kernels() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni")) {
    return {quantize_row_avx512, dot_rows_avx512};
  }
#endif
  return {quantize_row_portable, dot_rows_portable};
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

  static const Kernels kernels = pick_kernels();
  std::vector<int8_t> quantized(num_rows * in_features);
  std::vector<float> row_scales(num_rows);
  std::vector<int32_t> vector_sums(num_rows, 0);
  const int64_t vector_end = in_features - in_features % kValuesPerVector;
  for (int64_t m = 0; m < num_rows; ++m) {
    int8_t* row = &quantized[m * in_features];
    row_scales[m] = kernels.quantize_row(
        rows.data_ptr<float>() + m * in_features, in_features, row);
    for (int64_t k = 0; k < vector_end; ++k) vector_sums[m] += row[k];
  }

  const int8_t* weight_data = weight.data_ptr<int8_t>();
  const float* scale_data = scales.data_ptr<float>();
  float* output_data = output.data_ptr<float>();
  const int64_t num_tasks = (out_features + kRowsPerTask - 1) / kRowsPerTask;
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
      kernels.dot_rows(quantized.data(), vector_sums.data(), num_rows,
                       weight_rows, in_features, sums.data());
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
