"""Every saved speed cell of `specextend` at its defaults, summed up per prompt length and
machine; and every cell measured within one engine, taking turns with its alternatives.

    python -m benchmarks.speed_summary [--draft-precision int8] [--results DIR]

Reads each `long_inputs` speed run saved in benchmarks/results (`long_inputs_speed*.json`)
whose `specextend` engine ran at its defaults (`--at-defaults`, no `--specextend-keys`)
with the given draft precision (other engines a run adds, `--specextend-engines`, are not
counted). A cell is one prompt (text and length) of one run; its ratios
are those the run computed from the median decode tokens/s of its repeats, within that run.
Per length and machine: the runs and cells, then the median (min-max) of `specextend`
against the faster of no speculation and `draft_model`, against each of them, and how many
cells meet issue 20's aims (at least 0.97x the faster; from 8K up, 1.1x `draft_model`);
then every cell below 0.97x the faster. Cells of the same text in several runs each count:
the runs span days, machines and code (each run's section in benchmarks/RESULTS.md says
which).

Then the same for each `draft_length_modes` run saved (`draft_length_modes*.json`) whose one
engine decoded in turns `auto` (the defaults), no speculation's step on vLLM's attention
(`plain_vllm_attention`) and `draft_model`'s algorithm (`draft_model_like`), per length,
machine, draft precision and the draft's prefill (windowed, the default, or over the whole
prompt, as `draft_model` writes it), for every draft precision: there the machine's drift
falls on every mode alike, and each cell has a second ratio, the median over its rounds of
each round's ratio. Prints two Markdown tables; saves benchmarks/results/speed_summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.draft_cost import summary

RESULTS = Path(__file__).parent / "results"
FASTER_AIM = 0.97
DRAFT_MODEL_AIM = 1.1
DRAFT_MODEL_AIM_FROM_LENGTH = 8192
ONE_ENGINE_MODES = ("auto", "plain_vllm_attention", "draft_model_like")


@dataclass(frozen=True)
class SpeedCell:
    run: str
    machine: str
    length: int
    text: str
    vs_faster: float
    vs_no_speculation: float
    vs_draft_model: float
    # Within one engine: the draft's precision and prefill, and the median over the rounds
    # of each round's `auto` over the faster of the two alternatives' decodes.
    setup: str = ""
    vs_faster_by_round: float | None = None


def machine_name(cpu: str) -> str:
    """A short name of the CPU a run saved.

    >>> machine_name("Intel(R) Xeon(R) Processor"), machine_name("AMD EPYC")
    ('Intel Xeon', 'AMD EPYC')
    """
    return " ".join(cpu.replace("(R)", "").replace("Processor", "").split())


def cells_at_defaults(run: str, saved: dict[str, Any], draft_precision: str) -> list[SpeedCell]:
    """The `specextend` cells of one saved speed run, if its engine ran at the defaults with
    a draft of `draft_precision`; none otherwise."""
    args = saved.get("args", {})
    at_defaults = (
        args.get("at_defaults")
        and not args.get("specextend_keys")
        and args.get("draft_precision") == draft_precision
    )
    if not at_defaults:
        return []
    machine = machine_name(saved["machine"]["cpu"])
    return [
        SpeedCell(
            run=run,
            machine=machine,
            length=cell["length"],
            text=cell["text"],
            vs_faster=cell["vs_faster_alternative"],
            vs_no_speculation=cell["vs_no_speculation"],
            vs_draft_model=cell["vs_draft_model"],
        )
        for cell in saved.get("cells", [])
        if cell["method"] == "specextend"
    ]


def cells_in_one_engine(run: str, saved: dict[str, Any]) -> list[SpeedCell]:
    """The `auto` cells of one saved `draft_length_modes` run whose rounds decoded each prompt
    in `auto`, `plain_vllm_attention` and `draft_model_like` (no speculation and
    `draft_model` in that engine); none otherwise. The ratios of the medians are those the
    run saved (`draft_length_modes.summary`), but for no speculation's, from its medians.

    >>> decodes = lambda *rates: [
    ...     {"round": r, "decode_tokens_per_s": rate} for r, rate in enumerate(rates)]
    >>> rates = {"auto": (5.0, 6.0, 4.0), "plain_vllm_attention": (3.0, 3.0, 3.0),
    ...          "draft_model_like": (6.0, 5.0, 5.0)}
    >>> summary = {mode: {"median": sorted(r)[1]} for mode, r in rates.items()}
    >>> summary["auto"] |= {"vs_faster_alternative": 1.0, "vs_draft_model_like": 1.0}
    >>> prompt = {"decodes": {mode: decodes(*r) for mode, r in rates.items()}, "summary": summary}
    >>> saved = {"args": {"modes": ["auto", "plain", "plain_vllm_attention", "draft_model_like"],
    ...                   "length": 4096, "draft_prefill_window": "none"},
    ...          "machine": {"cpu": "AMD EPYC", "cpu_int8_dot_products": False},
    ...          "results": {"code/typing": prompt}}
    >>> cell, = cells_in_one_engine("r", saved)
    >>> cell.machine, cell.setup
    ('AMD EPYC without int8 dot products', 'int8 draft, whole-prompt draft prefill')
    >>> cell.vs_faster, round(cell.vs_no_speculation, 2), cell.vs_draft_model
    (1.0, 1.67, 1.0)
    >>> cell.vs_faster_by_round
    0.8333333333333334
    """
    args = saved["args"]
    if not set(ONE_ENGINE_MODES) <= set(args.get("modes") or ()):
        return []
    machine = machine_name(saved["machine"]["cpu"])
    if not saved["machine"].get("cpu_int8_dot_products", True):
        machine += " without int8 dot products"
    prefill = "whole-prompt" if args.get("draft_prefill_window") == "none" else "windowed"
    setup = f"{args.get('draft_precision') or 'int8'} draft, {prefill} draft prefill"
    cells = []
    for text, prompt in saved["results"].items():
        auto, no_speculation, draft_model = (
            {decode["round"]: decode["decode_tokens_per_s"] for decode in prompt["decodes"][mode]}
            for mode in ONE_ENGINE_MODES
        )
        by_round = [
            auto[r] / max(no_speculation[r], draft_model[r])
            for r in sorted(auto.keys() & no_speculation.keys() & draft_model.keys())
        ]
        medians = prompt["summary"]
        cells.append(
            SpeedCell(
                run=run,
                machine=machine,
                length=args["length"],
                text=text,
                vs_faster=medians["auto"]["vs_faster_alternative"],
                vs_no_speculation=medians["auto"]["median"]
                / medians["plain_vllm_attention"]["median"],
                vs_draft_model=medians["auto"]["vs_draft_model_like"],
                setup=setup,
                vs_faster_by_round=statistics.median(by_round),
            )
        )
    return cells


def summarize(cells: list[SpeedCell]) -> list[dict[str, Any]]:
    """One row per (length, machine, setup), shortest first; within one engine, how many
    cells meet 0.97x the faster by the median of their rounds' ratios too.

    >>> cells = [
    ...     SpeedCell("a", "AMD EPYC", 8192, "x", 1.0, 1.2, 1.0),
    ...     SpeedCell("b", "AMD EPYC", 8192, "x", 1.3, 1.3, 1.4),
    ...     SpeedCell("b", "AMD EPYC", 8192, "y", 0.9, 0.9, 1.2),
    ... ]
    >>> row, = summarize(cells)
    >>> row["runs"], row["cells"], row["vs_faster"]["median"], row["meet_faster_aim"], row["meet_draft_model_aim"]
    (2, 3, 1.0, 2, 2)
    >>> one_engine = [SpeedCell("c", "AMD EPYC", 4096, "x", 0.95, 1.6, 0.95, "int8 draft", 0.98)]
    >>> [(row["setup"], row["meet_faster_aim"], row["meet_faster_aim_by_round"])
    ...  for row in summarize(cells + one_engine)]
    [('int8 draft', 0, 1), ('', 2, None)]
    """
    rows = []
    for length, machine, setup in sorted({(c.length, c.machine, c.setup) for c in cells}):
        group = [c for c in cells if (c.length, c.machine, c.setup) == (length, machine, setup)]
        by_round = [c.vs_faster_by_round for c in group if c.vs_faster_by_round is not None]
        rows.append(
            {
                "length": length,
                "machine": machine,
                "setup": setup,
                "runs": len({cell.run for cell in group}),
                "cells": len(group),
                "vs_faster": summary([cell.vs_faster for cell in group]),
                "vs_no_speculation": summary([cell.vs_no_speculation for cell in group]),
                "vs_draft_model": summary([cell.vs_draft_model for cell in group]),
                "meet_faster_aim": sum(cell.vs_faster >= FASTER_AIM for cell in group),
                "meet_faster_aim_by_round": (
                    sum(value >= FASTER_AIM for value in by_round) if by_round else None
                ),
                "meet_draft_model_aim": (
                    sum(cell.vs_draft_model >= DRAFT_MODEL_AIM for cell in group)
                    if length >= DRAFT_MODEL_AIM_FROM_LENGTH
                    else None
                ),
            }
        )
    return rows


def ratio(figures: dict[str, float]) -> str:
    return f"{figures['median']:.2f} ({figures['min']:.2f}-{figures['max']:.2f})"


def markdown(rows: list[dict[str, Any]], misses: list[SpeedCell]) -> str:
    """The rows as a Markdown table, then the cells below FASTER_AIM; rows within one engine
    (with a setup) add the setup and the aim by the median of the rounds' ratios."""
    one_engine = any(row["setup"] for row in rows)
    lines = [
        "| prompt | machine | "
        + ("draft, its prefill | " if one_engine else "")
        + "runs | cells | vs the faster | >= 0.97x the faster | "
        + ("by the rounds' median | " if one_engine else "")
        + "vs no speculation | vs `draft_model` | >= 1.1x `draft_model` |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if one_engine else ""),
    ]
    for row in rows:
        of_cells = f" of {row['cells']}"
        meeting = row["meet_draft_model_aim"]
        draft_model_aim = "" if meeting is None else f"{meeting}{of_cells}"
        lines.append(
            f"| {row['length'] // 1024}K | {row['machine']} | "
            + (f"{row['setup']} | " if one_engine else "")
            + f"{row['runs']} | {row['cells']} "
            f"| {ratio(row['vs_faster'])} | {row['meet_faster_aim']}{of_cells} | "
            + (f"{row['meet_faster_aim_by_round']}{of_cells} | " if one_engine else "")
            + f"{ratio(row['vs_no_speculation'])} | {ratio(row['vs_draft_model'])} "
            f"| {draft_model_aim} |"
        )
    lines.append("")
    lines.append(f"Cells below {FASTER_AIM}x the faster (rounded down):")
    lines.extend(
        f"- {cell.length // 1024}K {cell.text} ({cell.machine}, {cell.run}): "
        f"{rounded_down(cell.vs_faster)}"
        + (
            ""
            if cell.vs_faster_by_round is None
            else f", by the rounds' median {rounded_down(cell.vs_faster_by_round)}"
        )
        for cell in misses
    )
    return "\n".join(lines)


