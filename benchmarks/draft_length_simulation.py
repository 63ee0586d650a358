"""`drafting: auto` replayed on the acceptance the speed runs measured, against fixed numbers
of drafts, on a simulated machine whose speed drifts.

Engine runs on 2 cores drift by up to 1.4x within a run and from one engine to the next, so
whether a change of the draft-length chooser pays a few percent cannot be read from them.
This replays the package's `DraftLengthChooser` on what the saved speed runs measured: each
`draft_model` decode (4 drafts every step) in `benchmarks/results/long_inputs_speed*.json`
gives, output token by output token, whether the draft proposed it right
(`correct_drafts`), and a workload is the texts one saved run decoded at one length, in
its order, each decoded `--repeats` times in a row (3: as one engine of the speed suite
decodes them; 1: the chooser still learning; 30: a long-running engine).

A step of j drafts takes `1 + verify_base + j * per_draft` plain steps (j > 0), times the
machine's speed then and a 3% noise; the cost profiles are what step timings measured:
`verify_costly` (verifying 5 tokens 1.3x a plain forward and a drafted token 0.12 of one,
the AMD EPYC at 3K-8K), `verify_cheap` (verifying 5 tokens about a plain forward's time,
the AMX Xeon whose 8K steps are memory-bound), `fp32_draft` (a drafted token 0.3 of a
plain step) and `fp32_draft_avx2` (a drafted token 0.5 of one, where drafting about
breaks even: the fp32 draft on a 2-core Zen 3 EPYC without int8 dot products, 1K-4K). The
machine runs `steady`, in `stretches` (10-80 plain steps at 1.0, 1.25 or 1.4x the time),
on a random `walk`, or with `spikes` (2-8 plain steps at 2.0-2.5x the time every 20-150:
the host taking the cores, as a Zen 4 EPYC's first plain steps at 8K read 2.4x the later
ones); the engine's first 15 steps take 1.3x the time. A step that drafts again after plain
steps also runs the draft's catch-up pass over the tokens it missed: `catch_up` plain steps
more, 0.4 with the fp32 draft (at 8K on the Zen 4 EPYC such steps took a median 137 ms more
than a step of the same drafts, 23 of them, plain steps 264-451 ms, about flat in the
number of tokens missed), and 1.3 draft forwards in the other profiles. Each policy (the
chooser, or j drafts every step) decodes the same workload on the same machine (its speed
a function of the time elapsed). Printed and saved
(`benchmarks/results/<output>.json`): the chooser's tokens per second over the best fixed
number of drafts and over 4 every step (`draft_model`'s choice), medians and minima over
workloads and seeds, and how many fall below 0.97x; and over the faster of no drafts and 4
every step, the two alternatives issue 20's aims compare with.

    python -m benchmarks.draft_length_simulation [--seeds 5] [--repeats 1 3 30]
        [--profiles verify_costly ...] [--machines steady ...]
        [--output draft_length_simulation]
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import glob
import json
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import engine
from specextend_vllm.algorithm.draft_length import DraftLengthChooser

NUM_DRAFTS = 4
COLD_STEPS = 15
COLD_SLOWDOWN = 1.3
STEP_NOISE = 0.03
MACHINES = ("steady", "stretches", "walk", "spikes")


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """A drafting step of j drafts takes `1 + verify_base + j * per_draft` plain steps; a
    step that drafts again after plain steps, `catch_up` plain steps more."""

    verify_base: float
    per_draft: float
    catch_up: float

    def seconds(self, num_drafts: int, next_drafts: int) -> float:
        drafting = self.verify_base + num_drafts * self.per_draft if num_drafts else 0.0
        catching_up = self.catch_up if next_drafts and not num_drafts else 0.0
        return 1.0 + drafting + catching_up


COST_PROFILES = {
    "verify_costly": StepCosts(verify_base=0.1, per_draft=0.05 + 0.12, catch_up=0.16),
    "verify_cheap": StepCosts(verify_base=0.03, per_draft=0.01 + 0.10, catch_up=0.13),
    "fp32_draft": StepCosts(verify_base=0.1, per_draft=0.05 + 0.30, catch_up=0.4),
    "fp32_draft_avx2": StepCosts(verify_base=0.1, per_draft=0.5, catch_up=0.6),
}


def correct_drafts(accepted_per_step: Sequence[int], num_drafts: int) -> list[bool | None]:
    """Per output token of a decode that drafted `num_drafts` tokens every step, whether the
    draft proposed it right: a step accepting a < k drafts proposed a tokens right and the
    next wrong; one accepting all k, the k right and not the next (None: never drafted).

    >>> correct_drafts([2, 0, 3], num_drafts=3)
    [True, True, False, False, True, True, True, None]
    """
    stream: list[bool | None] = []
    for accepted in accepted_per_step:
        stream += [True] * accepted + [False if accepted < num_drafts else None]
    return stream


@dataclasses.dataclass
class Machine:
    """The machine's speed (a factor on every step's time) as a function of the time
    elapsed, in plain steps."""

    change_times: list[float]
    factors: list[float]

    @classmethod
    def make(cls, kind: str, rng: random.Random, horizon: float) -> Machine:
        times, factors, now, factor = [0.0], [1.0], 0.0, 1.0
        while kind != "steady" and now < horizon:
            if kind == "stretches":
                now += rng.uniform(10, 80)
                factor = rng.choice([1.0, 1.0, 1.25, 1.4])
            elif kind == "spikes":
                now += rng.uniform(20, 150) if factor == 1.0 else rng.uniform(2, 8)
                factor = rng.uniform(2.0, 2.5) if factor == 1.0 else 1.0
            else:
                now += 1.0
                factor = min(1.6, max(0.8, factor * (1 + rng.gauss(0, 0.03))))
            times.append(now)
            factors.append(factor)
        return cls(times, factors)

    def factor(self, time: float) -> float:
        return self.factors[bisect.bisect_right(self.change_times, time) - 1]


def decode(
    workload: Sequence[list[bool | None]],
    policy: Callable[[], int],
    record: Callable[[int, int, float, list[float]], None],
    costs: StepCosts,
    machine: Machine,
    seed: int,
) -> tuple[float, float]:
    """Tokens and seconds of decoding each stream of `workload` in turn, each step drafting
    `policy()` tokens (as the scheduler reads its table before the step) and telling
    `record(verified drafts, next drafts, seconds, accepted shares)`. A token never drafted
    in the saved run counts as right with the stream's share of right drafts."""
    rng = random.Random(seed)
    tokens = elapsed = 0.0
    steps = 0
    for stream in workload:
        known = [right for right in stream if right is not None]
        right_share = sum(known) / max(len(known), 1)
        position, verified = 0, policy()
        while position < len(stream):
            accepted = 0
            while accepted < verified and position + accepted < len(stream):
                right = stream[position + accepted]
                if not (rng.random() < right_share if right is None else right):
                    break
                accepted += 1
            next_drafts = policy()
            seconds = costs.seconds(verified, next_drafts) * machine.factor(elapsed)
            seconds *= COLD_SLOWDOWN if steps < COLD_STEPS else 1.0
            seconds *= 1 + rng.gauss(0, STEP_NOISE)
            record(verified, next_drafts, seconds, [float(accepted > i) for i in range(verified)])
            tokens += accepted + 1
            elapsed += seconds
            position += accepted + 1
            steps += 1
            verified = next_drafts
    return tokens, elapsed


