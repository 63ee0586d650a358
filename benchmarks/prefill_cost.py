"""What the draft's prefill adds to the time to first token, by prompt length.

    python -m benchmarks.prefill_cost                       # 2K and 4K, three texts each
    LD_PRELOAD= python -m benchmarks.prefill_cost --output prefill_cost_system_malloc

One `specextend` engine (the real pair, the int8 draft, default keys, prefix caching off)
prefills one prompt per text and length (a second text of fiction, essays and code: Botchan,
essay set 2, tarfile.py; cut to each length) and
emits one token. The step timings split each prefill into the target's forward and the
draft's passes over the same tokens (with its first drafts); their ratio is what the draft
adds to the target's prefill in the same steps, so machine drift moves both alike. Median
over the texts (min-max). The allocator (`machine.allocator`) is the point of the second
command: `scripts/bench.sh` preloads TCMalloc, as vLLM's CPU guide asks, and the prefill's
large buffers are where glibc's malloc differs. Saved to benchmarks/results/prefill_cost.json.
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


def prefill_once(llm: Any, prompt: list[int]) -> dict[str, float]:
    """One uncached prefill of `prompt` and its first token: wall seconds, the target's
    forward and the draft's passes summed over the prefill steps."""
    from specextend_vllm import step_timings

    step_timings(llm)
    start = time.perf_counter()
    engine.generate(llm, [prompt], 1)
    wall_s = time.perf_counter() - start
    steps = [r for r in step_timings(llm)[0] if r["num_target_tokens"] > engine.MAX_DECODE_STEP_TOKENS]
    target_s = sum(r["target_forward_s"] for r in steps)
    draft_s = sum(sum(r["draft_passes_s"]) for r in steps)
    return {"wall_s": wall_s, "target_forward_s": target_s, "draft_passes_s": draft_s, "draft_over_target": draft_s / target_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--output", default="prefill_cost")
    args = parser.parse_args()
    _, target = assets.qwen_pair()
    speculative_config = {"method": "specextend", "model": str(assets.int8_draft()), "num_speculative_tokens": 4}
    llm = engine.make_llm(target, speculative_config, max(args.lengths) + 64, enable_prefix_caching=False)
    texts = {genre: list(by_name.items())[1] for genre, by_name in genre_texts(list(GENRES)).items()}
    results: dict[str, Any] = {}
    try:
        tokenizer = llm.get_tokenizer()
        engine.generate(llm, [summary_prompt(tokenizer, texts["fiction"][1], 256)], 1)
        for length in args.lengths:
            runs = {}
            for genre, (name, text) in texts.items():
                runs[f"{genre}: {name}"] = prefill_once(llm, summary_prompt(tokenizer, text, length))
                print(f"{length} {genre}: {runs[f'{genre}: {name}']}", flush=True)
            results[str(length)] = {
                "runs": runs,
                **{field: summary([run[field] for run in runs.values()]) for field in next(iter(runs.values()))},
            }
    finally:
        engine.close(llm)
    path = engine.save_record(args.output, args, results)
    print("\n| prompt | prefill wall s | target forward s | draft passes s | draft / target |")
    print("|---|---|---|---|---|")
    for length, cell in results.items():
        figures = [cell[field] for field in ("wall_s", "target_forward_s", "draft_passes_s")]
        ratio = cell["draft_over_target"]
        print(
            f"| {int(length) // 1024}K | "
            + " | ".join(f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})" for f in figures)
            + f" | {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}) |"
        )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
