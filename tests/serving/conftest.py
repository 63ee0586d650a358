"""Two `vllm serve` processes shared by the serving tests, started together: the tiny target
without speculation, and with `specextend` (a noisy draft trained on 256 positions) on a KV
cache small enough to preempt, drafting for batches of up to 4 requests only (larger ones
skip the draft, which catches up when the batch shrinks) and deferring the draft's prefill
in steps that only prefill."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import METHOD_KEYS, NUM_SPECULATIVE_TOKENS
from tests.serving.servers import VllmServer, server_args
from tests.tiny_models import VOCAB_SIZE, save_word_tokenizer, set_trained_length

DRAFT_TRAINED_LENGTH = 256
# 72 blocks of 32 tokens: one request of up to 1,024 tokens fits, 16 of up to 900 do not;
# the mixed requests were preempted in 3 runs of 5 with 120 blocks, in 5 of 5 with 72.
SPECEXTEND_KV_BLOCKS = 72
DRAFTING_BATCH_SIZES = [[1, 4, NUM_SPECULATIVE_TOKENS], [5, 256, 0]]
WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(2, VOCAB_SIZE)]
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def save_chat_word_tokenizer(path: Path) -> Path:
    """A word tokenizer with a chat template, in a folder of its own: next to a Qwen2
    config.json, transformers would load it as Qwen2's tokenizer instead."""
    save_word_tokenizer(path, WORDS)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return path


@pytest.fixture(scope="session")
def serving_models(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serving_models")
    draft = shutil.copytree(tiny_models["draft_noisy"], root / "draft")
    return {
        "target": tiny_models["target"],
        "draft": set_trained_length(draft, DRAFT_TRAINED_LENGTH),
        "tokenizer": save_chat_word_tokenizer(root / "tokenizer"),
    }


def specextend_serving_config(draft: Path, **keys: Any) -> dict[str, Any]:
    return {
        "method": "specextend",
        "model": str(draft),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        **METHOD_KEYS,
        **keys,
    }


@pytest.fixture(scope="session")
def servers(serving_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("server_logs")
    started = {
        "plain": VllmServer(
            serving_models["target"],
            server_args(None, "--tokenizer", str(serving_models["tokenizer"])),
            logs / "plain.log",
        ),
        "specextend": VllmServer(
            serving_models["target"],
            server_args(
                specextend_serving_config(
                    serving_models["draft"],
                    num_speculative_tokens_per_batch_size=DRAFTING_BATCH_SIZES,
                    draft_prefill="deferred",
                ),
                "--tokenizer",
                str(serving_models["tokenizer"]),
                "--num-gpu-blocks-override",
                str(SPECEXTEND_KV_BLOCKS),
            ),
            logs / "specextend.log",
        ),
    }
    try:
        for server in started.values():
            server.wait_until_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()
