"""`drafting: auto` against fixed numbers of drafts, in one engine, taking turns.

One `specextend` engine at its defaults (in-process, so that its scheduler's draft-length
chooser is reachable) decodes each prompt several times per round, once in each mode:
`auto` (the chooser), `plain` (no drafts: the draft does not run) and fixed numbers of
drafts (the chooser's table held at that number for every batch size, its measurements
paused). Rounds alternate the order of the modes (A B C D, D C B A, ...), so a slower or
faster stretch of the machine falls on every mode alike, which engines run one after the
other cannot give (two engines of the 1.5B fp32 target do not fit in 24 GB side by side).
The chooser keeps what it learned from one prompt to the next, as in the speed suite.
`plain` is no speculation within the same engine; `fixed4` drafts as `draft_model` does,
on the method's reduced cache. `plain_vllm_attention` is `plain` with its steps' attention
held on vLLM's decode kernel (`plain` takes the plugin's prefix kernel where
`verification_attention: auto` measures it faster): no speculation's step.
`auto_full_cache` is `auto` with the draft held on the full cache (`retrieval: never`
within the engine): against `auto`, what `retrieval: auto` gains or loses.
`draft_model_like` drafts 4 every step on the full cache, verified on vLLM's attention:
`draft_model`'s algorithm in this engine (with the int8 draft, the draft's LM head is the
plugin's int8 rows, where `draft_model` runs it as loaded, in fp32: its proposal costs
more; with `--draft-precision fp32` both run it as loaded). At the defaults the draft
writes its KV of a prompt through `draft_prefill_window`, which `draft_model` does not:
on prompts longer than the window `draft_model_like` then reads a draft KV that
`draft_model` would not, and can accept less than it; `--draft-prefill-window none`
writes it over the whole prompt in every mode. The choices
these modes hold are paused meanwhile. `fixed4_hybrid` and `fixed4_vllm_verification`
are `fixed4` verifying on hybrid attention and on vLLM's attention, whatever `auto` measures:
the engine is reconfigured for them and back, which starts retrieval's state and the
`auto` choosers afresh, so they are meant for prompts below `activation_length`. Each
decode also records the parts of a decoding step (ms, the means of its steps: the
target's forward, the proposal and its draft passes, ...).

    python -m benchmarks.draft_length_modes [--genres essays fiction code dialogue]
        [--skip-texts 2 | --texts NAME ...] [--length 8192] [--rounds 4] [--modes ...] [--compiled]
        [--draft-precision int8|fp32] [--draft-prefill-window default|none] [--output NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from benchmarks import engine  # noqa: E402
from benchmarks.genres import GENRES, prompt_texts  # noqa: E402

# Mode name -> drafts per step, None for the chooser's own.
MODES: dict[str, int | None] = {
    "auto": None,
    "auto_full_cache": None,
    "plain": 0,
    "plain_vllm_attention": 0,
    "fixed4": 4,
    "fixed3": 3,
    "fixed2": 2,
    "fixed4_hybrid": 4,
    "fixed4_vllm_verification": 4,
    "draft_model_like": 4,
}
# The choices a mode holds whatever `auto` measures (`held_choices`): plain decoding steps
# and verifying ones on vLLM's attention, the draft on the full cache.
HELD_CHOICES = {
    "auto_full_cache": ("full_cache",),
    "plain_vllm_attention": ("vllm_decode_attention",),
    "draft_model_like": ("vllm_decode_attention", "vllm_verification_attention", "full_cache"),
}
# Modes that verify with this `verification_attention`, the engine reconfigured for them.
VERIFICATION_MODES = {"fixed4_hybrid": "hybrid", "fixed4_vllm_verification": "native"}
NOT_DEFAULT_MODES = set(HELD_CHOICES) | set(VERIFICATION_MODES)
MAX_DRAFTS = 4


def draft_length_chooser(llm: Any) -> Any:
    """The chooser of an in-process engine's scheduler."""
    from specextend_vllm.patches.scheduler import draft_length_chooser

    return draft_length_chooser(llm.llm_engine.engine_core.engine_core.scheduler)


@contextlib.contextmanager
def fixed_draft_length(chooser: Any, num_drafts: int | None) -> Iterator[None]:
    """The chooser's table held at `num_drafts` for every batch size, its measurements
    paused; with None, the chooser as it is."""
    if num_drafts is None:
        yield
        return
    kept = list(chooser.lookup)
    chooser.record_step = lambda *args, **kwargs: None
    chooser.lookup[:] = [num_drafts] * len(chooser.lookup)
    try:
        yield
    finally:
        del chooser.record_step
        chooser.lookup[:] = kept


