"""The int8 linear op on the CPU: the kernel equals its reference to the bit (integer dot
products are exact, and the scaling is rounded alike), against a float computation within
the quantization's error. No vLLM here (`scripts/gpu_check.sh` runs these where there is
none): `SmallBatchInt8Linear`, which puts vLLM's oneDNN GEMM behind the kernel, is tested in
`tests/unit/test_cpu_int8.py`."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm import ops


def random_layer(out_features: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (out_features, in_features), generator=generator, dtype=torch.int8)
    weight_scales = torch.rand(out_features, generator=generator) * 0.02 + 1e-4
    bias = torch.randn(out_features, generator=generator)
    return weight, weight_scales, bias


# (rows, out features, in features): rows of every pass size (a pass takes up to 8) and past
# one or two passes; in features past and short of the 64 values a vector step takes, and
# an odd number of such steps (they go in pairs); out features short of the 4 rows summed
# up together and of a thread's 16.
SHAPES = [
    (1, 4, 64), (1, 37, 70), (2, 16, 896), (3, 129, 200), (4, 50, 4864), (5, 12, 192),
    (6, 20, 128), (7, 5, 63), (8, 9, 4864), (9, 33, 130), (17, 6, 300),
]


@pytest.mark.parametrize("rows,out_features,in_features", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_reference_to_the_bit(rows: int, out_features: int, in_features: int, with_bias: bool) -> None:
    weight, weight_scales, bias = random_layer(out_features, in_features, seed=rows + in_features)
    input = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(out_features)) * 3
    input[0, :3] = 40.0  # an outlier sets the row's scale
    args = (input, weight, weight_scales, bias if with_bias else None)
    assert torch.equal(ops.int8_linear(*args), ops.int8_linear_reference(*args))


def test_extreme_values_and_all_zero_rows() -> None:
    weight = torch.full((8, 4864), -128, dtype=torch.int8)
    weight[1::2] = 127
    weight_scales = torch.ones(8)
    input = torch.zeros(3, 4864)
    input[1] = -1.0  # quantized to -127 throughout: products of -128 and 127 at their largest
    input[2] = 1e-30
    output = ops.int8_linear(input, weight, weight_scales)
    assert torch.equal(output, ops.int8_linear_reference(input, weight, weight_scales))
    assert torch.equal(output[0], torch.zeros(8))
    assert output[1, 0].item() == pytest.approx(4864 * 128)  # (-1) * (-128) per value


def test_reference_is_the_float_product_within_the_quantization_error() -> None:
    weight, weight_scales, bias = random_layer(64, 512, seed=1)
    input = torch.randn(3, 512, generator=torch.Generator().manual_seed(2))
    exact = input @ (weight.float() * weight_scales[:, None]).t() + bias
    relative_error = (ops.int8_linear_reference(input, weight, weight_scales, bias) - exact).norm() / exact.norm()
    assert relative_error < 0.01


def test_bad_inputs_are_refused_naming_the_argument() -> None:
    weight, weight_scales, _ = random_layer(8, 64, seed=3)
    with pytest.raises(RuntimeError, match="input must be a 2-D float32"):
        ops.int8_linear(torch.randn(2, 64, dtype=torch.float64), weight, weight_scales, None)
    with pytest.raises(RuntimeError, match="weight must be a contiguous 2-D int8"):
        ops.int8_linear(torch.randn(2, 64), weight.t().contiguous().t(), weight_scales, None)
    with pytest.raises(RuntimeError, match="input has 32 features"):
        ops.int8_linear(torch.randn(2, 32), weight, weight_scales, None)
    with pytest.raises(RuntimeError, match="weight_scales must be \\[8\\]"):
        ops.int8_linear(torch.randn(2, 64), weight, weight_scales[:4], None)
    with pytest.raises(RuntimeError, match="bias must be \\[8\\]"):
        ops.int8_linear(torch.randn(2, 64), weight, weight_scales, torch.zeros(3))


@pytest.mark.parametrize("with_bias", [False, True])
def test_op_registration_and_fake_kernel(with_bias: bool) -> None:
    weight, weight_scales, bias = random_layer(8, 64, seed=6)
    torch.library.opcheck(
        torch.ops.specextend.int8_linear.default,
        (torch.randn(3, 64), weight, weight_scales, bias if with_bias else None),
    )
