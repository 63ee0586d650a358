"""`retrieval: auto` replayed on simulated texts whose drafts the reduced cache serves
better or worse, one text after another, as one engine of the speed suite meets them.

Engine runs on 2 cores move by more than the few percent a change of the chooser makes,
so this replays the package's `RetrievalChooser` on a simulated machine instead. A
workload is a sequence of texts in one bucket of context lengths; each text is decoded
`--decodes` times in a row, `--steps` steps each, one request at a time (each decode a new
batch to the chooser). Each draft is accepted with the text's
probability on the full cache and on the reduced one once those before it were; a step of
j drafts takes `1 + 0.2 j` plain steps on the full cache and `time_ratio` times that on
the reduced one, with a 5% noise, and each decode's steps take a factor from
`1 - drift` to `1 + drift` of that (texts of different lengths in one bucket, the machine
busier or not). The number of drafts changes as `drafting: auto` changes it: 1 to 4,
each held for 4 to 10 steps, then one more or one fewer.

Printed and saved (`benchmarks/results/<output>.json`): per workload and text, the
chooser's expected tokens per second over always drafting on the better cache for each
step's number of drafts (1.0: never a step on the worse one), median and 10th percentile
over seeds, and the share of steps on the reduced cache.

    python -m benchmarks.retrieval_choice_simulation [--seeds 40] [--decodes 3]
        [--steps 33] [--drift 0.1] [--without-new-batches] [--workloads NAME ...]
        [--output retrieval_choice_simulation]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
from typing import Any

from benchmarks import engine
from specextend_vllm.algorithm.draft_acceptance import chain_tokens
from specextend_vllm.algorithm.retrieval_choice import RetrievalChooser

ACTIVATION_LENGTH = 2048
BUCKET = 1
MAX_DRAFTS = 4
PER_DRAFT = 0.2
STEP_NOISE = 0.05


@dataclasses.dataclass(frozen=True)
class Text:
    """Each draft's acceptance on the full cache and on the reduced one, and a reduced
    step's time over a full one's."""

    name: str
    full_acceptance: float
    reduced_acceptance: float
    time_ratio: float


# 4K as measured: the reduced cache hardly cheaper; essays accepted alike on both,
# fiction less on the reduced one. 8K: the reduced cache 1.25x faster.
ESSAYS_4K = Text("essays 4K", 0.6, 0.6, 0.97)
FICTION_4K = Text("fiction 4K", 0.72, 0.55, 0.97)
ESSAYS_8K = Text("essays 8K", 0.6, 0.58, 0.8)
FICTION_8K = Text("fiction 8K", 0.72, 0.62, 0.8)
# One text accepted alike on both caches, the reduced one twice or 1.25x as fast.
TWICE_AS_FAST = Text("reduced 2x as fast", 0.7, 0.7, 0.5)
QUARTER_FASTER = Text("reduced 1.25x as fast", 0.7, 0.7, 0.8)
# 4K `dataclasses` on a Zen 4 EPYC with the int8 draft: the reduced cache's steps 0.905x
# the full one's, accepting less; and a text both caches serve alike at that time ratio.
DATACLASSES_4K = Text("dataclasses 4K", 0.74, 0.64, 0.905)
ALIKE_4K = Text("alike 4K", 0.7, 0.7, 0.905)
WORKLOADS = {
    "essays then fiction, 4K": (ESSAYS_4K, FICTION_4K),
    "fiction then essays, 4K": (FICTION_4K, ESSAYS_4K),
    "essays then fiction, 8K": (ESSAYS_8K, FICTION_8K),
    "essays and fiction by turns, 4K": (ESSAYS_4K, FICTION_4K) * 3,
    "one text, 2x": (TWICE_AS_FAST,),
    "one text, 1.25x": (QUARTER_FASTER,),
    "dataclasses 4K alone": (DATACLASSES_4K,),
    "alike then dataclasses, 4K": (ALIKE_4K, DATACLASSES_4K),
}


def drafting_lengths(rng: random.Random, steps: int) -> list[int]:
    """Numbers of drafts per step: each held 4 to 10 steps, then one more or one fewer."""
    lengths: list[int] = []
    num_drafts = rng.randint(2, MAX_DRAFTS)
    while len(lengths) < steps:
        lengths += [num_drafts] * rng.randint(4, 10)
        num_drafts = min(max(num_drafts + rng.choice((-1, 1)), 1), MAX_DRAFTS)
    return lengths[:steps]


def step_seconds(text: Text, reduced: bool, num_drafts: int) -> float:
    return (text.time_ratio if reduced else 1.0) * (1.0 + PER_DRAFT * num_drafts)


def expected_rate(text: Text, reduced: bool, num_drafts: int) -> float:
    acceptance = text.reduced_acceptance if reduced else text.full_acceptance
    tokens = chain_tokens([acceptance] * num_drafts)
    return tokens / step_seconds(text, reduced, num_drafts)


def replay(
    chooser: RetrievalChooser,
    texts: tuple[Text, ...],
    seed: int,
    decodes: int,
    steps: int,
    drift: float = 0.0,
    new_batches: bool = True,
) -> list[dict[str, float]]:
    """Per text: the chooser's expected tokens per second over the better cache's, and its
    share of steps on the reduced cache."""
    rng = random.Random(seed)
    per_text = []
    for text in texts:
        tokens = seconds = best_tokens = best_seconds = 0.0
        reduced_steps = 0
        speeds = [1.0 + drift * rng.uniform(-1.0, 1.0) for _ in range(decodes)]
        for index, num_drafts in enumerate(drafting_lengths(rng, decodes * steps)):
            if new_batches and index % steps == 0:
                chooser.new_batch(BUCKET)
            reduced = chooser.reduces(BUCKET, num_drafts)
            acceptance = text.reduced_acceptance if reduced else text.full_acceptance
            accepted = 0
            while accepted < num_drafts and rng.random() < acceptance:
                accepted += 1
            shares = [1.0 if accepted > depth else 0.0 for depth in range(num_drafts)]
            noise = speeds[index // steps] * (1.0 + STEP_NOISE * rng.random())
            chooser.record_step(
                BUCKET, num_drafts, reduced, noise * step_seconds(text, reduced, num_drafts), shares
            )
            tokens += chain_tokens([acceptance] * num_drafts)
            seconds += step_seconds(text, reduced, num_drafts)
            better = expected_rate(text, True, num_drafts) > expected_rate(text, False, num_drafts)
            best_tokens += expected_rate(text, better, num_drafts) * step_seconds(
                text, better, num_drafts
            )
            best_seconds += step_seconds(text, better, num_drafts)
            reduced_steps += reduced
        per_text.append(
            {
                "of_better_cache": (tokens / seconds) / (best_tokens / best_seconds),
                "reduced_share": reduced_steps / (decodes * steps),
            }
        )
    return per_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--decodes", type=int, default=3, help="decodes of each text in a row")
    parser.add_argument("--steps", type=int, default=33, help="decoding steps per decode")
    parser.add_argument(
        "--drift", type=float, default=0.1, help="each decode's steps take 1 +- this at most"
    )
    parser.add_argument(
        "--without-new-batches",
        action="store_true",
        help="the chooser is not told of new batches (as before it explored at them)",
    )
    parser.add_argument(
        "--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS),
        help="the workloads to replay (default: all)",
    )
    parser.add_argument("--output", default="retrieval_choice_simulation")
    args = parser.parse_args()
    lengths = {
        "decodes": args.decodes,
        "steps": args.steps,
        "drift": args.drift,
        "new_batches": not args.without_new_batches,
    }
    results: dict[str, Any] = {}
    print("| workload | text | of the better cache (10th percentile) | reduced share |")
    print("|---|---|---|---|")
    for workload in args.workloads:
        texts = WORKLOADS[workload]
        results[workload] = {}
        runs = [
            replay(RetrievalChooser(ACTIVATION_LENGTH, MAX_DRAFTS), texts, seed, **lengths)
            for seed in range(args.seeds)
        ]
        for index, text in enumerate(texts):
            ratios = sorted(run[index]["of_better_cache"] for run in runs)
            summary = {
                "text": dataclasses.asdict(text),
                "median": statistics.median(ratios),
                "p10": ratios[len(ratios) // 10],
                "reduced_share": statistics.median(run[index]["reduced_share"] for run in runs),
            }
            results[workload][text.name] = summary
            print(
                f"| {workload} | {text.name} | {summary['median']:.3f} "
                f"({summary['p10']:.3f}) | {summary['reduced_share']:.2f} |"
            )
    print(f"saved {engine.save_record(args.output, args, results)}")


if __name__ == "__main__":
    main()
