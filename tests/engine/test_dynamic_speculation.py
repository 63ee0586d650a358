"""Fewer drafts where drafting cannot pay, losslessly: vLLM's batch-size schedule for the
number of draft tokens, and the method's own choice from measured step times
(`drafting: auto`)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.harness import (
    BLOCK_SIZE,
    MAX_TOKENS,
    NUM_SPECULATIVE_TOKENS,
    SimulatedTime,
    decode,
    delay_calls,
    generate_ids,
    on_engine,
    random_prompts,
    spec_decode_counts,
    specextend_config,
    undo_delay,
)
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.engine

# Long enough for `drafting: auto` to measure both choices and then keep one.
LONG_OUTPUT_TOKENS = 64
# Batch size 1: 3 draft tokens; batches of 2 to 16: none.
SCHEDULE = [[1, 1, 3], [2, 16, 0]]


def test_drafting_follows_the_batch_size_schedule_losslessly(
    tiny_models: dict[str, Path], prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    config = specextend_config(
        tiny_models["draft_noisy"], num_speculative_tokens_per_batch_size=SCHEDULE
    )

    def run(llm: Any) -> None:
        from specextend_vllm import retrieval_stats

        assert generate_ids(llm, prompts, MAX_TOKENS) == plain_outputs
        drafts_in_batches = spec_decode_counts(llm).get("num_drafts", 0)
        # The batches' plain decoding steps measured the prefix kernel against vLLM's
        # attention (`verification_attention: auto`), so some ran on the kernel.
        assert retrieval_stats(llm)[0]["kernel_decode_steps"] > 0
        assert generate_ids(llm, prompts[-1:], MAX_TOKENS) == plain_outputs[-1:]
        drafts_alone = spec_decode_counts(llm)["num_drafts"] - drafts_in_batches
        assert drafts_alone > 0
        assert drafts_in_batches < drafts_alone

    on_engine(tiny_models["target"], config, run)


def run_staggered(
    target: Path, config: dict[str, Any], prompts: list[list[int]]
) -> tuple[list[int], list[list[int]], dict[str, float], dict[str, Any]]:
    """Decodes `prompts` together, each ending 2 tokens before the next (the last after
    MAX_TOKENS), so the batch shrinks one request at a time: the tokens asked of each,
    the outputs, vLLM's speculative-decoding counters and the retrieval stats."""
    from vllm import SamplingParams

    from specextend_vllm import retrieval_stats

    max_tokens = [MAX_TOKENS - 2 * (len(prompts) - 1 - i) for i in range(len(prompts))]

    def run(llm: Any) -> tuple[list[list[int]], dict[str, float], dict[str, Any]]:
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens],
            use_tqdm=False,
        )
        return (
            [list(o.outputs[0].token_ids) for o in outputs],
            spec_decode_counts(llm),
            retrieval_stats(llm)[0],
        )

    return max_tokens, *on_engine(target, config, run)


# Drafts of every length: 2 per step in batches of 4 or more, 1 in pairs, 3 alone.
LENGTHS_SCHEDULE = [[1, 1, 3], [2, 3, 1], [4, 16, 2]]


@pytest.mark.parametrize(
    "keys",
    [
        {"positions": "compact", "verification_attention": "hybrid"},
        {"chunk_size": 32, "positions": "absolute", "verification_attention": "native"},
    ],
    ids=["compact_hybrid", "whole_blocks_native"],
)
def test_drafts_shorter_than_num_speculative_tokens_are_lossless(
    keys: dict[str, Any],
    tiny_models: dict[str, Path],
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
) -> None:
    """Requests ending one after another draft 2, then 1, then 3 tokens a step, over
    retrieval's reduced caches, verified on each attention path."""
    config = specextend_config(
        tiny_models["draft_noisy"], num_speculative_tokens_per_batch_size=LENGTHS_SCHEDULE, **keys
    )
    max_tokens, outputs, counts, stats = run_staggered(tiny_models["target"], config, prompts)
    assert outputs == [plain[:n] for plain, n in zip(plain_outputs, max_tokens)]
    assert stats["reduced_draft_steps"] > 0
    assert (stats["compact_draft_steps"] > 0) == (keys["positions"] == "compact")
    assert (stats["hybrid_verifications"] > 0) == (keys["verification_attention"] == "hybrid")
    # Every verification is seen as one: a step that verified more drafts than it drafts
    # next is not taken for a prefill.
    verified = stats["reduced_verified_drafts"] + stats["full_verified_drafts"]
    assert verified == counts["num_draft_tokens"]
    # Some request steps drafted NUM_SPECULATIVE_TOKENS tokens, some fewer, some more than one.
    assert counts["num_drafts"] < counts["num_draft_tokens"] < (
        counts["num_drafts"] * NUM_SPECULATIVE_TOKENS
    )


