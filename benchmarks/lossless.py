"""Lossless at scale on the real pair: greedy outputs of the method against plain decoding.

    python -m benchmarks.lossless                      # 40 prompts, 1K-8K, every setting
    python -m benchmarks.lossless --settings chain --lengths 1024 2048

The prompts: one text per genre (fiction, dialogue, essays, code, docs), each cut at every
length, longest first, submitted in groups: the 8 longest one at a time, the next 16 four at
a time, the 16 shortest together. Prompts of one text share their beginning, so after its
longest prompt the prefix cache serves the others' prefill (the draft's KV included): each
engine prefills about 8K tokens per text, and the method is exercised on cached prefixes. Settings, each on its own engine: the Qwen 0.5B draft as a
chain, a static tree and a dynamic tree; the tiny SmolLM2 draft (its own tokenizer) on
compact positions. All draft at every step (`drafting: always`), on the reduced cache from
the activation length on (`retrieval: always`), so no output is decided
without drafts. The result is, per setting and batch size, the number of output tokens that
differ from plain decoding's: it must be 0. Saved to benchmarks/results/lossless.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks import engine
from benchmarks.genres import GENRES, genre_texts
from benchmarks.long_inputs import TREES
from benchmarks.prompts import summary_prompt

SETTINGS = ("chain", "static_tree", "dynamic_tree", "compact_tiny_draft")
DEFAULT_BATCHES = ((1, 8), (4, 16), (16, 16))


def setting_configs(draft: Path, tiny_draft: Path, k: int) -> dict[str, dict[str, Any]]:
    chain = {
        "method": "specextend",
        "model": str(draft),
        "num_speculative_tokens": k,
        "drafting": "always",
        "retrieval": "always",
    }
    return {
        "chain": chain,
        "static_tree": {**chain, "tree": TREES["tree8"], "num_speculative_tokens": len(TREES["tree8"])},
        "dynamic_tree": {**chain, "tree": "dynamic", "num_speculative_tokens": 8, "tree_max_depth": k},
        "compact_tiny_draft": {
            **chain,
            "model": str(tiny_draft),
            "num_speculative_tokens": 3,
            "positions": "compact",
            "use_heterogeneous_vocab": True,
        },
    }


def batches_of(prompts: list[list[int]], schedule: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
    """Consecutive groups of prompt indices per (batch size, prompts in the group).

    >>> batches_of([[1]] * 7, [(1, 2), (4, 5)])
    [(1, [0]), (1, [1]), (4, [2, 3, 4, 5]), (4, [6])]
    """
    groups, start = [], 0
    for batch_size, count in schedule:
        indices = list(range(start, min(start + count, len(prompts))))
        groups += [(batch_size, indices[i : i + batch_size]) for i in range(0, len(indices), batch_size)]
        start += count
    if start < len(prompts):
        raise ValueError(f"the schedule covers {start} of {len(prompts)} prompts")
    return groups


def differing_tokens(outputs: list[int], reference: list[int]) -> int:
    """Positions where two outputs differ, a missing or extra token counting as one.

    >>> differing_tokens([1, 2, 3], [1, 5, 3, 4])
    2
    """
    return sum(a != b for a, b in zip(outputs, reference)) + abs(len(outputs) - len(reference))


def run_setting(
    target: Path, config: dict[str, Any] | None, prompts: list[list[int]], groups: list[tuple[int, list[int]]],
    max_model_len: int, max_tokens: int,
) -> tuple[list[engine.RequestFigures], dict[str, Any] | None, float]:
    llm = engine.make_llm(target, config, max_model_len, max_num_seqs=max(b for b, _ in groups))
    figures: list[engine.RequestFigures | None] = [None] * len(prompts)
    start = time.perf_counter()
    for _, indices in groups:
        requests, _ = engine.generate(llm, [prompts[i] for i in indices], max_tokens)
        for index, request in zip(indices, requests):
            figures[index] = request
    wall_s = time.perf_counter() - start
    counters = engine.retrieval_counters(llm) if config is not None else None
    engine.close(llm)
    return figures, counters, wall_s


def compare(
    figures: list[engine.RequestFigures], reference: list[list[int]], groups: list[tuple[int, list[int]]],
    lengths: list[int],
) -> list[dict[str, Any]]:
    rows = []
    for batch_size in sorted({b for b, _ in groups}):
        indices = [i for b, group in groups if b == batch_size for i in group]
        requests = [figures[i] for i in indices]
        rows.append(
            {
                "batch_size": batch_size,
                "prompts": len(indices),
                "prompt_tokens": [lengths[i] for i in indices],
                "output_tokens": sum(len(r.tokens) for r in requests),
                "differing_tokens": sum(differing_tokens(figures[i].tokens, reference[i]) for i in indices),
                "mean_acceptance_length": engine.mean_acceptance_length(requests),
            }
        )
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--genres", nargs="+", choices=list(GENRES), default=list(GENRES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024 * i for i in range(1, 9)])
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("-k", type=int, default=4, help="chain length and tree depth of the Qwen draft")
    parser.add_argument(
        "--batches",
        nargs="+",
        default=[f"{b}:{n}" for b, n in DEFAULT_BATCHES],
        help="BATCH_SIZE:PROMPTS, in order: the longest PROMPTS prompts go in batches of BATCH_SIZE",
    )
    parser.add_argument("--output", default="lossless", help="results file name without .json")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add these settings to the saved results, reusing their plain-decoding outputs "
        "(the prompts and --max-tokens must be the same)",
    )
    args = parser.parse_args()
    args.batches = [tuple(int(x) for x in item.split(":")) for item in args.batches]
    return args


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import qwen_pair, tiny_draft

    args = parse_args()
    draft, target = qwen_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    texts = {genre: next(iter(by_name.items())) for genre, by_name in genre_texts(args.genres).items()}
    cases = sorted(((length, genre) for genre in args.genres for length in args.lengths), reverse=True)
    prompts = [summary_prompt(tokenizer, texts[genre][1], length) for length, genre in cases]
    lengths = [len(p) for p in prompts]
    groups = batches_of(prompts, args.batches)
    max_model_len = max(lengths) + args.max_tokens + 64
    configs = setting_configs(draft, tiny_draft(), args.k)
    path = engine.RESULTS / f"{args.output}.json"
    prompt_list = [{"genre": genre, "tokens": n} for (_, genre), n in zip(cases, lengths)]
    if args.append:
        record = json.loads(path.read_text())
        if record["prompts"] != prompt_list or record["args"]["max_tokens"] != args.max_tokens:
            raise SystemExit(f"--append: {path} holds other prompts or another --max-tokens")
        record["table"] = [row for row in record["table"] if row["setting"] not in args.settings]
    else:
        record = {
            "args": vars(args),
            "machine": engine.machine(),
            "texts": {genre: name for genre, (name, _) in texts.items()},
            "prompts": prompt_list,
            "table": [],
        }
        figures, _, wall_s = run_setting(target, None, prompts, groups, max_model_len, args.max_tokens)
        record["no_speculation_s"] = wall_s
        record["no_speculation_tokens"] = [r.tokens for r in figures]
        print(f"no speculation: {wall_s:.0f} s", flush=True)
        engine.RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
    reference = record["no_speculation_tokens"]
    for setting in args.settings:
        figures, counters, wall_s = run_setting(
            target, configs[setting], prompts, groups, max_model_len, args.max_tokens
        )
        for row in compare(figures, reference, groups, lengths):
            record["table"].append({"setting": setting, **row, "wall_s": wall_s, "retrieval": counters})
            print(
                f"{setting} batch {row['batch_size']}: {row['differing_tokens']} of "
                f"{row['output_tokens']} tokens differ, acceptance {row['mean_acceptance_length']}",
                flush=True,
            )
        path.write_text(json.dumps(record, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
