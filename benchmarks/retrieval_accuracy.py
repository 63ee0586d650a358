"""Retrieval accuracy across genres: the draft's mean acceptance length with each
retrieval setting against the full cache, on texts the method was never tuned on.

    python -m benchmarks.retrieval_accuracy                      # 4K and 8K, every genre
    python -m benchmarks.retrieval_accuracy --lengths 4096 --texts-per-genre 1

Acceptance does not depend on the hardware, so this is the method's main yardstick.
One specextend engine (the real pair, default keys) runs every setting on one prefill
per prompt (`specextend_vllm.reconfigure` switches them); the lengths of one text share
their prefix in the prefix cache. Greedy outputs are checked equal across settings.
Saves benchmarks/results/retrieval_accuracy.json and a plot of the acceptance ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import engine
from benchmarks.genres import GENRES, genre_texts
from benchmarks.prompts import summary_prompt

# Settings compared on each prompt, each on the default keys; `full` first, as the
# reference of the others.
SETTINGS: dict[str, dict[str, Any]] = {
    "full": {"policy": "full"},
    "streaming": {"policy": "streaming", "chunk_size": 32, "token_budget": 1024},
    "cmr_chunk16": {"policy": "cmr", "chunk_size": 16, "token_budget": 1024},
    "cmr_chunk32": {"policy": "cmr", "chunk_size": 32, "token_budget": 1024},
    "cmr_chunk64": {"policy": "cmr", "chunk_size": 64, "token_budget": 1024},
    "cmr_chunk128": {"policy": "cmr", "chunk_size": 128, "token_budget": 1024},
    "cmr_chunk32_budget512": {"policy": "cmr", "chunk_size": 32, "token_budget": 512},
    "cmr_chunk32_budget2048": {"policy": "cmr", "chunk_size": 32, "token_budget": 2048},
    "cmr_chunk32_interval1": {"policy": "cmr", "chunk_size": 32, "retrieval_interval": 1},
    "cmr_chunk32_continuation": {
        "policy": "cmr",
        "chunk_size": 32,
        "token_budget": 1024,
        "chunk_ranking": "continuation",
    },
}


def setting_defaults() -> dict[str, Any]:
    """The keys every setting starts from: the defaults a running engine can take, drafting
    on the reduced cache at every step (this measures the policies)."""
    from specextend_vllm.config import KEYS_FIXED_AT_LOAD, SpecExtendConfig

    defaults = SpecExtendConfig().to_dict()
    return {
        **{key: value for key, value in defaults.items() if key not in KEYS_FIXED_AT_LOAD},
        "retrieval": "always",
    }


def run(
    args: argparse.Namespace,
    draft: Path,
    target: Path,
    tokenizer: Any,
    save: Callable[[list[dict[str, Any]]], None],
    done: set[tuple[str, int]],
) -> None:
    """Runs every setting on every prompt but those `done` (text, length), saving the runs
    after each text."""
    from tqdm import tqdm

    from specextend_vllm import reconfigure

    defaults = setting_defaults()
    texts = {
        genre: {
            name: text
            for name, text in list(by_name.items())[
                args.skip_texts : args.skip_texts + args.texts_per_genre
            ]
            if any((name, length) not in done for length in args.lengths)
        }
        for genre, by_name in genre_texts(args.genres).items()
    }
    settings = {name: SETTINGS[name] for name in args.settings}
    config = engine.specextend_every_step(draft, args.k)
    llm = engine.make_llm(target, config, max(args.lengths) + args.max_tokens + 64)
    runs = []
    total = sum(len(by_name) for by_name in texts.values()) * len(args.lengths) * len(settings)
    with tqdm(total=total, desc="retrieval accuracy") as progress:
        for genre, by_name in texts.items():
            for text_name, text in by_name.items():
                llm.reset_prefix_cache()
                for length in sorted(length for length in args.lengths if (text_name, length) not in done):
                    prompt = summary_prompt(tokenizer, text, length)
                    for setting, keys in settings.items():
                        progress.set_postfix_str(f"{text_name} {length} {setting}")
                        reconfigure(llm, **{**defaults, **args.base_keys, **keys})
                        before = engine.retrieval_counters(llm)
                        [request], _ = engine.generate(llm, [prompt], args.max_tokens)
                        after = engine.retrieval_counters(llm)
                        runs.append(
                            {
                                "genre": genre,
                                "text": text_name,
                                "length": length,
                                "setting": setting,
                                "mean_acceptance_length": request.mean_acceptance_length,
                                "accepted_per_step": request.accepted_per_step,
                                "tokens": request.tokens,
                                **dict(
                                    zip(
                                        ("reduced_draft_steps", "mean_kept_tokens"),
                                        engine.reduced_steps_between(before, after),
                                    )
                                ),
                            }
                        )
                        progress.update()
                save(runs)
    engine.close(llm)


def accuracy_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per genre, length and setting: the median over texts of the mean acceptance length
    and of its ratio to the full cache's on the same prompt, with their spread."""
    full = {
        (r["text"], r["length"]): r for r in runs if r["setting"] == "full"
    }
    rows = []
    keys = dict.fromkeys((r["genre"], r["length"], r["setting"]) for r in runs)
    for genre, length, setting in keys:
        group = [
            r for r in runs if (r["genre"], r["length"], r["setting"]) == (genre, length, setting)
        ]
        lengths = [r["mean_acceptance_length"] for r in group]
        ratios = [
            r["mean_acceptance_length"] / full[(r["text"], length)]["mean_acceptance_length"]
            for r in group
            if (r["text"], length) in full
        ]
        rows.append(
            {
                "genre": genre,
                "length": length,
                "setting": setting,
                "texts": len(group),
                "acceptance_median": statistics.median(lengths),
                "acceptance_min": min(lengths),
                "acceptance_max": max(lengths),
                "vs_full_median": statistics.median(ratios) if ratios else None,
                "vs_full_min": min(ratios) if ratios else None,
                "vs_full_max": max(ratios) if ratios else None,
                "same_output_as_full": all(
                    r["tokens"] == full[(r["text"], length)]["tokens"]
                    for r in group
                    if (r["text"], length) in full
                ),
            }
        )
    return rows