# Simulated seconds (`SimulatedTime`) added to each forward pass, which alone set the
# times `drafting: auto` measures: a plain step takes SLOW_TARGET_S, a step of
# NUM_SPECULATIVE_TOKENS drafts SLOW_TARGET_S plus one draft pass per draft. (With sleeps
# and the wall clock, these tests failed on a machine running other work: the tiny models'
# own work grew several times over there, and with it the steps' times.)
SLOW_TARGET_S = 0.02
SLOW_DRAFT_PASS_S = 0.06
# A real draft's pass costs a good part of a target step.
UNRELATED_DRAFT_PASS_S = 0.01
# The target's forward beside that draft: a tenth of the 64 plain steps left (0.32 s) then
# covers the draft's catch-up of the batch's 3K prompt tokens (0.12 s at the price of its
# pricing pass, 256 tokens in one pass); at SLOW_TARGET_S the two were within 3%, and the
# batch never drafted.
UNRELATED_TARGET_S = 0.05


@pytest.fixture
def simulated_time(monkeypatch: pytest.MonkeyPatch) -> SimulatedTime:
    """The clock `drafting: auto` measures by, for this test's engine."""
    from specextend_vllm import profiling

    clock = SimulatedTime()
    monkeypatch.setattr(profiling, "drafting_clock", clock.now)
    return clock


def model(worker: Any, drafter: bool) -> Any:
    return worker.model_runner.drafter.model if drafter else worker.model_runner.model


def slow_down(worker: Any, drafter: bool, seconds: float, clock: SimulatedTime) -> None:
    delay_calls(model(worker, drafter), "forward", seconds, wait=clock.advance)


def restore(worker: Any, drafter: bool) -> None:
    undo_delay(model(worker, drafter), "forward")


def test_auto_drafting_steps_back_from_a_draft_that_is_never_accepted(
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
    simulated_time: SimulatedTime,
) -> None:
    """A draft unrelated to the target, each of its passes taking UNRELATED_DRAFT_PASS_S,
    the target's forward UNRELATED_TARGET_S: each step with drafts costs more and gives one
    token, as a plain step does. Once both are measured (8 drafting steps, 3 plain), the
    batch stops drafting, and measures drafting again only after 64 steps. (Injected: every
    step's time recorded as one second, the batch kept drafting.)"""
    unrelated = save_tiny_model(tmp_path_factory.mktemp("unrelated") / "draft", seed=11)
    config = specextend_config(unrelated, drafting="auto")
    plain = decode(tiny_models["target"], prompts, LONG_OUTPUT_TOKENS).outputs

    def run(llm: Any) -> dict[str, float]:
        for drafter, seconds in ((False, UNRELATED_TARGET_S), (True, UNRELATED_DRAFT_PASS_S)):
            llm.collective_rpc(
                functools.partial(
                    slow_down, drafter=drafter, seconds=seconds, clock=simulated_time
                )
            )
        assert generate_ids(llm, prompts, LONG_OUTPUT_TOKENS) == plain
        return spec_decode_counts(llm)

    counts = on_engine(tiny_models["target"], config, run)
    request_steps = len(prompts) * LONG_OUTPUT_TOKENS
    assert 0 < counts["num_draft_tokens"] < request_steps * NUM_SPECULATIVE_TOKENS / 4
    assert counts["num_accepted_tokens"] < counts["num_draft_tokens"] / 10