@contextlib.contextmanager
def recorded_steps(chooser: Any) -> Iterator[list[tuple[int, int, float]]]:
    """The steps the chooser is told of meanwhile (paused or not): drafts verified, drafts
    scheduled next and the step's time (ms), in order."""
    steps: list[tuple[int, int, float]] = []
    record_step = chooser.record_step
    held = chooser.__dict__.get("record_step")

    def recording(
        batch_size: int, verified: int, scheduled: int, seconds: float, *args: Any
    ) -> None:
        steps.append((verified, scheduled, 1000 * seconds))
        record_step(batch_size, verified, scheduled, seconds, *args)

    chooser.record_step = recording
    try:
        yield steps
    finally:
        if held is None:
            del chooser.record_step
        else:
            chooser.record_step = held


# Per choice a mode may hold: the chooser (from the worker's drafter), the method that
# answers it and the answer held.
PINS: dict[str, tuple[Callable[[Any], Any], str, bool]] = {
    "vllm_decode_attention": (
        lambda drafter: drafter.verification.decoding_chooser, "verifies_natively", True
    ),
    "vllm_verification_attention": (
        lambda drafter: drafter.verification.verifying_chooser, "verifies_natively", True
    ),
    "full_cache": (lambda drafter: drafter.planner.chooser, "reduces", False),
}


def hold_choices(worker: Any, choices: tuple[str, ...], hold: bool) -> None:
    """Pins (or frees) `choices` on one rank, their measurements paused: the attention of
    plain decoding steps (`vllm_decode_attention`) and of verifying ones
    (`vllm_verification_attention`) on vLLM's, whatever `verification_attention: auto`
    measures, and the draft on the full cache (`full_cache`), whatever `retrieval: auto`
    does."""
    for choice in choices:
        chooser_of, method, answer = PINS[choice]
        chooser = chooser_of(worker.model_runner.drafter)
        if hold:
            setattr(chooser, method, lambda *args, answer=answer: answer)
            chooser.record_step = lambda *args: None
        else:
            delattr(chooser, method)
            del chooser.record_step


@contextlib.contextmanager
def held_choices(llm: Any, choices: tuple[str, ...]) -> Iterator[None]:
    """The engine with `choices` held on every rank (`hold_choices`), then freed."""
    if not choices:
        yield
        return
    llm.collective_rpc(hold_choices, args=(choices, True))
    try:
        yield
    finally:
        llm.collective_rpc(hold_choices, args=(choices, False))


@contextlib.contextmanager
def verification_attention(llm: Any, value: str | None) -> Iterator[None]:
    """The engine verifying with `verification_attention: value`, then `auto` again; with
    None, as it is."""
    from specextend_vllm import reconfigure

    if value is None:
        yield
        return
    reconfigure(llm, verification_attention=value)
    try:
        yield
    finally:
        reconfigure(llm, verification_attention="auto")


def step_parts_ms(llm: Any, max_decode_tokens: int, decode_s: float) -> dict[str, float]:
    """Each part of a decoding step (`engine.time_breakdown`: the target's forward, the
    proposal and its draft passes, ...), ms, the mean of the steps timed since the last
    call (prefill steps left out)."""
    from specextend_vllm import step_timings

    breakdown = engine.time_breakdown(step_timings(llm)[0], max_decode_tokens, decode_s)
    return {
        field.removesuffix("_s"): 1000 * seconds
        for field, seconds in breakdown.items()
        if field.endswith("_s")
    }


def attention_state(worker: Any, verifying: bool) -> dict[int, dict[str, float]]:
    """Per context bucket (`algorithm.verification_choice`) of verifying steps (`verifying`)
    or of plain decoding ones: the attention time of a step on the plugin's kernel (hybrid
    attention, for verifying) and on vLLM's (ms, the median of its recent steps) and how
    many steps measured each."""
    verification = worker.model_runner.drafter.verification
    chooser = verification.verifying_chooser if verifying else verification.decoding_chooser
    if chooser is None:
        return {}
    return {
        index: {
            "kernel_ms": 1000 * bucket.first.step_s.value,
            "vllm_ms": 1000 * bucket.second.step_s.value,
            "kernel_steps": bucket.first.samples,
            "vllm_steps": bucket.second.samples,
        }
        for index, bucket in enumerate(chooser.buckets)
        if bucket.first.samples and bucket.second.samples
    }


