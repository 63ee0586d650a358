"""A token tree is verified by hybrid tree attention or not at all: on a target whose
attention hybrid attention does not reproduce, a tree is refused (before the model loads
where the configs show it, at engine start where only the layers do), and a chain is
verified on vLLM's attention, exactly."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import BloomConfig, BloomForCausalLM

from specextend_vllm.config import SpecExtendConfigError
from tests.harness import MAX_TOKENS, decode, make_llm, specextend_config
from tests.patches.test_config import build_engine_config
from tests.tiny_models import VOCAB_SIZE

pytestmark = pytest.mark.engine

TREE = {"tree": [[0], [1], [0, 0]], "num_speculative_tokens": 3}
SLIDING_WINDOW = 64


def edited_copy(source: Path, destination: Path, **config_changes: Any) -> Path:
    shutil.copytree(source, destination)
    config = json.loads((destination / "config.json").read_text())
    config.update(config_changes)
    (destination / "config.json").write_text(json.dumps(config))
    return destination


@pytest.fixture(scope="module")
def blocked_targets(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny targets, each with one kind of attention hybrid attention does not serve,
    that the configs show."""
    root = tmp_path_factory.mktemp("blocked")
    target = tiny_models["target"]
    return {
        "sliding window": edited_copy(
            target,
            root / "sliding",
            use_sliding_window=True,
            sliding_window=SLIDING_WINDOW,
            max_window_layers=0,
            layer_types=["sliding_attention", "sliding_attention"],
        ),
        # Head size 80: the CPU backend stores the cache in its 'vec16' layout.
        "CPU KV cache layout 'vec16'": edited_copy(
            target, root / "vec16", head_dim=80, num_attention_heads=2, hidden_size=128
        ),
        "logit soft cap": edited_copy(
            target,
            root / "softcap",
            architectures=["Gemma2ForCausalLM"],
            model_type="gemma2",
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=64,
            sliding_window=None,
            layer_types=["full_attention", "full_attention"],
        ),
    }


@pytest.mark.parametrize(
    "blocker", ["sliding window", "CPU KV cache layout 'vec16'", "logit soft cap", "fp8"]
)
def test_a_tree_on_a_target_hybrid_attention_cannot_serve_is_refused_before_loading(
    blocker: str, blocked_targets: dict[str, Path], tiny_models: dict[str, Path]
) -> None:
    overrides: dict[str, Any] = {}
    target = blocked_targets.get(blocker, tiny_models["target"])
    if blocker == "fp8":
        overrides["kv_cache_dtype"] = "fp8"
        blocker = "KV cache dtype fp8"
    config = specextend_config(target, **TREE)
    with pytest.raises(SpecExtendConfigError, match=rf"\['tree'\] is verified exactly only.*{blocker}"):
        build_engine_config(target, config, **overrides)
    chain = specextend_config(target, verification_attention="hybrid")
    with pytest.raises(SpecExtendConfigError, match=r"\['verification_attention'\] 'hybrid' cannot"):
        build_engine_config(target, chain, **overrides)


def test_a_chain_on_a_windowed_target_is_verified_exactly_on_vllms_attention(
    blocked_targets: dict[str, Path], prompts: list[list[int]]
) -> None:
    target = blocked_targets["sliding window"]
    plain = decode(target, prompts, MAX_TOKENS)
    chain = decode(target, prompts, MAX_TOKENS, specextend_config(target))
    assert chain.outputs == plain.outputs
    assert chain.counts["num_accepted_tokens"] > 0
    assert chain.stats["hybrid_verifications"] == 0


@pytest.fixture(scope="module")
def alibi_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Bloom model: ALiBi comes with the architecture, no config key says so."""
    torch.manual_seed(0)
    config = BloomConfig(
        vocab_size=VOCAB_SIZE, hidden_size=128, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=1
    )
    path = tmp_path_factory.mktemp("alibi") / "bloom"
    BloomForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def test_a_tree_on_a_target_whose_layers_alone_show_the_blocker_is_refused_at_start(
    alibi_target: Path,
) -> None:
    config = specextend_config(alibi_target, **TREE)
    build_engine_config(alibi_target, config)
    with pytest.raises(
        SpecExtendConfigError, match=r"\['tree'\] is verified exactly only.*ALiBi"
    ) as refused:
        make_llm(alibi_target, config)
    # The half-built engine lives on in the traceback's frames: release it now, or a later
    # garbage collection tears down the process-wide state of whichever engine runs then.
    del refused
    gc.collect()


def test_reconfiguring_a_tree_engine_to_native_verification_is_refused(
    tiny_models: dict[str, Path],
) -> None:
    from specextend_vllm import reconfigure

    llm = make_llm(tiny_models["target"], specextend_config(tiny_models["draft_noisy"], **TREE))
    with pytest.raises(
        Exception, match=r"'native' cannot verify a speculative_config\['tree'\]"
    ) as refused:
        reconfigure(llm, verification_attention="native")
    del refused, llm
    gc.collect()
