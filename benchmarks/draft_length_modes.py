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
on the method's reduced cache.

    python -m benchmarks.draft_length_modes [--genres essays fiction code dialogue]
        [--skip-texts 2] [--length 8192] [--rounds 4] [--compiled] [--output NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator
from typing import Any

from benchmarks import engine
from benchmarks.genres import GENRES, genre_texts

# Mode name -> drafts per step, None for the chooser's own.
MODES: dict[str, int | None] = {"auto": None, "plain": 0, "fixed4": 4, "fixed2": 2}


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
    mode; each decode's tokens/s, drafts and accepted drafts per step, draft steps on the
    reduced cache (the rest drafted on the full one: `retrieval: auto` chooses as usual)
    and the chooser's state after it."""
    chooser = draft_length_chooser(llm)
    [first], _ = engine.generate(llm, [prompt], args.max_tokens)
    first_state = chooser_state(chooser)
    decodes: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        modes = list(MODES) if round_index % 2 == 0 else list(reversed(MODES))
        for mode in modes:
            retrieval_before = engine.retrieval_counters(llm)
            with fixed_draft_length(chooser, MODES[mode]):
                [request], _ = engine.generate(llm, [prompt], args.max_tokens)
            reduced_steps, _ = engine.reduced_steps_between(
                retrieval_before, engine.retrieval_counters(llm)
            )
            decodes[mode].append(
                {
                    "reduced_draft_steps": reduced_steps,
                    "drafting_steps": sum(1 for drafts in request.drafted_per_step if drafts),
                    "round": round_index,
                    "decode_tokens_per_s": (len(request.tokens) - 1) / request.decode_s,
                    "drafted_per_step": request.drafted_per_step,
                    "accepted_per_step": request.accepted_per_step,
                    "mean_acceptance_length": request.mean_acceptance_length,
                    "same_output_as_first": request.tokens == first.tokens,
                    "chooser_after": chooser_state(chooser),
                }
            )
    return {
        "first_decode_s": first.decode_s,
        "ttft_s": first.ttft_s,
        "first_drafted_per_step": first.drafted_per_step,
        "first_accepted_per_step": first.accepted_per_step,
        "chooser_after_first": first_state,
        "decodes": decodes,
    }


def summary(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per mode: the median tokens/s of its decodes, their range, and the median over
    plain's and over the fastest mode's other than `auto`."""
    medians = {
        mode: statistics.median(d["decode_tokens_per_s"] for d in decodes)
        for mode, decodes in results["decodes"].items()
    }
    fastest_other = max(v for mode, v in medians.items() if mode != "auto")
    rows = {}
    for mode, decodes in results["decodes"].items():
        rates = [d["decode_tokens_per_s"] for d in decodes]
        rows[mode] = {
            "median": medians[mode],
            "min": min(rates),
            "max": max(rates),
            "vs_plain": medians[mode] / medians["plain"],
            "vs_fastest_other": medians[mode] / fastest_other,
        }
    return rows


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import int8_draft, qwen_pair
    from benchmarks.prompts import summary_prompt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--genres", nargs="+", choices=list(GENRES), default=["essays", "fiction", "code", "dialogue"])
    parser.add_argument("--skip-texts", type=int, default=2, help="leave out each genre's first N texts")
    parser.add_argument("--length", type=int, default=8192, help="prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--compiled", action="store_true", help="vLLM's default compiled mode")
    parser.add_argument("--output", default="draft_length_modes")
    args = parser.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    _, target = qwen_pair()
    draft = int8_draft()
    tokenizer = AutoTokenizer.from_pretrained(target)
    llm = engine.make_llm(
        target,
        {"method": "specextend", "model": str(draft), "num_speculative_tokens": 4},
        args.length + args.max_tokens + 64,
        enforce_eager=not args.compiled,
    )
    results: dict[str, Any] = {}
    for genre, texts in genre_texts(args.genres).items():
        name, text = list(texts.items())[args.skip_texts]
        llm.reset_prefix_cache()
        prompt_results = run_prompt(llm, summary_prompt(tokenizer, text, args.length), args)
        prompt_results["summary"] = summary(prompt_results)
        results[f"{genre}: {name}"] = prompt_results
        print(f"\n{genre}: {name}, {args.length} tokens")
        print("| mode | decode tokens/s (min-max) | vs plain | vs the fastest other |")
        for mode, row in prompt_results["summary"].items():
            print(
                f"| {mode} | {row['median']:.2f} ({row['min']:.2f}-{row['max']:.2f}) | "
                f"{row['vs_plain']:.2f} | {row['vs_fastest_other']:.2f} |",
                flush=True,
            )
    engine.close(llm)
    path = engine.save_record(args.output, args, results)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
