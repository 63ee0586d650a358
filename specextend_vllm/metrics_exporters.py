"""The method's numbers as vLLM's front end exports them: Prometheus counters next to vLLM's
`vllm:spec_decode_*`, and lines in vLLM's periodic stats log. Both take one engine step's
new counts and decoding steps at a time; `patches.metrics.SpecExtendStatLogger` feeds them
from vLLM's stats.
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client

from specextend_vllm.metrics import DecodingSteps, SpecExtendCounts

# SpecExtendCounts field -> counter name and help; the exposition appends `_total`.
PROMETHEUS_COUNTERS: dict[str, tuple[str, str]] = {
    "retrievals": (
        "vllm:specextend_retrievals",
        "Chunk selections of SpecExtend, one per request that selects.",
    ),
    "reduced_draft_steps": (
        "vllm:specextend_reduced_draft_steps",
        "Request draft steps on a reduced cache (kept chunks and the newest tokens).",
    ),
    "compact_draft_steps": (
        "vllm:specextend_compact_draft_steps",
        "Request draft steps on a reduced cache with compact positions.",
    ),
    "full_draft_steps": (
        "vllm:specextend_full_draft_steps",
        "Request draft steps on the full cache.",
    ),
    "kept_tokens": (
        "vllm:specextend_kept_tokens",
        "Tokens the draft attends to, summed over reduced draft steps.",
    ),
    "context_tokens": (
        "vllm:specextend_context_tokens",
        "Context tokens of the requests, summed over reduced draft steps.",
    ),
    "scorer_calls": (
        "vllm:specextend_scorer_calls",
        "Calls of the chunk scorer (one per batch of selecting requests).",
    ),
    "scorer_seconds": (
        "vllm:specextend_scorer_seconds",
        "Wall-clock seconds spent in the chunk scorer.",
    ),
    "hybrid_verifications": (
        "vllm:specextend_hybrid_verifications",
        "Target forward passes that verified drafts through hybrid tree attention.",
    ),
    "native_verifications": (
        "vllm:specextend_native_verifications",
        "Target forward passes that verification_attention auto chose to verify on vLLM's attention.",
    ),
    "kernel_decode_steps": (
        "vllm:specextend_kernel_decode_steps",
        "Plain decoding steps whose target attention verification_attention auto ran on "
        "the plugin's prefix kernel.",
    ),
    "reduced_verified_drafts": (
        "vllm:specextend_reduced_verified_drafts",
        "Draft tokens drafted on a reduced cache that the target verified.",
    ),
    "reduced_accepted_drafts": (
        "vllm:specextend_reduced_accepted_drafts",
        "Draft tokens drafted on a reduced cache that the target accepted.",
    ),
    "full_verified_drafts": (
        "vllm:specextend_full_verified_drafts",
        "Draft tokens drafted on the full cache that the target verified.",
    ),
    "full_accepted_drafts": (
        "vllm:specextend_full_accepted_drafts",
        "Draft tokens drafted on the full cache that the target accepted.",
    ),
    "skipped_draft_steps": (
        "vllm:specextend_skipped_draft_steps",
        "Request steps that drafted nothing and did not run the draft.",
    ),
    "catch_up_passes": (
        "vllm:specextend_catch_up_passes",
        "Draft passes writing the KV of the tokens of skipped draft steps.",
    ),
    "catch_up_tokens": (
        "vllm:specextend_catch_up_tokens",
        "Tokens written by the draft's catch-up passes.",
    ),
    "copied_prompt_tokens": (
        "vllm:specextend_copied_prompt_tokens",
        "Prompt tokens computed again that the draft left out, its KV copied from cached blocks.",
    ),
    "windowed_prompt_tokens": (
        "vllm:specextend_windowed_prompt_tokens",
        "Tokens whose draft pass over the prompt attended through draft_prefill_window.",
    ),
    "prompt_pass_tokens": (
        "vllm:specextend_prompt_pass_tokens",
        "Tokens of the draft's passes over prompts (prefills and catch-up passes).",
    ),
    "prompt_pass_seconds": (
        "vllm:specextend_prompt_pass_seconds",
        "Wall-clock seconds of the draft's passes over prompts.",
    ),
    "unrepaid_drafting_steps": (
        "vllm:specextend_unrepaid_drafting_steps",
        "Request steps in a batch run without drafts because the tokens left to decode "
        "would not repay the draft's pending prompt work.",
    ),
}


# DecodingStepTally field -> counter name and help, labelled by DECODING_STEP_LABELS.
DECODING_STEP_COUNTERS: dict[str, tuple[str, str]] = {
    "steps": (
        "vllm:specextend_decoding_steps",
        "Decoding steps the scheduler timed, by batch sizes, drafts verified per request "
        "and drafts proposed for the next step.",
    ),
    "seconds": (
        "vllm:specextend_decoding_step_seconds",
        "Wall-clock seconds of those steps, the next drafts' proposal included.",
    ),
    "tokens": (
        "vllm:specextend_decoding_step_tokens",
        "Tokens those steps gave their requests (one each and the drafts it accepted).",
    ),
}
DECODING_STEP_LABELS = ["batch_sizes", "num_drafts", "next_drafts"]


class SpecExtendProm:
    """One Prometheus counter per count, with vLLM's labels, and per decoding-step figure,
    with vLLM's labels and DECODING_STEP_LABELS, in prometheus_client's default registry
    (the one vLLM's `/metrics` and `LLM.get_metrics()` read)."""

    def __init__(self, labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]):
        self._labelvalues = per_engine_labelvalues
        self._per_engine: dict[str, dict[int, prometheus_client.Counter]] = {}
        for field, (name, documentation) in PROMETHEUS_COUNTERS.items():
            counter = prometheus_client.Counter(
                name=name, documentation=documentation, labelnames=labelnames
            )
            self._per_engine[field] = {
                engine: counter.labels(*values) for engine, values in per_engine_labelvalues.items()
            }
        self._decoding_steps = {
            field: prometheus_client.Counter(
                name=name,
                documentation=documentation,
                labelnames=labelnames + DECODING_STEP_LABELS,
            )
            for field, (name, documentation) in DECODING_STEP_COUNTERS.items()
        }

    def observe(self, counts: SpecExtendCounts, engine_idx: int) -> None:
        for field, per_engine in self._per_engine.items():
            value = getattr(counts, field)
            if value:
                per_engine[engine_idx].inc(value)

    def observe_decoding_steps(self, steps: DecodingSteps, engine_idx: int) -> None:
        labelvalues = self._labelvalues[engine_idx]
        for tally in steps.rows():
            labels = (tally.batch_sizes, str(tally.num_drafts), str(tally.next_drafts))
            for field, counter in self._decoding_steps.items():
                counter.labels(*labelvalues, *labels).inc(getattr(tally, field))


