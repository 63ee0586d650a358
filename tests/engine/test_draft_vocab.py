"""A draft restricted to part of its vocabulary (`draft_vocab`) through the engine: the
draft proposes only kept tokens, and output stays the target's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import retrieval_stats
from tests.harness import (
    MAX_TOKENS,
    EngineRun,
    decode,
    generate_ids,
    on_engine,
    spec_decode_counts,
    specextend_config,
    two_tensor_parallel_ranks,
)
from tests.tiny_models import VOCAB_SIZE, save_cross_tokenizer_pair

pytestmark = pytest.mark.engine


def draft_words(model: Path) -> list[str]:
    """The words of a tiny model's word tokenizer, by token id."""
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(vocab, key=vocab.__getitem__)


def write_vocab(path: Path, ids: list[int]) -> str:
    path.write_text(json.dumps(ids))
    return str(path)


def test_a_draft_kept_from_every_output_token_has_nothing_accepted(
    tiny_models: dict[str, Path], tmp_path: Path, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    """Catches a restriction that is not applied: the draft (a noisy copy of the target)
    would then propose the target's tokens and have some accepted."""
    produced = {token for output in plain_outputs for token in output}
    vocab = write_vocab(tmp_path / "vocab.json", [t for t in range(VOCAB_SIZE) if t not in produced])
    run = decode(tiny_models["target"], prompts, MAX_TOKENS, specextend_config(tiny_models["draft_noisy"], draft_vocab=vocab))
    assert run.outputs == plain_outputs
    assert run.counts["num_draft_tokens"] > 0 and run.counts["num_accepted_tokens"] == 0


@pytest.mark.parametrize("draft_lm_head", ["as_loaded", "int8"])
def test_a_draft_keeping_the_output_tokens_drafts_trees_and_has_them_accepted(
    tiny_models: dict[str, Path],
    tmp_path: Path,
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
    draft_lm_head: str,
) -> None:
    """With `draft_lm_head: int8` the kept rows are multiplied in int8 (an fp32 draft)."""
    produced = sorted({token for output in plain_outputs for token in output})
    assert len(produced) < VOCAB_SIZE // 2
    vocab = write_vocab(tmp_path / "vocab.json", produced)
    config = specextend_config(
        tiny_models["draft_noisy"],
        draft_vocab=vocab,
        draft_lm_head=draft_lm_head,
        tree="dynamic",
        num_speculative_tokens=6,
        tree_max_depth=3,
    )
    def run_and_read_kept_rows(llm: Any) -> tuple[EngineRun, list[str]]:
        outputs = generate_ids(llm, prompts, MAX_TOKENS)
        run = EngineRun(outputs, spec_decode_counts(llm), retrieval_stats(llm)[0])
        return run, llm.collective_rpc(kept_rows_product)

    run, products = on_engine(tiny_models["target"], config, run_and_read_kept_rows)
    assert run.outputs == plain_outputs
    assert run.counts["num_accepted_tokens"] > 0 and run.stats["reduced_accepted_drafts"] > 0
    assert products == ["Int8RowsLogits" if draft_lm_head == "int8" else "function"]


def kept_rows_product(worker: Any) -> str:
    """What multiplies the draft's kept LM head rows: the int8 rows or the GEMM as loaded."""
    return type(worker.model_runner.drafter.model.compute_logits.kept_logits).__name__


def test_two_tensor_parallel_ranks_gather_the_kept_rows_of_their_vocabulary_slices(
    tiny_models: dict[str, Path],
    tmp_path: Path,
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each rank's LM head holds half the vocabulary; kept tokens from both halves. Catches
    a rank that keeps only the rows of its own half: its draft then differs from one rank's."""
    produced = sorted({token for output in plain_outputs for token in output})
    assert min(produced) < VOCAB_SIZE // 2 <= max(produced)
    config = specextend_config(
        tiny_models["draft_noisy"], draft_vocab=write_vocab(tmp_path / "vocab.json", produced)
    )
    one_rank = decode(tiny_models["target"], prompts, MAX_TOKENS, config)
    two_ranks = decode(
        tiny_models["target"],
        prompts,
        MAX_TOKENS,
        config,
        **two_tensor_parallel_ranks(monkeypatch),
    )
    assert two_ranks.outputs == one_rank.outputs == plain_outputs
    assert two_ranks.counts["num_accepted_tokens"] == one_rank.counts["num_accepted_tokens"] > 0


def test_a_draft_with_its_own_tokenizer_keeps_ids_of_its_own_vocabulary(
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
) -> None:
    """With `use_heterogeneous_vocab`, kept ids are the draft's: here the draft ids of the
    target's output tokens (the draft's token j < 400 is the target's permutation[j])."""
    root = tmp_path_factory.mktemp("vocab_cross")
    target, draft = save_cross_tokenizer_pair(root, tiny_models["target"], 400, seed=5)
    draft_ids = {word: index for index, word in enumerate(draft_words(draft))}
    target_words = draft_words(target)
    produced = {target_words[token] for output in plain_outputs for token in output}
    kept = sorted(draft_ids[word] for word in produced if word in draft_ids)
    config = specextend_config(
        draft, draft_vocab=write_vocab(root / "vocab.json", kept), use_heterogeneous_vocab=True
    )
    run = decode(target, prompts, MAX_TOKENS, config, skip_tokenizer_init=False)
    assert run.outputs == plain_outputs
    assert run.counts["num_accepted_tokens"] > 0
