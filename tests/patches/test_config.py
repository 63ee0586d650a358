"""Bad configurations are rejected when the config is built, before any model loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from specextend_vllm.config import SpecExtendConfig
from tests.harness import BLOCK_SIZE, METHOD_KEYS, specextend_config


def engine_args(model: Path, speculative_config: dict[str, Any], **overrides: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(model),
        dtype="float32",
        max_model_len=1024,
        block_size=BLOCK_SIZE,
        skip_tokenizer_init=True,
        speculative_config=speculative_config,
        **overrides,
    )


def build_engine_config(model: Path, speculative_config: dict[str, Any], **overrides: Any) -> Any:
    return engine_args(model, speculative_config, **overrides).create_engine_config()


def test_defaults() -> None:
    config = SpecExtendConfig().check_block_size(128)
    assert (config.chunk_size, config.token_budget, config.retrieval_interval) == (32, 1024, 4)
    assert config.policy == "cmr" and config.num_kept_chunks(128) == 32
    absolute = dataclasses.replace(config, positions="absolute")
    assert absolute.uses_working_copies(128) and not absolute.uses_working_copies(16)
    assert config.prefill_window() == 1024
    assert SpecExtendConfig(draft_prefill_window=None).prefill_window() is None


def test_valid_config_reaches_every_process(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """... and runs on the V1 model runner, even where vLLM would choose V2 (asked for by
    the environment, read after the config is built: building it here refuses V2, which
    needs Triton)."""
    import vllm.envs

    vllm_config = build_engine_config(
        tiny_models["target"], specextend_config(tiny_models["draft_noisy"])
    )
    assert vllm_config.speculative_config.method == "draft_model"
    assert vllm_config.additional_config["specextend"]["chunk_size"] == METHOD_KEYS["chunk_size"]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert vllm.envs.VLLM_USE_V2_MODEL_RUNNER is True
    assert vllm_config.use_v2_model_runner is False


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"chunk_sise": 32}, r"unknown key\(s\) \['chunk_sise'\]"),
        ({"policy": "lru"}, r"\['policy'\] must be one of \['cmr', 'streaming', 'full'\]"),
        (
            {"chunk_ranking": "recency"},
            r"\['chunk_ranking'\] must be one of \['attention', 'continuation'\]",
        ),
        (
            {"verification_attention": "flash"},
            r"\['verification_attention'\] must be one of \['auto', 'hybrid', 'native'\]",
        ),
        ({"token_budget": 0}, r"\['token_budget'\] must be >= 1"),
        ({"retrieval_interval": "4"}, r"\['retrieval_interval'\] must be an integer"),
        ({"retrieval_interval": True}, r"\['retrieval_interval'\] must be an integer"),
        ({"activation_length": 32}, r"\['activation_length'\] must be >= .*token_budget"),
        (
            {"chunk_size": 48},
            r"\['chunk_size'\] must divide the KV cache block size \(32\) or be a multiple",
        ),
        (
            {"chunk_size": 128, "token_budget": 64},
            r"\['token_budget'\] must be >= 128 \(the larger of the chunk size",
        ),
        (
            {"chunk_size": 16, "token_budget": 16},
            r"\['token_budget'\] must be >= 32 \(the larger of the chunk size",
        ),
        ({"drafting": "sometimes"}, r"\['drafting'\] must be one of \['auto', 'always'\]"),
        ({"draft_prefill": "later"}, r"\['draft_prefill'\] must be one of \['eager', 'deferred'\]"),
        ({"draft_prefill_window": 0}, r"\['draft_prefill_window'\] must be >= 1"),
        ({"draft_prefill_window": "4K"}, r"\['draft_prefill_window'\] must be an integer"),
        ({"draft_lm_head": "int4"}, r"\['draft_lm_head'\] must be one of \['auto', 'as_loaded', 'int8'\]"),
        (
            {"drafting": "auto", "num_speculative_tokens_per_batch_size": [[1, 4, 3]]},
            r"\['drafting'\] 'auto' chooses the number of draft tokens itself",
        ),
        ({"parallel_drafting": True}, r"\['parallel_drafting'\] must be False"),
        (
            {"disable_padded_drafter_batch": True},
            r"\['disable_padded_drafter_batch'\] must be False",
        ),
        ({"model": None}, r"\['model'\] is required"),
        ({"num_speculative_tokens": None}, r"\['num_speculative_tokens'\] is required"),
        (
            {"positions": "relative"},
            r"\['positions'\] must be one of \['auto', 'absolute', 'compact'\]",
        ),
        (
            {"retrieval_trigger": "sometimes"},
            r"\['retrieval_trigger'\] must be one of \['interval', 'adaptive'\]",
        ),
        ({"tree": "bushy"}, r"\['tree'\] must be 'chain', 'dynamic' or a list of paths"),
        (
            {"tree": "dynamic", "tree_max_depth": 2, "num_speculative_tokens": 40},
            r"\['num_speculative_tokens'\] must be between 1 and 20 for a dynamic tree",
        ),
        ({"tree": "dynamic", "tree_max_depth": 0}, r"\['tree_max_depth'\] must be >= 1"),
        ({"tree": [[0], [0, 0, 1]]}, r"\['tree'\]: path \[0, 0, 1\] has no parent"),
        (
            {"tree": [[0], [1], [2], [0, 0]]},
            r"\['tree'\] has 4 nodes.*\['num_speculative_tokens'\] must equal that, got 3",
        ),
        (
            {"tree": [[0], [1], [0, 0]], "num_speculative_tokens": 3, "verification_attention": "native"},
            r"\['verification_attention'\] 'native' cannot verify a speculative_config\['tree'\]",
        ),
        (
            {
                "tree": [[0], [1], [0, 0]],
                "num_speculative_tokens": 3,
                "drafting": "always",
                "num_speculative_tokens_per_batch_size": [[1, 4, 3]],
            },
            r"\['num_speculative_tokens_per_batch_size'\] cannot be combined with",
        ),
    ],
)
def test_bad_config_is_rejected(
    tiny_models: dict[str, Path], keys: dict[str, Any], message: str
) -> None:
    config = {
        k: v
        for k, v in {**specextend_config(tiny_models["draft_noisy"]), **keys}.items()
        if v is not None
    }
    with pytest.raises(ValueError, match=message):
        build_engine_config(tiny_models["target"], config)


def test_pipeline_parallelism_is_refused(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"pipeline_parallel_size must be 1 with method 'specextend'"):
        build_engine_config(
            tiny_models["target"],
            specextend_config(tiny_models["draft_noisy"]),
            pipeline_parallel_size=2,
        )


def test_draft_with_another_vocabulary_is_rejected(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    from transformers import Qwen2ForCausalLM

    from tests.tiny_models import tiny_qwen2_config

    config = tiny_qwen2_config()
    config.vocab_size = 640
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "other_vocab")
    with pytest.raises(ValueError, match="same vocabulary size"):
        build_engine_config(tiny_models["target"], specextend_config(tmp_path / "other_vocab"))


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"activation_length": 512},
            r"\['activation_length'\] \(512\) must be <= the draft's trained length \(256",
        ),
        (
            {"token_budget": 256, "activation_length": 256},
            r"\['token_budget'\] \(256\) must be below the draft's trained length",
        ),
    ],
)
def test_compact_positions_must_fit_the_draft_trained_length(
    tmp_path: Path, tiny_models: dict[str, Path], keys: dict[str, Any], message: str
) -> None:
    import shutil

    from tests.tiny_models import set_trained_length

    draft = set_trained_length(
        Path(shutil.copytree(tiny_models["draft_noisy"], tmp_path / "short")), 256
    )
    for positions in ("auto", "compact"):
        with pytest.raises(ValueError, match=message):
            build_engine_config(
                tiny_models["target"], specextend_config(draft, positions=positions, **keys)
            )
    build_engine_config(
        tiny_models["target"], specextend_config(draft, positions="absolute", **keys)
    )



def test_compact_positions_are_refused_on_a_draft_rope_that_cannot_be_re_rotated(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """YaRN scales angles by position: a kept key moved to another position cannot be
    re-rotated by the difference. `compact` is refused naming the RoPE; `auto` and
    `absolute` stay allowed (auto then drafts on absolute positions)."""
    import json
    import shutil

    draft = Path(shutil.copytree(tiny_models["draft_noisy"], tmp_path / "yarn"))
    config = json.loads((draft / "config.json").read_text())
    config["rope_scaling"] = {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512
    }
    (draft / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"\['positions'\] 'compact' needs a draft whose RoPE.*'yarn'"):
        build_engine_config(tiny_models["target"], specextend_config(draft, positions="compact"))
    for positions in ("auto", "absolute"):
        build_engine_config(tiny_models["target"], specextend_config(draft, positions=positions))


def test_auto_drafting_turns_on_vllms_dynamic_speculation_unless_a_schedule_is_given() -> None:
    from specextend_vllm.vllm_access.config import VLLM_SPECULATIVE_KEYS

    user = {"method": "specextend", "model": "draft", "num_speculative_tokens": 4}
    method_config, vllm_keys = SpecExtendConfig.split_speculative_config(user, VLLM_SPECULATIVE_KEYS)
    assert method_config.drafting == "auto"
    assert vllm_keys["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]

    schedule = [[1, 2, 4], [3, 64, 0]]
    with_schedule = {**user, "num_speculative_tokens_per_batch_size": schedule}
    method_config, vllm_keys = SpecExtendConfig.split_speculative_config(
        with_schedule, VLLM_SPECULATIVE_KEYS
    )
    assert method_config.drafting == "always"
    assert vllm_keys["num_speculative_tokens_per_batch_size"] == schedule


def test_trees_report_raw_logprobs_only(tiny_models: dict[str, Path]) -> None:
    config = specextend_config(
        tiny_models["draft_noisy"], tree=[[0], [1], [0, 0]], num_speculative_tokens=3
    )
    with pytest.raises(ValueError, match=r"logprobs_mode 'processed_logprobs' cannot be used"):
        build_engine_config(tiny_models["target"], config, logprobs_mode="processed_logprobs")
    assert build_engine_config(tiny_models["target"], config).additional_config["specextend"][
        "tree"
    ] == [[0], [1], [0, 0]]


def test_trees_turn_async_scheduling_off_and_refuse_it_when_asked(
    tiny_models: dict[str, Path]
) -> None:
    config = specextend_config(
        tiny_models["draft_noisy"], tree=[[0], [1], [0, 0]], num_speculative_tokens=3
    )
    args = engine_args(tiny_models["target"], config)
    # vLLM leaves async scheduling off on this CPU anyway: the trees' own setting is what
    # shows they turn it off where vLLM would turn it on.
    assert args.create_engine_config().scheduler_config.async_scheduling is False
    assert args.async_scheduling is False
    with pytest.raises(ValueError, match=r"async_scheduling cannot be used with speculative_config\['tree'\]"):
        build_engine_config(tiny_models["target"], config, async_scheduling=True)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"\['draft_vocab'\]: cannot read a JSON list of token ids from"),
        ("[1, 2", r"\['draft_vocab'\]: cannot read a JSON list of token ids from"),
        ("[]", r"\['draft_vocab'\]: .* must hold a non-empty JSON list of token ids"),
        ('[1, "2"]', r"\['draft_vocab'\]: .* must hold a non-empty JSON list of token ids"),
        ("[1, -2]", r"\['draft_vocab'\]: .* must hold a non-empty JSON list of token ids"),
        ("[3, 1, 3]", r"\['draft_vocab'\]: .* lists a token id twice"),
        ("[0, 511, 512]", r"\['draft_vocab'\]: .* holds token id 512, and the draft's vocabulary has 512 tokens"),
    ],
)
def test_bad_draft_vocabulary_is_rejected(
    tmp_path: Path, tiny_models: dict[str, Path], content: str | None, message: str
) -> None:
    path = tmp_path / "vocab.json"
    if content is not None:
        path.write_text(content)
    config = specextend_config(tiny_models["draft_noisy"], draft_vocab=str(path))
    with pytest.raises(ValueError, match=message):
        build_engine_config(tiny_models["target"], config)
    path.write_text("[0, 511]")
    build_engine_config(tiny_models["target"], config)