class SpecExtendLogging:
    """Sums each engine's counts, and its decoding steps, between two logs; an engine that
    did no work since the last log gets no line."""

    def __init__(self) -> None:
        self._since_last_log: dict[int, SpecExtendCounts] = {}
        self._steps_since_last_log: dict[int, DecodingSteps] = {}

    def observe(self, counts: SpecExtendCounts, engine_idx: int) -> None:
        self._since_last_log.setdefault(engine_idx, SpecExtendCounts()).add(counts)

    def observe_decoding_steps(self, steps: DecodingSteps, engine_idx: int) -> None:
        self._steps_since_last_log.setdefault(engine_idx, DecodingSteps()).add(steps)

    def log(self, log_fn: Callable[..., None]) -> None:
        for engine_idx, counts in sorted(self._since_last_log.items()):
            summary = counts.summary()
            log_fn(
                "Engine %03d: SpecExtend metrics: Retrievals: %d, Reduced draft steps: %d "
                "(compact positions: %d), Full draft steps: %d, Mean kept tokens: %.1f of "
                "%.1f context tokens, Scorer: %d calls, %.3f s, Verifications: %d hybrid, %d native, "
                "Plain decoding steps on the prefix kernel: %d, "
                "Accepted drafts: %d of %d on reduced caches, %d of %d on full caches, "
                "Skipped draft steps: %d, Catch-up: %d passes, %d tokens, Copied prompt tokens: %d, "
                "Windowed prompt tokens: %d, Draft prompt passes: %d tokens, %.3f s, "
                "Steps not drafted for the draft's prompt work: %d",
                engine_idx,
                counts.retrievals,
                counts.reduced_draft_steps,
                counts.compact_draft_steps,
                counts.full_draft_steps,
                summary["mean_kept_tokens"],
                summary["mean_context_tokens"],
                counts.scorer_calls,
                counts.scorer_seconds,
                counts.hybrid_verifications,
                counts.native_verifications,
                counts.kernel_decode_steps,
                counts.reduced_accepted_drafts,
                counts.reduced_verified_drafts,
                counts.full_accepted_drafts,
                counts.full_verified_drafts,
                counts.skipped_draft_steps,
                counts.catch_up_passes,
                counts.catch_up_tokens,
                counts.copied_prompt_tokens,
                counts.windowed_prompt_tokens,
                counts.prompt_pass_tokens,
                counts.prompt_pass_seconds,
                counts.unrepaid_drafting_steps,
            )
        self._since_last_log.clear()
        for engine_idx, steps in sorted(self._steps_since_last_log.items()):
            log_fn(
                "Engine %03d: SpecExtend decoding steps (batch sizes x drafts: steps, mean "
                "step, tokens/s): %s",
                engine_idx,
                "; ".join(
                    f"{tally.batch_sizes} x {tally.drafts}: {tally.steps}, "
                    f"{1000 * tally.seconds / tally.steps:.1f} ms, "
                    f"{tally.tokens / tally.seconds:.2f}"
                    for tally in steps.rows()
                ),
            )
        self._steps_since_last_log.clear()
