"""The check behind the warning that int8 layers may not pay on this CPU, and the small-batch
int8 layer: the plugin's kernel up to `SMALL_BATCH_MAX_ROWS` tokens, vLLM's oneDNN GEMM past it."""

from pathlib import Path

import pytest
import torch

from specextend_vllm import ops
from specextend_vllm.vllm_access import cpu_int8
from specextend_vllm.vllm_access.cpu_int8 import SMALL_BATCH_MAX_ROWS, SmallBatchInt8Linear
from tests.kernels.test_int8_linear import random_layer

ZEN3_FLAGS = "fpu vme sse sse2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq"
# `cpu_int8` imported vLLM's ops above; a CUDA build of vLLM has no oneDNN GEMM.
requires_vllm_onednn = pytest.mark.skipif(
    not hasattr(torch.ops._C, "onednn_scaled_mm"),
    reason="vLLM's oneDNN int8 GEMM is in its CPU build only",
)
# Without int8 dot-product instructions vLLM's oneDNN int8 GEMM is not the exact int8
# product: on a Zen 3 EPYC (AVX2 only) up to 9.1 off it where a correct one is within 1e-5,
# and int8 LM-head logits 4.9% off the unquantized ones where a correct one is within 2%.
requires_exact_onednn_int8 = pytest.mark.skipif(
    cpu_int8.has_int8_dot_products(cpu_int8.cpu_flags()) is False,
    reason="vLLM's oneDNN int8 GEMM is not exact on a CPU without int8 dot products",
)


def cpuinfo(tmp_path: Path, flags: str, name: str = "cpuinfo") -> Path:
    path = tmp_path / name
    path.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\n"
        f"flags\t\t: {flags}\nbugs\t\t: sysret_ss_attrs\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    )
    return path


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    flags = cpu_int8.cpu_flags(cpuinfo(tmp_path, ZEN3_FLAGS))
    assert flags is not None and {"avx2", "fma"} <= flags and "sysret_ss_attrs" not in flags
    assert cpu_int8.has_int8_dot_products(flags) is False
    with_vnni = cpu_int8.cpu_flags(cpuinfo(tmp_path, ZEN3_FLAGS + " avx512f avx512_vnni", "vnni"))
    assert cpu_int8.has_int8_dot_products(with_vnni) is True
    assert cpu_int8.cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("flags", "warns"),
    [
        (ZEN3_FLAGS, True),
        (ZEN3_FLAGS + " avx512f avx512_vnni", False),
        (ZEN3_FLAGS + " avx_vnni", False),  # Alder Lake and later without AVX-512
        (ZEN3_FLAGS + " amx_int8", False),
        (None, False),
    ],
)
def test_warns_once_where_int8_has_no_dot_products(
    monkeypatch: pytest.MonkeyPatch, flags: str | None, warns: bool
) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(cpu_int8.logger, "warning", lambda message, *args: warnings.append(message % args))
    cpu_int8.warn_int8_layers_without_dot_products.cache_clear()
    flag_set = None if flags is None else frozenset(flags.split())
    for _ in range(3):
        cpu_int8.warn_int8_layers_without_dot_products(flag_set)
    assert len(warnings) == int(warns)
    if warns:
        assert "avx512_vnni" in warnings[0] and "unquantized" in warnings[0]


@requires_vllm_onednn
@pytest.mark.parametrize(
    "rows",
    [
        1,
        SMALL_BATCH_MAX_ROWS,
        pytest.param(SMALL_BATCH_MAX_ROWS + 1, marks=requires_exact_onednn_int8),
        pytest.param(16, marks=requires_exact_onednn_int8),
    ],
)
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


@requires_vllm_onednn
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