def retrieval_state(worker: Any) -> dict[str, dict[str, Any]]:
    """`retrieval: auto`'s choices on one rank, per bucket measured both ways: per number of
    drafts compared, whether it prefers the reduced cache and each way's tokens per step as
    the comparison reads them (from steps of any number of drafts); per number of drafts
    measured both ways around a switch, the reduced cache's step time over the full one's;
    each way's measured steps."""
    chooser = worker.model_runner.drafter.planner.chooser
    if chooser is None:
        return {}
    state = {}
    for bucket_index, bucket in sorted(chooser.buckets.items()):
        if not min(bucket.steps):
            continue
        compared = sorted(bucket.prefers_reduced)
        tokens = {num_drafts: bucket.tokens_estimates(num_drafts) for num_drafts in compared}
        state[str(bucket_index)] = {
            "prefers_reduced": {count: bucket.prefers_reduced[count] for count in compared},
            "reduced_over_full_time": bucket.time_ratio.ratios(),
            "full_tokens": {count: full.value for count, (full, _) in tokens.items()},
            "reduced_tokens": {count: reduced.value for count, (_, reduced) in tokens.items()},
            "full_steps": bucket.steps[0],
            "reduced_steps": bucket.steps[1],
        }
    return state


def chooser_state(chooser: Any) -> dict[str, Any]:
    """What the chooser holds: for a request alone, the length it keeps (0: no drafts),
    each measured length's step time (the median of its recent steps, ms) and number of
    measured steps; for all batch sizes, each draft's acceptance among the requests that
    accepted those before it."""
    bucket = chooser.buckets[0]
    measured = {j: times for j, times in enumerate(bucket.step_s) if times.samples}
    return {
        "kept_length": bucket.length,
        "step_ms": {j: 1000 * times.value for j, times in measured.items()},
        "measured_steps": {j: times.samples for j, times in measured.items()},
        "draft_acceptance": chooser.draft_acceptance_rates(),
    }