def markdown_tables(rows: list[dict[str, Any]]) -> str:
    """One table per prompt length: genres as rows, settings as columns; each cell the
    median over texts of the acceptance length relative to the full cache's, with the
    full cache's own median acceptance length in the first column."""
    tables = []
    for length in sorted({row["length"] for row in rows}):
        cells = {(r["genre"], r["setting"]): r for r in rows if r["length"] == length}
        genres = list(dict.fromkeys(genre for genre, _ in cells))
        settings = [s for s in dict.fromkeys(setting for _, setting in cells) if s != "full"]
        lines = [
            f"| {length} tokens | texts | full cache | " + " | ".join(settings) + " |",
            "|---" * (len(settings) + 3) + "|",
        ]
        for genre in genres:
            full = cells.get((genre, "full"))
            values = []
            for setting in settings:
                row = cells.get((genre, setting))
                values.append(
                    "-"
                    if row is None or row["vs_full_median"] is None
                    else f"{row['vs_full_median']:.2f} ({row['vs_full_min']:.2f}-{row['vs_full_max']:.2f})"
                )
            full_cell = "-" if full is None else f"{full['acceptance_median']:.2f}"
            texts = full["texts"] if full else "-"
            lines.append(f"| {genre} | {texts} | {full_cell} | " + " | ".join(values) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def plot(results_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(results_path.read_text())["table"]
    lengths = sorted({row["length"] for row in rows})
    genres = list(dict.fromkeys(row["genre"] for row in rows))
    settings = [s for s in dict.fromkeys(row["setting"] for row in rows) if s != "full"]
    figure, panels = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4), squeeze=False)
    for axes, length in zip(panels[0], lengths):
        width = 0.8 / len(settings)
        for index, setting in enumerate(settings):
            values = [
                next(
                    (r["vs_full_median"] for r in rows if (r["genre"], r["length"], r["setting"]) == (g, length, setting)),
                    float("nan"),
                )
                for g in genres
            ]
            axes.bar([g + index * width for g in range(len(genres))], values, width, label=setting)
        axes.axhline(1.0, color="black", linewidth=0.8)
        axes.axhline(0.95, color="grey", linewidth=0.8, linestyle="--")
        axes.set_xticks([g + 0.4 - width / 2 for g in range(len(genres))], genres)
        axes.set_ylim(0.5, 1.35)
        axes.set_ylabel("acceptance length / full cache's (median over texts)")
        axes.set_title(f"{length}-token prompts", fontsize=9)
    panels[0][0].legend(fontsize=6, ncol=3, loc="upper center")
    path = results_path.with_suffix(".png")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192], help="prompt lengths in tokens")
    parser.add_argument("--genres", nargs="+", choices=list(GENRES), default=list(GENRES))
    parser.add_argument("--texts-per-genre", type=int, default=3)
    parser.add_argument(
        "--skip-texts", type=int, default=0, help="leave out each genre's first N texts (those tuned on)"
    )
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument(
        "--base-keys", type=json.loads, default={}, help="specextend keys common to every setting, as JSON"
    )
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--output", default="retrieval_accuracy", help="results file name without .json")
    parser.add_argument(
        "--append", action="store_true", help="add these runs to the saved ones, skipping prompts done"
    )
    parser.add_argument(
        "--plot-only", action="store_true", help="plot the saved results and print their tables"
    )
    return parser.parse_args()


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import qwen_pair

    args = parse_args()
    path = engine.RESULTS / f"{args.output}.json"
    if not args.plot_only:
        draft, target = qwen_pair()
        tokenizer = AutoTokenizer.from_pretrained(target)
        earlier = json.loads(path.read_text()) if args.append else {"args": [], "runs": []}
        record = {
            "args": earlier["args"] + [vars(args) | {"target": str(target), "draft": str(draft)}],
            "machine": engine.machine(),
        }

        def save(runs: list[dict[str, Any]]) -> None:
            all_runs = earlier["runs"] + runs
            engine.RESULTS.mkdir(exist_ok=True)
            path.write_text(json.dumps(record | {"runs": all_runs, "table": accuracy_table(all_runs)}, indent=1))

        done = {(r["text"], r["length"]) for r in earlier["runs"]}
        run(args, draft, target, tokenizer, save, done)
        for row in json.loads(path.read_text())["table"]:
            print(
                f"{row['genre']:9} {row['length']:6} {row['setting']:24} "
                f"{row['acceptance_median']:.2f} [{row['acceptance_min']:.2f}, {row['acceptance_max']:.2f}]  "
                f"vs full {row['vs_full_median']:.3f} [{row['vs_full_min']:.3f}, {row['vs_full_max']:.3f}]"
            )
        print(f"saved {path}")
    print(markdown_tables(json.loads(path.read_text())["table"]))
    print(f"saved {plot(path)}")


if __name__ == "__main__":
    main()
