"""What the draft's prefill adds to the time to first token, by prompt length.

    python -m benchmarks.prefill_cost                       # 2K and 4K, three texts each
    LD_PRELOAD= python -m benchmarks.prefill_cost --output prefill_cost_system_malloc
    python -m benchmarks.prefill_cost --lengths 8192 --windows whole 2048 1024 \
        --max-tokens 64 --every-step --output prefill_window

One `specextend` engine (the real pair, the int8 draft, default keys, prefix caching off)
prefills one prompt per text and length (a second text of fiction, essays and code: Botchan,
essay set 2, tarfile.py, cut to each length; `--text-index 2`: the third texts) and
emits one token. The step timings split each prefill into the target's forward and the
draft's passes over the same tokens (with its first drafts); their ratio is what the draft
adds to the target's prefill in the same steps, so machine drift moves both alike. Median
over the texts (min-max). The allocator (`machine.allocator`) is the point of the second
command: `scripts/bench.sh` preloads TCMalloc, as vLLM's CPU guide asks, and the prefill's
large buffers are where glibc's malloc differs. Saved to benchmarks/results/prefill_cost.json.

`--windows` runs one engine per `draft_prefill_window` (`default`: the method's default;
`whole`: none); with `--max-tokens` above 1 each request then decodes that many greedy
tokens, giving the decode speed and the acceptance the window leaves, and the outputs of
every window are compared (the target verifies, so they must be equal). `--every-step`
drafts at every step on the reduced cache (`drafting` and `retrieval: always`), so
acceptance is not mixed with the choosers' choices. `--cached` turns prefix caching on and
measures each prompt's second prefill, from the cache: vLLM computes its last block again
(the prompts are whole blocks), and so does the draft unless it copies its KV from the
cached block.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from benchmarks import assets, engine  # noqa: E402
from benchmarks.draft_cost import summary  # noqa: E402
from benchmarks.genres import genre_texts  # noqa: E402
from benchmarks.prompts import summary_prompt  # noqa: E402

GENRES = ("fiction", "essays", "code")


def prefill_once(llm: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """One prefill of `prompt` (from the prefix cache where it holds it) and `max_tokens`
    tokens: wall seconds of the prefill (the first token), the target's forward and the draft's passes summed over the
    prefill steps; with more than one token, the decode speed, the mean acceptance length
    and the tokens."""
    from specextend_vllm import step_timings

    step_timings(llm)
    start = time.perf_counter()
    [figures], _ = engine.generate(llm, [prompt], max_tokens)
    steps = [r for r in step_timings(llm)[0] if r["num_target_tokens"] > engine.MAX_DECODE_STEP_TOKENS]
    target_s = sum(r["target_forward_s"] for r in steps)
    draft_s = sum(sum(r["draft_passes_s"]) for r in steps)
    run = {
        "wall_s": figures.ttft_s if max_tokens > 1 else time.perf_counter() - start,
        "target_forward_s": target_s,
        "draft_passes_s": draft_s,
        "draft_over_target": draft_s / target_s,
    }
    if max_tokens > 1:
        run["decode_tokens_per_s"] = (max_tokens - 1) / figures.decode_s
        run["mean_acceptance_length"] = figures.mean_acceptance_length
        run["tokens"] = figures.tokens
    return run


def window_keys(window: str) -> dict[str, Any]:
    """`default` -> the method's default; `whole` -> no window; a number -> that
    `draft_prefill_window`."""
    if window == "default":
        return {}
    return {"draft_prefill_window": None if window == "whole" else int(window)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument(
        "--windows", nargs="+", default=["default"], help="draft_prefill_window values, whole or default"
    )
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--every-step", action="store_true", help="drafting and retrieval: always")
    parser.add_argument(
        "--cached",
        action="store_true",
        help="prefix caching on; each prompt prefilled once, then measured from the cache, "
        "which holds it whole (vLLM computes its last block again)",
    )
    parser.add_argument(
        "--text-index", type=int, default=1, help="which text of each genre (0: the first)"
    )
    parser.add_argument("--output", default="prefill_cost")
    args = parser.parse_args()
    _, target = assets.qwen_pair()
    draft = assets.int8_draft()
    base = (
        engine.specextend_every_step(draft, 4)
        if args.every_step
        else {"method": "specextend", "model": str(draft), "num_speculative_tokens": 4}
    )
    texts = {
        genre: list(by_name.items())[args.text_index]
        for genre, by_name in genre_texts(list(GENRES)).items()
    }
    results: dict[str, Any] = {}
    for window in args.windows:
        llm = engine.make_llm(
            target, {**base, **window_keys(window)}, max(args.lengths) + args.max_tokens + 64,
            enable_prefix_caching=args.cached,
        )
        results[window] = {}
        try:
            tokenizer = llm.get_tokenizer()
            engine.generate(llm, [summary_prompt(tokenizer, texts["fiction"][1], 256)], 1)
            for length in args.lengths:
                runs = {}
                for genre, (name, text) in texts.items():
                    prompt = summary_prompt(tokenizer, text, length)
                    if args.cached:
                        engine.generate(llm, [prompt], 1)
                    run = prefill_once(llm, prompt, args.max_tokens)
                    runs[f"{genre}: {name}"] = run
                    print(f"{window} {length} {genre}: { {k: v for k, v in run.items() if k != 'tokens'} }", flush=True)
                fields = [field for field in next(iter(runs.values())) if field != "tokens"]
                results[window][str(length)] = {
                    "runs": runs,
                    **{field: summary([run[field] for run in runs.values()]) for field in fields},
                }
        finally:
            engine.close(llm)
    if args.max_tokens > 1:
        results["same_output_in_every_window"] = all(
            results[window][length]["runs"][text]["tokens"]
            == results[args.windows[0]][length]["runs"][text]["tokens"]
            for window in args.windows
            for length in results[window]
            for text in results[window][length]["runs"]
        )
    path = engine.save_record(args.output, args, results)
    print_table(results, args.windows)
    print(f"saved {path}")


def print_table(results: dict[str, Any], windows: list[str]) -> None:
    decodes = "decode_tokens_per_s" in next(iter(results[windows[0]].values()))
    print(
        "\n| window | prompt | prefill wall s | target forward s | draft passes s | draft / target |"
        + (" mean acceptance length | decode tokens/s |" if decodes else "")
    )
    print("|---" * (8 if decodes else 6) + "|")
    fields = ["wall_s", "target_forward_s", "draft_passes_s", "draft_over_target"]
    if decodes:
        fields += ["mean_acceptance_length", "decode_tokens_per_s"]
    for window in windows:
        for length, cell in results[window].items():
            print(
                f"| {window} | {int(length) // 1024}K | "
                + " | ".join(
                    f"{cell[f]['median']:.3f} ({cell[f]['min']:.3f}-{cell[f]['max']:.3f})" for f in fields
                )
                + " |"
            )
    if "same_output_in_every_window" in results:
        print(f"same output in every window: {results['same_output_in_every_window']}")


if __name__ == "__main__":
    main()
