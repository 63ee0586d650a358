"""What a draft token costs next to a target step: c = draft ms per token / target ms per token.

    python -m benchmarks.draft_cost                         # 1K, 4K, 8K; every model
    python -m benchmarks.draft_cost --lengths 2048 --repeats 5

Each model decodes alone (plain decoding, no speculation) on the same text cut to each
length with its own tokenizer ("Summarize the following text." around it): once to fill
the prefix cache, then `--repeats` times more, timed from the first output token to the
last. A draft's forward over one new token at a given context is what one position of a
chain costs it, so c is the share of a target step that each drafted token adds. Models:
the fp32 target (Qwen2.5-Coder 1.5B), the Qwen 0.5B draft in fp32 and in int8 W8A8
(`benchmarks.assets.int8_draft`), and the SmolLM2 135M draft. Saved to
benchmarks/results/draft_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import assets, engine
from benchmarks.prompts import summary_prompt

DEFAULT_TEXT = "novels/botchan"


def models() -> dict[str, Path]:
    draft, target = assets.qwen_pair()
    return {
        "target fp32 (1.5B)": target,
        "draft fp32 (0.5B)": draft,
        "draft int8 (0.5B)": assets.int8_draft(),
        "tiny draft fp32 (SmolLM2 135M)": assets.tiny_draft(),
    }


def ms_per_token(model: Path, text: str, lengths: list[int], max_tokens: int, repeats: int) -> dict[int, list[float]]:
    """Per length, milliseconds per decoded token in each timed repeat."""
    from transformers import AutoTokenizer

    from transformers import AutoConfig

    tokenizer = AutoTokenizer.from_pretrained(model)
    trained_length = AutoConfig.from_pretrained(model).max_position_embeddings
    max_model_len = min(max(lengths) + max_tokens + 16, trained_length)
    llm = engine.make_llm(model, None, max_model_len=max_model_len)
    try:
        timings: dict[int, list[float]] = {}
        for length in lengths:
            # A model trained on fewer positions decodes at the longest prompt it can take.
            prompt = summary_prompt(tokenizer, text, min(length, max_model_len - max_tokens - 16))
            engine.generate(llm, [prompt], max_tokens)
            timings[length] = []
            for _ in range(repeats):
                [figures], _ = engine.generate(llm, [prompt], max_tokens)
                timings[length].append(1000 * figures.decode_s / (max_tokens - 1))
            print(f"  {length}: {statistics.median(timings[length]):.1f} ms per token", flush=True)
        return timings
    finally:
        engine.close(llm)


def summary(values: list[float]) -> dict[str, float]:
    """Median and spread (min, max) of repeats.

    >>> summary([3.0, 1.0, 2.0])
    {'median': 2.0, 'min': 1.0, 'max': 3.0}
    """
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--text", default=DEFAULT_TEXT, help="a name from benchmarks.assets.long_texts()")
    parser.add_argument("--output", default="draft_cost")
    parser.add_argument("--models", nargs="+", help="only these (names as printed); others kept from the saved JSON")
    args = parser.parse_args()
    text = assets.long_texts()[args.text]
    path = engine.RESULTS / f"{args.output}.json"
    record: dict[str, Any] = {"args": vars(args), "machine": engine.machine(), "models": {}}
    if args.models and path.exists():
        record["models"] = json.loads(path.read_text())["models"]
    for name, folder in models().items():
        if args.models and name not in args.models:
            continue
        print(f"{name}: {folder}", flush=True)
        timings = ms_per_token(folder, text, args.lengths, args.max_tokens, args.repeats)
        record["models"][name] = {"folder": str(folder), "ms_per_token": {str(n): summary(t) for n, t in timings.items()}}
    target = record["models"]["target fp32 (1.5B)"]["ms_per_token"]
    print("\n| model | " + " | ".join(f"{n // 1024}K: ms per token (min-max), c" for n in args.lengths) + " |")
    print("|---" * (len(args.lengths) + 1) + "|")
    for name, figures in record["models"].items():
        cells = []
        for length in args.lengths:
            cell = figures["ms_per_token"][str(length)]
            cost = cell["median"] / target[str(length)]["median"]
            figures.setdefault("c", {})[str(length)] = cost
            cells.append(f"{cell['median']:.0f} ({cell['min']:.0f}-{cell['max']:.0f}), {cost:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