def rate(
    workload: Sequence[list[bool | None]],
    num_drafts: int | None,
    costs: StepCosts,
    machine: Machine,
    seed: int,
) -> float:
    """Tokens per second with `num_drafts` every step, or with the chooser (None)."""
    if num_drafts is None:
        chooser = DraftLengthChooser(NUM_DRAFTS, max_batch_size=1)

        def record(verified: int, next_drafts: int, seconds: float, shares: list[float]) -> None:
            chooser.record_step(1, verified, next_drafts, seconds, shares if verified else None)

        tokens, seconds = decode(workload, lambda: chooser.lookup[1], record, costs, machine, seed)
    else:
        tokens, seconds = decode(
            workload, lambda: num_drafts, lambda *_: None, costs, machine, seed
        )
    return tokens / seconds


def saved_workloads(repeats: int) -> dict[str, list[list[bool | None]]]:
    """Per saved speed run and length, its `draft_model` decodes of 4 drafts a step in order,
    each repeated `repeats` times in a row."""
    workloads: dict[str, list[list[bool | None]]] = {}
    for path in sorted(glob.glob(str(engine.RESULTS / "long_inputs_speed*.json"))):
        record = json.loads(open(path).read())
        if "runs" not in record or record["args"].get("k", NUM_DRAFTS) != NUM_DRAFTS:
            continue
        for run in record["runs"]:
            if run["method"] != "draft_model" or run.get("repeat", 0):
                continue
            if not run.get("accepted_per_step"):
                continue
            name = f"{path.rsplit('/', 1)[-1].removesuffix('.json')} {run['length'] // 1024}K"
            stream = correct_drafts(run["accepted_per_step"], NUM_DRAFTS)
            workloads.setdefault(name, []).extend([stream] * repeats)
    return workloads


