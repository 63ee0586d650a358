// The CPU entry point of specextend::int8_linear, registered in bindings.cpp.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace specextend {

// output [M, N] float32 = (input [M, K] float32 quantized to int8 per row)
// @ weight [N, K] int8 ^T, scaled by each row's scale and weight_scales [N]
// float32, plus bias [N] float32 where given; see
// specextend_vllm/ops/int8_linear.py.
at::Tensor int8_linear_cpu(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& weight_scales,
                           const std::optional<at::Tensor>& bias);

}  // namespace specextend
