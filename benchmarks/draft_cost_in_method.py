"""What a drafted token costs inside the method, from step timings, and the acceptance it buys.

    python -m benchmarks.draft_cost_in_method                 # 16K, 8K, 4K, 1K; every draft
    python -m benchmarks.draft_cost_in_method --lengths 4096 --drafts int8 int8_vocab

One engine per draft, one after the other: no speculation first (a plain step's target
forward at each length, the denominator of c), then `specextend` with each draft, drafting
k tokens at every step, on the reduced cache from the activation length on
(`engine.specextend_every_step`). Each engine prefills one text cut to each length (longest
first, so that the shorter prompts' prefill comes from the prefix cache) and decodes it
`--repeats` times, `--max-tokens` greedy tokens each. Per length and draft, medians (min-max)
over the decodes of the step timings' means: the draft's later passes (one token per request
each, what every draft after the first costs), its first pass (the accepted tokens and the
next one), the whole proposal and the target's verifying forward. c is a later pass over the
plain step's target forward at the same length; the proposal's c is the proposal over k,
over the same. With them, the mean acceptance length and decode tokens/s; every output must
equal no speculation's. Drafts: the Qwen 0.5B in fp32; in int8 W8A8 (its LM head in int8
where the CPU has int8 dot products, the default); the same with the 32K draft vocabulary
(`benchmarks.assets.draft_vocab`); SmolLM2 135M (its own tokenizer through
`use_heterogeneous_vocab`, compact positions past its trained 8K). Saved to
benchmarks/results/draft_cost_in_method.json.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from benchmarks import assets, engine  # noqa: E402
from benchmarks.draft_cost import DEFAULT_TEXT, summary  # noqa: E402
from benchmarks.method_cost import PER_STEP_FIELDS, decode_once, ms  # noqa: E402
from benchmarks.prompts import summary_prompt  # noqa: E402

NO_SPECULATION = "no_speculation"


def draft_configs(k: int) -> dict[str, Callable[[], dict[str, Any]]]:
    """Each draft's speculative config (built when its engine starts: the assets are made
    on first use)."""

    def qwen_fp32() -> dict[str, Any]:
        return engine.specextend_every_step(assets.qwen_pair()[0], k)

    def int8() -> dict[str, Any]:
        return engine.specextend_every_step(assets.int8_draft(), k)

    def int8_vocab() -> dict[str, Any]:
        return {**int8(), "draft_vocab": str(assets.draft_vocab())}

    def tiny() -> dict[str, Any]:
        config = engine.specextend_every_step(assets.tiny_draft(), k)
        return {**config, "use_heterogeneous_vocab": True}

    return {"fp32": qwen_fp32, "int8": int8, "int8_vocab": int8_vocab, "tiny": tiny}


def measure_engine(
    target: Path,
    speculative_config: dict[str, Any] | None,
    prompts: dict[int, list[int]],
    max_tokens: int,
    repeats: int,
) -> dict[str, dict[str, Any]]:
    """Per length: each step-timing field's summary over the decodes, tokens/s, mean
    acceptance length, and the decodes' output tokens."""
    llm = engine.make_llm(target, speculative_config, max(prompts) + max_tokens + 64)
    results: dict[str, dict[str, Any]] = {}
    try:
        for length, prompt in prompts.items():
            started = time.perf_counter()
            engine.generate(llm, [prompt], max_tokens)
            seconds = time.perf_counter() - started
            print(f"  {length}: prefill and a first decode {seconds:.0f} s", flush=True)
            runs = [decode_once(llm, prompt, max_tokens) for _ in range(repeats)]
            acceptance = [run["mean_acceptance_length"] for run in runs]
            results[str(length)] = {
                **{
                    field: summary([run[field] for run in runs])
                    for field in (*PER_STEP_FIELDS, "tokens_per_s")
                },
                "mean_acceptance_length": None if None in acceptance else summary(acceptance),
                "outputs": [run["tokens"] for run in runs],
            }
    finally:
        engine.close(llm)
    return results


def with_costs(
    measured: dict[str, dict[str, Any]], plain: dict[str, dict[str, Any]], k: int
) -> None:
    """Adds c (a later pass over the plain target forward at the same length), the
    proposal's c (over k) and whether every output equals no speculation's."""
    for length, figures in measured.items():
        plain_forward = plain[length]["target_forward_s"]["median"]
        figures["c"] = figures["later_draft_pass_s"]["median"] / plain_forward
        figures["proposal_c"] = figures["propose_s"]["median"] / k / plain_forward
        reference = plain[length]["outputs"][0]
        figures["same_output"] = all(output == reference for output in figures["outputs"])


def print_table(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    print(
        "\n| draft | context | later draft pass ms | c | first draft pass ms | proposal ms"
        " | proposal c | target forward ms (plain) | mean acceptance length"
        " | decode tokens/s (no speculation) | same output |"
    )
    print("|---" * 11 + "|")
    plain = results[NO_SPECULATION]
    for name, by_length in results.items():
        if name == NO_SPECULATION:
            continue
        for length, figures in by_length.items():
            acceptance = figures["mean_acceptance_length"]
            tokens_per_s = figures["tokens_per_s"]
            plain_forward = 1000 * plain[length]["target_forward_s"]["median"]
            plain_tokens_per_s = plain[length]["tokens_per_s"]["median"]
            print(
                f"| {name} | {int(length) // 1024}K | {ms(figures, 'later_draft_pass_s')} "
                f"| {figures['c']:.3f} | {ms(figures, 'first_draft_pass_s')} "
                f"| {ms(figures, 'propose_s')} | {figures['proposal_c']:.3f} "
                f"| {ms(figures, 'target_forward_s')} ({plain_forward:.1f}) "
                f"| {acceptance['median']:.2f} ({acceptance['min']:.2f}-{acceptance['max']:.2f}) "
                f"| {tokens_per_s['median']:.2f} ({plain_tokens_per_s:.2f}) "
                f"| {figures['same_output']} |"
            )


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 8192, 4096, 1024])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-k", type=int, default=4)
    drafts = list(draft_configs(4))
    parser.add_argument("--drafts", nargs="+", choices=drafts, default=drafts)
    parser.add_argument(
        "--text", default=DEFAULT_TEXT, help="a name from benchmarks.assets.long_texts()"
    )
    parser.add_argument("--output", default="draft_cost_in_method")
    args = parser.parse_args()
    _, target = assets.qwen_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = assets.long_texts()[args.text]
    lengths = sorted(args.lengths, reverse=True)
    prompts = {length: summary_prompt(tokenizer, text, length) for length in lengths}
    configs = draft_configs(args.k)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in (NO_SPECULATION, *args.drafts):
        print(f"{name}:", flush=True)
        config = None if name == NO_SPECULATION else configs[name]()
        results[name] = measure_engine(target, config, prompts, args.max_tokens, args.repeats)
        if name != NO_SPECULATION:
            with_costs(results[name], results[NO_SPECULATION], args.k)
    print_table(results)
    print(f"saved {engine.save_record(args.output, args, results)}")


if __name__ == "__main__":
    main()