def rounded_down(value: float) -> str:
    """
    >>> rounded_down(0.9699)
    '0.969'
    """
    return f"{math.floor(value * 1000) / 1000:.3f}"


def summed_up(cells: list[SpeedCell]) -> tuple[dict[str, Any], list[SpeedCell]]:
    """The record to save (the rows, the cells below FASTER_AIM and every cell) and the
    cells below FASTER_AIM, shortest prompt first, then the furthest below."""
    misses = sorted(
        (cell for cell in cells if cell.vs_faster < FASTER_AIM),
        key=lambda cell: (cell.length, cell.vs_faster),
    )
    record = {
        "rows": summarize(cells),
        "below_faster_aim": [asdict(cell) for cell in misses],
        "cells": [asdict(cell) for cell in cells],
    }
    return record, misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft-precision", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", default="speed_summary")
    args = parser.parse_args()

    cells, one_engine_cells = [], []
    for path in sorted(args.results.glob("long_inputs_speed*.json")):
        cells += cells_at_defaults(path.stem, json.loads(path.read_text()), args.draft_precision)
    for path in sorted(args.results.glob("draft_length_modes*.json")):
        one_engine_cells += cells_in_one_engine(path.stem, json.loads(path.read_text()))
    if not cells:
        raise SystemExit(f"no speed cell at the defaults with a {args.draft_precision} draft in {args.results}")
    speed_suite, misses = summed_up(cells)
    print(markdown(speed_suite["rows"], misses))
    record: dict[str, Any] = {"args": {"draft_precision": args.draft_precision}, **speed_suite}
    if one_engine_cells:
        one_engine, misses = summed_up(one_engine_cells)
        print("\nWithin one engine:\n")
        print(markdown(one_engine["rows"], misses))
        record["one_engine"] = one_engine
    (args.results / f"{args.output}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
