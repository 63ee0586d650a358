"""The int8 linear op on the CPU: the kernel equals its reference to the bit (integer dot
products are exact, and the scaling is rounded alike), against a float computation within
the quantization's error, and with vLLM's oneDNN GEMM behind `SmallBatchInt8Linear` for
batches past the kernel's."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm import ops
from specextend_vllm.vllm_access.cpu_int8 import SMALL_BATCH_MAX_ROWS, SmallBatchInt8Linear


def random_layer(out_features: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (out_features, in_features), generator=generator, dtype=torch.int8)
    weight_scales = torch.rand(out_features, generator=generator) * 0.02 + 1e-4
    bias = torch.randn(out_features, generator=generator)
    return weight, weight_scales, bias


# (rows, out features, in features): in features past and short of the 64 values a vector
# step takes, out features short of the 4 rows multiplied together and of a thread's 16.
SHAPES = [(1, 4, 64), (1, 37, 70), (2, 16, 896), (3, 129, 200), (4, 50, 4864), (7, 5, 63), (9, 33, 130)]


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


@pytest.mark.parametrize("rows", [1, SMALL_BATCH_MAX_ROWS, SMALL_BATCH_MAX_ROWS + 1, 16])
def test_small_batches_take_the_kernel_and_larger_ones_onednn(rows: int) -> None:
    from vllm import _custom_ops as vllm_ops

    weight, weight_scales, bias = random_layer(48, 128, seed=4)
    onednn = vllm_ops.create_onednn_scaled_mm(weight.t(), weight_scales[:, None], torch.float32, True, False, 32)
    layer = SmallBatchInt8Linear(weight, weight_scales[:, None], onednn.handler_tensor)
    input = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    output = layer(input.view(1, rows, 128), bias)
    reference = ops.int8_linear_reference(input, weight, weight_scales, bias)
    assert output.shape == (1, rows, 48)
    if rows <= SMALL_BATCH_MAX_ROWS:
        assert torch.equal(output[0], reference)
    else:
        torch.testing.assert_close(output[0], reference, rtol=1e-5, atol=1e-5)


def test_the_choice_stays_inside_one_compiled_graph() -> None:
    """Compiled, the number of tokens is a symbol: choosing in traced Python would guard on
    it and compile again (or keep one choice for every size)."""
    from torch._dynamo.testing import CompileCounter
    from vllm import _custom_ops as vllm_ops

    weight, weight_scales, bias = random_layer(16, 64, seed=5)
    onednn = vllm_ops.create_onednn_scaled_mm(weight.t(), weight_scales[:, None], torch.float32, True, False, 32)
    layer = SmallBatchInt8Linear(weight, weight_scales, onednn.handler_tensor)
    compile_counter = CompileCounter()
    compiled = torch.compile(lambda input: layer(input, bias), backend=compile_counter, dynamic=True, fullgraph=True)
    for rows in (2, 9, 3):  # not 1: torch.compile specializes sizes 0 and 1
        input = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(compiled(input), layer(input, bias), rtol=0, atol=0)
    assert compile_counter.frame_count == 1
