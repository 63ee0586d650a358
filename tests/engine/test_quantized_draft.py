"""An int8 draft (W8A8 from llmcompressor, run by vLLM's int8 kernels) beside an fp32
target on every path of the method: retrieval on working copies with hybrid verification,
compact positions with a dynamic tree, compiled, a draft with its own tokenizer, two
tensor-parallel ranks. Output stays the target's, drafts are accepted on the reduced cache, and the draft
that ran is the int8 one: every linear layer int8 but the one the checkpoint left in fp32
(vLLM names the draft's layers under the prefix `draft_model.`, where the checkpoint's
list of unquantized layers matched nothing before the plugin extended it), and its logits
come from its LM head in int8 (`draft_lm_head: auto`) where the CPU has int8 dot products.
Where the plugin's small-batch int8 kernel runs vectorized (AVX-512 VNNI), the draft's int8
layers take it (`ops.int8_linear` for up to 5 tokens, oneDNN beyond)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import retrieval_stats
from specextend_vllm.vllm_access.cpu_int8 import (
    SmallBatchInt8Linear,
    cpu_flags,
    has_int8_dot_products,
    has_small_batch_kernel,
)
from tests.harness import (
    MAX_TOKENS,
    generate_ids,
    on_engine,
    spec_decode_counts,
    specextend_config,
    two_tensor_parallel_ranks,
)
from tests.tiny_models import save_cross_tokenizer_pair, save_int8_model, set_trained_length

pytestmark = pytest.mark.engine

DRAFT_TRAINED_LENGTH = 256
KEPT_LAYER = "model.layers.0.mlp.down_proj"
INT8 = "CompressedTensorsW8A8Int8"


@dataclasses.dataclass
class Int8Run:
    outputs: list[list[int]]
    counts: dict[str, float]
    ranks: list[dict[str, Any]]
    draft_linear_schemes: list[dict[str, str]]
    draft_logits: list[str]


def linear_schemes(model: Any) -> dict[str, str]:
    """Each linear layer of a model: its quantization scheme, or "none", and for int8 layers
    the kernel they run on: vLLM's (oneDNN) or the plugin's for small batches."""
    from vllm.model_executor.layers.linear import LinearBase

    def scheme(module: Any) -> str:
        if not hasattr(module, "scheme"):
            return "none"
        linear_method = getattr(module.scheme.kernel, "linear_method", None)
        on_small_batch_kernel = type(getattr(linear_method, "__self__", None)) is SmallBatchInt8Linear
        return type(module.scheme).__name__ + ("+small_batches" if on_small_batch_kernel else "")

    return {name: scheme(module) for name, module in model.named_modules() if isinstance(module, LinearBase)}


def draft_linear_schemes(worker: Any) -> dict[str, str]:
    """`linear_schemes` of the draft on one rank."""
    return linear_schemes(worker.model_runner.drafter.model)


def draft_logits(worker: Any) -> str:
    """What computes the draft's logits on one rank: vLLM's LM head ("method") or the
    plugin's."""
    return type(worker.model_runner.drafter.model.compute_logits).__name__


def decode_with(target: Path, draft: Path, prompts: list[list[int]], **overrides: Any) -> Any:
    def use(llm: Any) -> Int8Run:
        outputs = generate_ids(llm, prompts, MAX_TOKENS)
        return Int8Run(
            outputs,
            spec_decode_counts(llm),
            retrieval_stats(llm),
            llm.collective_rpc(draft_linear_schemes),
            llm.collective_rpc(draft_logits),
        )

    return lambda **keys: on_engine(target, specextend_config(draft, **keys), use, **overrides)


def assert_int8_lossless_and_accepted(run: Int8Run, plain_outputs: list[list[int]]) -> None:
    assert run.outputs == plain_outputs
    small_batch_kernel = has_small_batch_kernel(cpu_flags())
    for schemes in run.draft_linear_schemes:
        assert schemes.pop(KEPT_LAYER) == "none"
        assert set(schemes.values()) == {INT8 + ("+small_batches" if small_batch_kernel else "")}
    int8_head = has_int8_dot_products(cpu_flags()) is not False
    assert set(run.draft_logits) == {"Int8RowsLogits" if int8_head else "method"}
    stats = run.ranks[0]
    assert stats["reduced_accepted_drafts"] > 0
    assert run.counts["num_accepted_tokens"] > 0


@pytest.fixture(scope="module")
def int8_draft(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    draft = save_int8_model(
        tiny_models["draft_noisy"], tmp_path_factory.mktemp("int8") / "draft", keep=(KEPT_LAYER,)
    )
    return set_trained_length(draft, DRAFT_TRAINED_LENGTH)


def test_int8_draft_on_working_copies_with_hybrid_verification(
    tiny_models: dict[str, Path], int8_draft: Path, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    run = decode_with(tiny_models["target"], int8_draft, prompts)(positions="absolute")
    assert_int8_lossless_and_accepted(run, plain_outputs)
    stats = run.ranks[0]
    assert stats["hybrid_verifications"] > 0 and stats["compact_draft_steps"] == 0


def test_int8_draft_on_compact_positions_with_a_dynamic_tree(
    tiny_models: dict[str, Path], int8_draft: Path, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    run = decode_with(tiny_models["target"], int8_draft, prompts)(
        positions="compact", tree="dynamic", num_speculative_tokens=6, tree_max_depth=3
    )
    assert_int8_lossless_and_accepted(run, plain_outputs)
    assert run.ranks[0]["compact_draft_steps"] > 0


def test_int8_draft_compiled(
    tiny_models: dict[str, Path], int8_draft: Path, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    """vLLM's default mode compiles the draft too, its int8 layers on the small-batch kernel
    included (that the choice by the number of tokens stays one op in one graph is
    `tests/kernels/test_int8_linear.py`'s; here either choice would be lossless)."""
    run = decode_with(tiny_models["target"], int8_draft, prompts, enforce_eager=False)(positions="absolute")
    assert_int8_lossless_and_accepted(run, plain_outputs)


def test_int8_draft_with_its_own_tokenizer(
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
) -> None:
    root = tmp_path_factory.mktemp("int8_cross")
    target, draft = save_cross_tokenizer_pair(root, tiny_models["target"], 400, seed=5)
    int8_draft = save_int8_model(draft, root / "cross_draft_int8", keep=(KEPT_LAYER,))
    run = decode_with(target, int8_draft, prompts, skip_tokenizer_init=False)(
        use_heterogeneous_vocab=True
    )
    assert_int8_lossless_and_accepted(run, plain_outputs)


def test_int8_draft_on_two_tensor_parallel_ranks(
    tiny_models: dict[str, Path],
    int8_draft: Path,
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = decode_with(
        tiny_models["target"],
        int8_draft,
        prompts,
        **two_tensor_parallel_ranks(monkeypatch),
    )()
    assert_int8_lossless_and_accepted(run, plain_outputs)
    assert len(run.ranks) == 2 and run.ranks[0]["selections"] == run.ranks[1]["selections"]