def summary(ratios: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(ratios),
        "min": min(ratios),
        "below_0.97": sum(r < 0.97 for r in ratios) / len(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 3, 30])
    parser.add_argument(
        "--profiles", nargs="+", choices=list(COST_PROFILES), default=list(COST_PROFILES)
    )
    parser.add_argument("--machines", nargs="+", choices=MACHINES, default=list(MACHINES))
    parser.add_argument("--output", default="draft_length_simulation")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    print(
        "| decodes of each text | costs | machine | auto vs best fixed: median (min) "
        "| share below 0.97x | auto vs 4 every step: median (min) | share below 0.97x "
        "| auto vs the faster of none and 4: median (min) | share below 0.97x |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for repeats in args.repeats:
        workloads = saved_workloads(repeats)
        for profile in args.profiles:
            costs = COST_PROFILES[profile]
            for kind in args.machines:
                against_best, against_four, against_alternatives = [], [], []
                for workload in workloads.values():
                    horizon = 4.0 * sum(map(len, workload))
                    for seed in range(args.seeds):
                        machine = Machine.make(kind, random.Random(seed), horizon)
                        fixed = [
                            rate(workload, j, costs, machine, seed) for j in range(NUM_DRAFTS + 1)
                        ]
                        auto = rate(workload, None, costs, machine, seed)
                        against_best.append(auto / max(fixed))
                        against_four.append(auto / fixed[NUM_DRAFTS])
                        against_alternatives.append(auto / max(fixed[0], fixed[NUM_DRAFTS]))
                best, four = summary(against_best), summary(against_four)
                alternatives = summary(against_alternatives)
                results[f"{repeats} {profile} {kind}"] = {
                    "against_best_fixed": best,
                    "against_four": four,
                    "against_faster_of_none_and_four": alternatives,
                }
                print(
                    f"| {repeats} | {profile} | {kind} | {best['median']:.3f} ({best['min']:.3f}) "
                    f"| {best['below_0.97']:.2f} | {four['median']:.3f} ({four['min']:.3f}) "
                    f"| {four['below_0.97']:.2f} | {alternatives['median']:.3f} "
                    f"({alternatives['min']:.3f}) | {alternatives['below_0.97']:.2f} |",
                    flush=True,
                )
    results["workloads"] = {name: len(streams) for name, streams in saved_workloads(1).items()}
    print(f"saved {engine.save_record(args.output, args, results)}")


if __name__ == "__main__":
    main()
