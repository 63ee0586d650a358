"""What the method itself adds to a decoding step, by context length.

    python -m benchmarks.method_cost                    # 3K, 8K, 16K; about 20 min here
    python -m benchmarks.method_cost --lengths 3072 --repeats 5

One `specextend` engine (the int8 draft, k = 4, drafting every step) decodes one prompt
per length (a text cut to each length, longest first so that the shorter prompts' prefill
comes from the prefix cache), `--max-tokens` greedy tokens `--repeats` times, in three
settings switched on the running engine:

- `cmr`: retrieval on every step (`retrieval: always`), hybrid verification: the step
  timings give the retrieval planner's time per step (selecting, scoring, copying, laying
  out tables), of which the chunk scores and the working copies;
- `native_verification`: the same, verified through vLLM's attention: the target's forward
  against `cmr`'s is what hybrid verification adds (or saves);
- `full_cache`: `policy: full`, the draft on the whole cache as `draft_model` drafts: the
  proposal against `cmr`'s is what retrieval saves the draft's passes.

Per step, median of the repeats (min-max): the step, the target's forward, the proposal,
the draft's first and later passes, the planner, the scores, the copies; and each part's
share of the step. Saved to benchmarks/results/method_cost.json.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from benchmarks import assets, engine  # noqa: E402
from benchmarks.draft_cost import DEFAULT_TEXT, summary  # noqa: E402
from benchmarks.prompts import summary_prompt  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "cmr": {"policy": "cmr", "verification_attention": "hybrid"},
    "native_verification": {"policy": "cmr", "verification_attention": "native"},
    "full_cache": {"policy": "full", "verification_attention": "hybrid"},
}
PER_STEP_FIELDS = (
    "step_s",
    "target_forward_s",
    "propose_s",
    "first_draft_pass_s",
    "later_draft_pass_s",
    "retrieval_s",
    "chunk_scores_s",
    "working_copies_s",
)


def decode_once(llm: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """One timed decode of the (cached) prompt: per-step means of the step timings, the
    mean acceptance length and the output tokens."""
    from specextend_vllm import step_timings

    step_timings(llm)
    [figures], _ = engine.generate(llm, [prompt], max_tokens)
    steps = engine.time_breakdown(step_timings(llm)[0], engine.MAX_DECODE_STEP_TOKENS, figures.decode_s)
    return {
        **{field: steps.get(field, 0.0) for field in PER_STEP_FIELDS},
        "tokens_per_s": (max_tokens - 1) / figures.decode_s,
        "mean_acceptance_length": engine.mean_acceptance_length([figures]),
        "tokens": figures.tokens,
    }


def main() -> None:
    from transformers import AutoTokenizer

    from specextend_vllm import reconfigure

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 8192, 3072])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--text", default=DEFAULT_TEXT, help="a name from benchmarks.assets.long_texts()")
    parser.add_argument("--draft-precision", choices=("int8", "fp32"), default="int8")
    parser.add_argument("--output", default="method_cost")
    args = parser.parse_args()
    fp32_draft, target = assets.qwen_pair()
    draft = assets.int8_draft() if args.draft_precision == "int8" else fp32_draft
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = assets.long_texts()[args.text]
    lengths = sorted(args.lengths, reverse=True)
    config = engine.specextend_every_step(draft, args.k)
    llm = engine.make_llm(target, config, max(lengths) + args.max_tokens + 64)
    results: dict[str, dict[str, Any]] = {}
    try:
        for length in lengths:
            prompt = summary_prompt(tokenizer, text, length)
            started = time.perf_counter()
            engine.generate(llm, [prompt], 1)
            print(f"{length}: prefill {time.perf_counter() - started:.0f} s", flush=True)
            results[str(length)] = {}
            for name, keys in SETTINGS.items():
                reconfigure(llm, **keys)
                engine.generate(llm, [prompt], args.max_tokens)
                runs = [decode_once(llm, prompt, args.max_tokens) for _ in range(args.repeats)]
                figures = {
                    field: summary([run[field] for run in runs])
                    for field in (*PER_STEP_FIELDS, "tokens_per_s", "mean_acceptance_length")
                }
                results[str(length)][name] = figures
                print(
                    f"  {name}: {figures['tokens_per_s']['median']:.2f} tokens/s, step "
                    f"{1000 * figures['step_s']['median']:.0f} ms, planner "
                    f"{1000 * figures['retrieval_s']['median']:.1f} ms",
                    flush=True,
                )
    finally:
        engine.close(llm)
    print_table(results)
    print(f"saved {engine.save_record(args.output, args, results)}")


def ms(figures: dict[str, Any], field: str) -> str:
    """A timing's median (min-max) in milliseconds."""
    cell = figures[field]
    return f"{1000 * cell['median']:.1f} ({1000 * cell['min']:.1f}-{1000 * cell['max']:.1f})"


def print_table(results: dict[str, dict[str, Any]]) -> None:
    """Per length: the planner's share of a step and its parts, what hybrid verification
    adds to the target's forward, and what retrieval saves the proposal."""
    print(
        "\n| context | step ms | planner ms (share) | scores ms | copies ms | target forward ms,"
        " hybrid / native | proposal ms, cmr / full cache | tokens/s cmr / native / full cache |"
    )
    print("|---" * 8 + "|")
    for length, settings in results.items():
        cmr, native, full = (settings[name] for name in SETTINGS)

        share = cmr["retrieval_s"]["median"] / cmr["step_s"]["median"]
        print(
            f"| {int(length) // 1024}K | {ms(cmr, 'step_s')} | {ms(cmr, 'retrieval_s')} ({share:.1%}) "
            f"| {ms(cmr, 'chunk_scores_s')} | {ms(cmr, 'working_copies_s')} "
            f"| {ms(cmr, 'target_forward_s')} / {ms(native, 'target_forward_s')} "
            f"| {ms(cmr, 'propose_s')} / {ms(full, 'propose_s')} "
            f"| {cmr['tokens_per_s']['median']:.2f} / {native['tokens_per_s']['median']:.2f} / "
            f"{full['tokens_per_s']['median']:.2f} |"
        )


if __name__ == "__main__":
    main()