def drafting_share(llm: Any, prompts: list[list[int]], plain: list[list[int]]) -> float:
    """Generates the prompts (checked against plain decoding); returns the share of the
    requests' decoding steps that drafted. Every draft is accepted here, so a request's
    tokens after its first come 1 + NUM_SPECULATIVE_TOKENS per drafting step, 1 per plain
    one."""
    before = spec_decode_counts(llm)
    assert generate_ids(llm, prompts, LONG_OUTPUT_TOKENS) == plain
    after = spec_decode_counts(llm)
    drafting = after["num_drafts"] - before["num_drafts"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    plain_steps = len(prompts) * (LONG_OUTPUT_TOKENS - 1) - drafting - accepted
    return drafting / (drafting + max(plain_steps, 0))


def test_auto_drafting_follows_what_pays_on_time_as_the_draft_slows_down_and_recovers(
    tiny_models: dict[str, Path], prompts: list[list[int]], simulated_time: SimulatedTime
) -> None:
    """The target drafting for itself on the full cache (every draft accepted), its
    forward taking SLOW_TARGET_S: a drafting step gives 4 tokens in a plain step's time,
    and the batch drafts. Once each draft pass takes SLOW_DRAFT_PASS_S, a drafting step
    still gives 4 tokens but takes 10 plain steps' time, and the batch stops drafting
    (losing on time, not on acceptance), checking drafting for a few steps now and then;
    with the draft restored, such a check finds drafting faster again and the batch drafts
    again."""
    config = specextend_config(tiny_models["target"], drafting="auto", policy="full")
    plain = decode(tiny_models["target"], prompts, LONG_OUTPUT_TOKENS).outputs

    def run(llm: Any) -> tuple[list[float], list[float], list[float]]:
        simulated_slow_down = functools.partial(slow_down, clock=simulated_time)
        llm.collective_rpc(
            functools.partial(simulated_slow_down, drafter=False, seconds=SLOW_TARGET_S)
        )
        paying = [drafting_share(llm, prompts, plain) for _ in range(2)]
        llm.collective_rpc(
            functools.partial(simulated_slow_down, drafter=True, seconds=SLOW_DRAFT_PASS_S)
        )
        slow = [drafting_share(llm, prompts, plain) for _ in range(3)]
        llm.collective_rpc(functools.partial(restore, drafter=True))
        recovered: list[float] = []
        while len(recovered) < 6 and (not recovered or recovered[-1] < 0.5):
            recovered.append(drafting_share(llm, prompts, plain))
        return paying, slow, recovered

    paying, slow, recovered = on_engine(tiny_models["target"], config, run)
    print(f"drafting shares: paying {paying}, slow draft {slow}, recovered {recovered}")
    assert min(paying) >= 0.6 and paying[-1] >= 0.75
    assert max(slow) <= 0.3 and slow[-1] <= 0.1
    assert recovered[-1] >= 0.5



def decoding_step_samples() -> dict[tuple[str, str, str], dict[str, float]]:
    """(batch sizes, drafts verified, drafts proposed) -> steps, seconds and tokens on the
    `vllm:specextend_decoding_step*` counters, from Prometheus's registry (vLLM's
    `LLM.get_metrics()` reads counters as whole numbers)."""
    names = {
        "vllm:specextend_decoding_steps_total": "steps",
        "vllm:specextend_decoding_step_seconds_total": "seconds",
        "vllm:specextend_decoding_step_tokens_total": "tokens",
    }
    samples: dict[tuple[str, str, str], dict[str, float]] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in names:
                labels = sample.labels
                key = (labels["batch_sizes"], labels["num_drafts"], labels["next_drafts"])
                samples.setdefault(key, {})[names[sample.name]] = sample.value
    return samples


def test_the_decoding_steps_the_scheduler_timed_reach_the_front_end_as_measured(
    tiny_models: dict[str, Path], simulated_time: SimulatedTime
) -> None:
    """One request, the target drafting for itself (every draft accepted), its forward
    taking SLOW_TARGET_S of simulated time: every decoding step, plain, drafting or
    switching between the two, took SLOW_TARGET_S, and one verifying j drafts gave 1 + j
    tokens. The counters hold the steps after the prompt's, each once: their tokens are
    those the request decoded after its first (a last step's accepted drafts past
    `max_tokens` too), the drafting ones vLLM's drafts. (Injected: the steps handed over
    kept and counted again at the next stats, and the drafts verified and proposed
    swapped; each failed here.)"""
    config = specextend_config(tiny_models["target"], drafting="auto", policy="full")
    [prompt] = random_prompts([3 * BLOCK_SIZE])
    plain = decode(tiny_models["target"], [prompt], LONG_OUTPUT_TOKENS).outputs

    def run(llm: Any) -> tuple[dict[tuple[str, str, str], dict[str, float]], dict[str, float]]:
        llm.collective_rpc(
            functools.partial(
                slow_down, drafter=False, seconds=SLOW_TARGET_S, clock=simulated_time
            )
        )
        assert generate_ids(llm, [prompt], LONG_OUTPUT_TOKENS) == plain
        return decoding_step_samples(), spec_decode_counts(llm)

    samples, counts = on_engine(tiny_models["target"], config, run)
    print(f"decoding steps: {samples}")
    k = str(NUM_SPECULATIVE_TOKENS)
    assert {batch_sizes for batch_sizes, _, _ in samples} == {"1"}
    assert {("1", "0", "0"), ("1", k, k), ("1", "0", k), ("1", k, "0")} <= samples.keys()
    for (_, num_drafts, _), tally in samples.items():
        assert tally["seconds"] == pytest.approx(SLOW_TARGET_S * tally["steps"])
        assert tally["tokens"] == (1 + int(num_drafts)) * tally["steps"]
    tokens = sum(tally["tokens"] for tally in samples.values())
    assert LONG_OUTPUT_TOKENS - 1 <= tokens < LONG_OUTPUT_TOKENS + NUM_SPECULATIVE_TOKENS
    drafting_steps = sum(t["steps"] for (_, j, _), t in samples.items() if j != "0")
    assert drafting_steps == counts["num_drafts"]

# Simulated seconds of the target's forward, and of each draft pass over a prompt: the
# pair of 220 prompt tokens then costs the draft about as much as 10 plain steps, between
# the 4 that the first pair may spend measuring and the 25 that the pair answered in 256
# tokens may.
PROMPT_WORK_TARGET_S = 0.1
PROMPT_PASS_S = 1.25


def slow_prompt_passes(worker: Any, seconds: float, clock: SimulatedTime) -> None:
    from specextend_vllm.profiling import PROMPT_PASS_MIN_TOKENS

    draft = model(worker, drafter=True)
    forward = draft.forward

    @functools.wraps(forward)
    def forward_slow_over_prompts(*args: Any, **kwargs: Any) -> Any:
        if kwargs["positions"].shape[-1] >= PROMPT_PASS_MIN_TOKENS:
            clock.advance(seconds)
        return forward(*args, **kwargs)

    draft.forward = forward_slow_over_prompts


def test_batches_draft_only_where_the_tokens_left_repay_the_drafts_prompt_work(
    tiny_models: dict[str, Path], simulated_time: SimulatedTime
) -> None:
    """The target drafting for itself on the full cache (every draft accepted), its forward
    slowed to PROMPT_WORK_TARGET_S, each draft pass over a prompt to PROMPT_PASS_S. A fresh
    engine's first pair of prompts, answered in 6 tokens: no prompt token has a price yet,
    so the pair does not draft, the draft prices prompt tokens in a pass of its own and
    never runs over those prompts. Two prompts answered in 256 tokens measure drafting in
    pairs (their catch-up costs less than a tenth of the plain steps left) and draft. Two new
    prompts answered in 6 tokens would save about 0.4 s by drafting, less than the draft's
    pass over their prompts costs: no drafts, and the draft never runs over those prompts.
    Four new prompts answered in 6 tokens come in a batch size not measured yet, whose
    measuring would catch up more than a few plain steps' worth: no drafts either. Two new
    prompts allowed 256 tokens that stop at a stop token within 6: most answers so far
    ended by 6 tokens, so they count on about 6 and do not draft. Two more new prompts
    answered in 256 tokens repay it once they outlive the short answers, and draft. Every
    output equals plain decoding. (Injected: unpriced steps drafted, the first pair
    drafted; the pricing pass left out, or the measuring bound left at 4 plain steps, no
    pair drafted; the weighing left out, the second short pair drafted; the tokens left
    counted as 1 each, no pair drafted past the first measuring steps; measuring steps not
    bounded, the four drafted; the answers' lengths not counted on, the pair that stops
    early drafted.)"""
    from specextend_vllm import retrieval_stats
    from specextend_vllm.profiling import PRICING_PASS_TOKENS

    config = specextend_config(tiny_models["target"], drafting="auto", policy="full")
    first_short_answered, long_prompts, short_answered, long_answered = (
        random_prompts([100, 120], seed=seed) for seed in (25, 21, 22, 23)
    )
    four_short_answered = random_prompts([100, 110, 120, 130], seed=24)
    stopping_early = random_prompts([100, 120], seed=26)
    short_tokens, long_tokens = 6, 256
    plain = decode(
        tiny_models["target"], long_prompts + long_answered, long_tokens
    ).outputs
    plain_short = decode(
        tiny_models["target"],
        first_short_answered + short_answered + four_short_answered + stopping_early,
        short_tokens,
    ).outputs
    stop_tokens = [output[-1] for output in plain_short[-2:]]
    plain_stopped = [
        output[: output.index(stop) + 1] for output, stop in zip(plain_short[-2:], stop_tokens)
    ]

    def run(llm: Any) -> list[tuple[dict[str, float], dict[str, Any]]]:
        from vllm import SamplingParams

        llm.collective_rpc(
            functools.partial(
                slow_down, drafter=False, seconds=PROMPT_WORK_TARGET_S, clock=simulated_time
            )
        )
        llm.collective_rpc(
            functools.partial(slow_prompt_passes, seconds=PROMPT_PASS_S, clock=simulated_time)
        )
        after: list[tuple[dict[str, float], dict[str, Any]]] = []

        def counts() -> None:
            after.append((spec_decode_counts(llm), retrieval_stats(llm)[0]))

        for batch, max_tokens, expected in (
            (first_short_answered, short_tokens, plain_short[:2]),
            (long_prompts, long_tokens, plain[:2]),
            (short_answered, short_tokens, plain_short[2:4]),
            (four_short_answered, short_tokens, plain_short[4:8]),
        ):
            assert generate_ids(llm, batch, max_tokens) == expected
            counts()
        stopped = llm.generate(
            [{"prompt_token_ids": p} for p in stopping_early],
            [
                SamplingParams(
                    max_tokens=long_tokens, temperature=0.0, ignore_eos=True, stop_token_ids=[stop]
                )
                for stop in stop_tokens
            ],
            use_tqdm=False,
        )
        assert [list(o.outputs[0].token_ids) for o in stopped] == plain_stopped
        counts()
        assert generate_ids(llm, long_answered, long_tokens) == plain[2:]
        counts()
        return after

    runs = on_engine(tiny_models["target"], config, run)
    drafts = [counts["num_drafts"] for counts, _ in runs]
    unrepaid = [stats["unrepaid_drafting_steps"] for _, stats in runs]
    prompt_pass_tokens = [stats["prompt_pass_tokens"] for _, stats in runs]
    print(
        f"drafts: {drafts}, steps not drafted for the prompt work: {unrepaid}, "
        f"draft prompt-pass tokens: {prompt_pass_tokens}"
    )
    assert drafts[0] == 0 and unrepaid[0] >= 2 * (short_tokens - 1)
    assert prompt_pass_tokens[0] == PRICING_PASS_TOKENS
    assert runs[0][1]["prompt_pass_seconds"] >= PROMPT_PASS_S
    # A pair decoding 256 tokens with every draft accepted drafts in about 2 x 64 steps.
    assert drafts[1] >= 64 and prompt_pass_tokens[1] - prompt_pass_tokens[0] >= 220
    assert drafts[2] == drafts[1] and unrepaid[2] - unrepaid[1] >= 2 * (short_tokens - 1)
    assert drafts[3] == drafts[2] and unrepaid[3] - unrepaid[2] >= 4 * (short_tokens - 1)
    assert prompt_pass_tokens[3] == prompt_pass_tokens[1]
    assert drafts[4] == drafts[3] and prompt_pass_tokens[4] == prompt_pass_tokens[3]
    assert drafts[5] - drafts[4] >= 64


def test_steps_without_drafts_skip_the_draft_which_catches_up_when_drafting_resumes(
    tiny_models: dict[str, Path], prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    """Two requests: while both run, the schedule drafts nothing and the draft does not
    run, not even over their prompts in the step that prefills them; once the second
    ends, the first drafts alone, after one catch-up pass that writes the draft's KV of
    its prompt and the ~23 tokens it decoded meanwhile. The draft is the target itself, on
    the full cache: with its KV complete it proposes what the target decodes, and every
    draft is accepted; with the pass run but its KV not written (the bug this test
    catches), 2 of 111 were, and with the prompts prefilled through the draft, the pass
    wrote the decoded tokens only."""
    from vllm import SamplingParams

    from specextend_vllm import retrieval_stats

    config = specextend_config(
        tiny_models["target"], num_speculative_tokens_per_batch_size=SCHEDULE, policy="full"
    )
    short_prompt, other_prompt = prompts[0], prompts[1]  # 40 and 100 tokens
    plain = decode(tiny_models["target"], [short_prompt], LONG_OUTPUT_TOKENS).outputs[0]

    def run(llm: Any) -> tuple[list[list[int]], dict[str, float], dict[str, Any]]:
        outputs = llm.generate(
            [{"prompt_token_ids": short_prompt}, {"prompt_token_ids": other_prompt}],
            [
                SamplingParams(max_tokens=LONG_OUTPUT_TOKENS, temperature=0.0, ignore_eos=True),
                SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
            ],
            use_tqdm=False,
        )
        return (
            [list(o.outputs[0].token_ids) for o in outputs],
            spec_decode_counts(llm),
            retrieval_stats(llm)[0],
        )

    outputs, counts, stats = on_engine(tiny_models["target"], config, run)
    assert outputs == [plain, plain_outputs[1]]
    assert stats["skipped_draft_steps"] >= 2 * (MAX_TOKENS - 2)
    assert stats["catch_up_passes"] >= 1
    assert stats["catch_up_tokens"] >= len(short_prompt) + MAX_TOKENS - 2
    assert counts["num_draft_tokens"] >= 3 * 8
    assert counts["num_accepted_tokens"] >= 0.9 * counts["num_draft_tokens"]


@pytest.mark.parametrize(
    "keys",
    [
        {"positions": "compact"},
        {"chunk_size": 32, "positions": "absolute"},
    ],
    ids=["working_copies", "whole_blocks"],
)
def test_catching_up_stays_lossless_over_reduced_caches(
    keys: dict[str, Any],
    tiny_models: dict[str, Path],
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
) -> None:
    """Requests ending one after another: batches of 2 or more skip the draft, the last
    request drafts alone after catching up, over retrieval's reduced caches (working
    copies re-rotated, or whole blocks). (Trees take no batch-size schedule: they skip
    the draft where `drafting: auto` chooses so, through the same code.)"""
    config = specextend_config(
        tiny_models["draft_noisy"], num_speculative_tokens_per_batch_size=SCHEDULE, **keys
    )
    max_tokens, outputs, _, stats = run_staggered(tiny_models["target"], config, prompts)
    assert outputs == [plain[:n] for plain, n in zip(plain_outputs, max_tokens)]
    assert stats["catch_up_passes"] >= 1 and stats["reduced_draft_steps"] > 0
    assert (stats["compact_draft_steps"] > 0) == (keys["positions"] == "compact")


@pytest.mark.parametrize("max_num_batched_tokens", [None, 64], ids=["one_pass", "two_pieces"])
def test_a_deferred_draft_prefill_is_written_at_the_first_drafting_step(
    max_num_batched_tokens: int | None, tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    """`draft_prefill: deferred`: the steps that prefill a 100-token prompt do not run the
    draft; the first drafting step writes the prompt's draft KV in catch-up passes of at
    most `max_num_batched_tokens` tokens. The target is its own draft, on the full cache:
    every draft is accepted once the prompt's KV is written; with the passes run but
    nothing written (the bug this test catches), 14 of 144 were."""
    config = specextend_config(tiny_models["target"], policy="full", draft_prefill="deferred")
    overrides = {}
    if max_num_batched_tokens is not None:
        overrides["max_num_batched_tokens"] = max_num_batched_tokens
    prompt = prompts[1:2]
    run = decode(tiny_models["target"], prompt, LONG_OUTPUT_TOKENS, config, **overrides)
    plain = decode(tiny_models["target"], prompt, LONG_OUTPUT_TOKENS).outputs
    assert run.outputs == plain
    assert run.stats["catch_up_tokens"] == len(prompt[0])
    assert run.stats["catch_up_passes"] == (1 if max_num_batched_tokens is None else 2)
    assert run.counts["num_draft_tokens"] >= NUM_SPECULATIVE_TOKENS * 8
    assert run.counts["num_accepted_tokens"] >= 0.9 * run.counts["num_draft_tokens"]


def test_a_prefix_cached_prompt_whose_draft_kv_was_never_written_is_caught_up(
    tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    """A first request ends at its first token under `draft_prefill: deferred`: its
    prompt's blocks enter vLLM's prefix cache without the draft's KV. The same prompt
    again hits them: the draft catches up from the first block it missed, and (the target
    being its own draft) every draft is accepted; without the blocks' flags (the bug this
    test catches) it drafts over a cache that holds nothing there."""
    from specextend_vllm import retrieval_stats

    config = specextend_config(tiny_models["target"], policy="full", draft_prefill="deferred")
    prompt = prompts[2:3]

    def run(llm: Any) -> tuple[list[list[int]], dict[str, float], dict[str, Any], float]:
        generate_ids(llm, prompt, 1)
        outputs = generate_ids(llm, prompt, LONG_OUTPUT_TOKENS)
        hits = [m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits"]
        return outputs, spec_decode_counts(llm), retrieval_stats(llm)[0], hits[0]

    outputs, counts, stats, prefix_cache_hits = on_engine(tiny_models["target"], config, run)
    assert outputs == decode(tiny_models["target"], prompt, LONG_OUTPUT_TOKENS).outputs
    assert prefix_cache_hits >= len(prompt[0]) - BLOCK_SIZE
    assert stats["catch_up_tokens"] >= len(prompt[0]) - BLOCK_SIZE
    assert counts["num_draft_tokens"] >= NUM_SPECULATIVE_TOKENS * 8
    assert counts["num_accepted_tokens"] >= 0.9 * counts["num_draft_tokens"]


@pytest.mark.parametrize("beside_a_new_prompt", [False, True], ids=["alone", "beside_a_new_prompt"])
def test_a_prompt_cached_whole_copies_the_draft_kv_of_the_block_vllm_computes_again(
    beside_a_new_prompt: bool, tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    """A prompt of 8 whole blocks, decoded twice: the second time vLLM's prefix cache holds
    it whole and vLLM computes its last block again, into a new block. The step copies the
    draft's KV of the block from the cached one, and the draft's pass keeps only the
    block's last token (alone, or beside a new prompt the draft computes whole); the target
    being its own draft, every later draft is accepted, with no catch-up pass. Injected:
    the copy left out (the bug this test catches), 41 of 69 drafts were accepted alone
    (48 of 48 with it) and 89 of 117 beside the new prompt (96 of 96)."""
    from specextend_vllm import retrieval_stats

    [prompt] = random_prompts([8 * BLOCK_SIZE], seed=3)
    again = [prompt, prompts[1]] if beside_a_new_prompt else [prompt]
    config = specextend_config(tiny_models["target"], policy="full")

    def run(llm: Any) -> tuple[list[list[int]], list[dict[str, Any]], list[dict[str, float]]]:
        stats, counts = [], []
        for batch, max_tokens in (([prompt], MAX_TOKENS), (again, LONG_OUTPUT_TOKENS)):
            outputs = generate_ids(llm, batch, max_tokens)
            stats.append(retrieval_stats(llm)[0])
            counts.append(spec_decode_counts(llm))
        return outputs, stats, counts

    outputs, (first_stats, stats), (first_counts, counts) = on_engine(
        tiny_models["target"], config, run
    )
    assert outputs == decode(tiny_models["target"], again, LONG_OUTPUT_TOKENS).outputs
    assert first_stats["copied_prompt_tokens"] == 0
    assert stats["copied_prompt_tokens"] == BLOCK_SIZE - 1
    assert stats["catch_up_passes"] == first_stats["catch_up_passes"] == 0
    drafted = counts["num_draft_tokens"] - first_counts["num_draft_tokens"]
    accepted = counts["num_accepted_tokens"] - first_counts["num_accepted_tokens"]
    assert drafted >= NUM_SPECULATIVE_TOKENS * 8 and accepted >= 0.9 * drafted


@pytest.mark.parametrize(
    "keys",
    [{}, {"tree": "dynamic", "num_speculative_tokens": 10, "tree_max_depth": 4}],
    ids=["reduced_caches", "dynamic_tree"],
)
def test_prompts_cached_whole_beside_new_ones_decode_losslessly(
    keys: dict[str, Any], tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    """Prompts of whole blocks decoded again beside new prompts, over retrieval's reduced
    caches (past the activation length) or as token trees, with a draft that is not the
    target: the draft's passes that keep only the copied blocks' last tokens draft for every
    request, and the output is the target's. On reduced caches, the copied requests select
    the chunks they selected when their prompts were new; injected: the planner given the
    draft's kept tokens in place of the target's batch (its scorer then reads other
    tokens' queries), both selections differed."""
    from specextend_vllm import retrieval_stats

    cached = random_prompts([6 * BLOCK_SIZE, 12 * BLOCK_SIZE], seed=4)
    again = [cached[0], prompts[3], cached[1], prompts[0]]
    config = specextend_config(tiny_models["draft_noisy"], **keys)

    def run(llm: Any) -> tuple[list[list[int]], list[dict[str, Any]], dict[str, Any]]:
        generate_ids(llm, cached, MAX_TOKENS)
        first_stats = retrieval_stats(llm)[0]
        return generate_ids(llm, again, MAX_TOKENS), first_stats, retrieval_stats(llm)[0]

    outputs, first_stats, stats = on_engine(tiny_models["target"], config, run)
    assert outputs == decode(tiny_models["target"], again, MAX_TOKENS).outputs
    assert stats["copied_prompt_tokens"] == 2 * (BLOCK_SIZE - 1)
    if "tree" not in keys:
        # Selected at the step that copied, from the target's queries of the prompts' last
        # tokens: as when the prompts were new.
        lengths = {len(prompt) for prompt in cached}
        first, second = (
            {s["context_len"]: s["kept_chunks"] for s in selections if s["context_len"] in lengths}
            for selections in (
                first_stats["selections"],
                stats["selections"][len(first_stats["selections"]) :],
            )
        )
        assert len(first) == 2 and second == first


def test_trees_skip_the_draft_where_auto_stops_drafting_and_catch_up_losslessly(
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
) -> None:
    """A dynamic tree with a draft never accepted: `drafting: auto` stops drafting after its
    first measurements, so the draft skips those steps, and drafts again when it explores,
    after catching up (trees take no batch-size schedule, so this is how they skip)."""
    from specextend_vllm import retrieval_stats

    unrelated = save_tiny_model(tmp_path_factory.mktemp("unrelated_tree") / "draft", seed=11)
    config = specextend_config(
        unrelated, drafting="auto", tree="dynamic", num_speculative_tokens=6, policy="full"
    )
    prompt, num_tokens = prompts[1:2], 96
    plain = decode(tiny_models["target"], prompt, num_tokens).outputs

    def run(llm: Any) -> tuple[list[list[int]], dict[str, Any]]:
        return generate_ids(llm, prompt, num_tokens), retrieval_stats(llm)[0]

    outputs, stats = on_engine(tiny_models["target"], config, run)
    assert outputs == plain
    assert stats["skipped_draft_steps"] > 0 and stats["catch_up_passes"] > 0