def run_prompt(llm: Any, prompt: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """The prompt's prefill and one decode in `auto`, then `args.rounds` rounds of every
    mode; each decode's tokens/s, the machine's memory bandwidth just before it, drafts
    and accepted drafts per step, draft steps on the reduced cache (the rest drafted on the
    full one: `retrieval: auto` chooses as usual), verifications on hybrid attention and on
    vLLM's, the steps `drafting: auto`'s chooser was told of (`recorded_steps`) and the two
    choosers' state after it; after the last, the attention choosers' state."""
    from specextend_vllm import step_timings

    chooser = draft_length_chooser(llm)
    [first], _ = engine.generate(llm, [prompt], args.max_tokens)
    first_state = chooser_state(chooser)
    decodes: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    for round_index in range(args.rounds):
        modes = list(args.modes) if round_index % 2 == 0 else list(reversed(args.modes))
        for mode in modes:
            with verification_attention(llm, VERIFICATION_MODES.get(mode)):
                memory_gbps = engine.machine_memory_gbps()
                retrieval_before = engine.retrieval_counters(llm)
                step_timings(llm)  # the steps timed before this decode, dropped
                with fixed_draft_length(chooser, MODES[mode]), held_choices(
                    llm, HELD_CHOICES.get(mode, ())
                ), recorded_steps(chooser) as steps:
                    [request], _ = engine.generate(llm, [prompt], args.max_tokens)
                parts_ms = step_parts_ms(llm, MAX_DRAFTS + 1, request.decode_s)
            retrieval_after = engine.retrieval_counters(llm)
            reduced_steps, _ = engine.reduced_steps_between(retrieval_before, retrieval_after)
            decodes[mode].append(
                {
                    "reduced_draft_steps": reduced_steps,
                    **{
                        counter: retrieval_after[counter] - retrieval_before[counter]
                        for counter in ("hybrid_verifications", "native_verifications")
                    },
                    "drafting_steps": sum(1 for drafts in request.drafted_per_step if drafts),
                    "round": round_index,
                    "decode_tokens_per_s": (len(request.tokens) - 1) / request.decode_s,
                    "target_forward_ms": parts_ms.get("target_forward"),
                    "step_parts_ms": parts_ms,
                    "machine_memory_gbps": memory_gbps,
                    "drafted_per_step": request.drafted_per_step,
                    "accepted_per_step": request.accepted_per_step,
                    "mean_acceptance_length": request.mean_acceptance_length,
                    "same_output_as_first": request.tokens == first.tokens,
                    "chooser_after": chooser_state(chooser),
                    "chooser_steps": steps,
                    "retrieval_after": llm.collective_rpc(retrieval_state)[0],
                }
            )
    return {
        "decode_attention": llm.collective_rpc(attention_state, args=(False,))[0],
        "verification_attention": llm.collective_rpc(attention_state, args=(True,))[0],
        "first_decode_s": first.decode_s,
        "ttft_s": first.ttft_s,
        "first_drafted_per_step": first.drafted_per_step,
        "first_accepted_per_step": first.accepted_per_step,
        "chooser_after_first": first_state,
        "decodes": decodes,
    }


def summary(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per mode: the median tokens/s of its decodes, their range, the median over plain's,
    over the fastest mode's other than `auto` and, with both in the run, over the faster
    of `plain_vllm_attention` and `draft_model_like` (no speculation and `draft_model` in
    this engine), and the median of the decodes' target forward per step (ms)."""
    medians = {
        mode: statistics.median(d["decode_tokens_per_s"] for d in decodes)
        for mode, decodes in results["decodes"].items()
    }
    fastest_other = max(v for mode, v in medians.items() if mode != "auto")
    faster = (
        max(medians["plain_vllm_attention"], medians["draft_model_like"])
        if {"plain_vllm_attention", "draft_model_like"} <= medians.keys()
        else None
    )
    rows = {}
    for mode, decodes in results["decodes"].items():
        rates = [d["decode_tokens_per_s"] for d in decodes]
        rows[mode] = {
            "median": medians[mode],
            "min": min(rates),
            "max": max(rates),
            "vs_plain": medians[mode] / medians["plain"],
            "vs_fastest_other": medians[mode] / fastest_other,
            "target_forward_ms": statistics.median(
                d.get("target_forward_ms") or 0.0 for d in decodes
            ),
        }
        if faster is not None:
            rows[mode]["vs_faster_alternative"] = medians[mode] / faster
            rows[mode]["vs_draft_model_like"] = medians[mode] / medians["draft_model_like"]
    return rows


def prompt_labels(args: argparse.Namespace) -> dict[str, str]:
    """The texts to prompt with, by label: `--texts` by name, or else one text of each genre
    of `--genres`, its first `--skip-texts` left out (`benchmarks.genres.prompt_texts`)."""
    texts = prompt_texts(args.texts, None if args.texts else args.genres, args.skip_texts, 1)
    return {f"{genre}: {name}" if genre else name: text for genre, name, text in texts}


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import int8_draft, qwen_pair
    from benchmarks.prompts import summary_prompt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--genres", nargs="+", choices=list(GENRES), default=["essays", "fiction", "code", "dialogue"])
    parser.add_argument("--skip-texts", type=int, default=2, help="leave out each genre's first N texts")
    parser.add_argument(
        "--texts", nargs="+",
        help="prompt with these texts, by name, instead of --genres (code/MODULE: a module of "
        "the standard library)",
    )
    parser.add_argument("--length", type=int, default=8192, help="prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--modes", nargs="+", choices=list(MODES), default=[m for m in MODES if m not in NOT_DEFAULT_MODES],
        help="the modes each round decodes in (plain among them)",
    )
    parser.add_argument("--compiled", action="store_true", help="vLLM's default compiled mode")
    parser.add_argument("--draft-precision", choices=["int8", "fp32"], default="int8")
    parser.add_argument(
        "--draft-prefill-window", choices=["default", "none"], default="default",
        help="none: the draft writes its KV of the prompt attending to the whole prompt, as "
        "vLLM's draft_model does, so that draft_model_like reads the KV draft_model reads",
    )
    parser.add_argument("--output", default="draft_length_modes")
    args = parser.parse_args()
    if "plain" not in args.modes:
        parser.error("--modes must include plain: every mode is compared with it")

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    fp32_draft, target = qwen_pair()
    draft = int8_draft() if args.draft_precision == "int8" else fp32_draft
    tokenizer = AutoTokenizer.from_pretrained(target)
    llm = engine.make_llm(
        target,
        {
            "method": "specextend",
            "model": str(draft),
            "num_speculative_tokens": MAX_DRAFTS,
            **({"draft_prefill_window": None} if args.draft_prefill_window == "none" else {}),
        },
        args.length + args.max_tokens + 64,
        enforce_eager=not args.compiled,
    )
    results: dict[str, Any] = {}
    for label, text in prompt_labels(args).items():
        llm.reset_prefix_cache()
        prompt_results = run_prompt(llm, summary_prompt(tokenizer, text, args.length), args)
        prompt_results["summary"] = summary(prompt_results)
        results[label] = prompt_results
        print(f"\n{label}, {args.length} tokens")
        print(
            "| mode | decode tokens/s (min-max) | vs plain | vs the fastest other "
            "| vs the faster alternative | vs draft_model_like | target forward ms |"
        )
        for mode, row in prompt_results["summary"].items():
            print(
                f"| {mode} | {row['median']:.2f} ({row['min']:.2f}-{row['max']:.2f}) | "
                f"{row['vs_plain']:.2f} | {row['vs_fastest_other']:.2f} "
                f"| {row.get('vs_faster_alternative', float('nan')):.2f} "
                f"| {row.get('vs_draft_model_like', float('nan')):.2f} "
                f"| {row['target_forward_ms']:.0f} |",
                flush=True,
            )
    engine.close(llm)
    path = engine.save_record(args.output, args, results)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
