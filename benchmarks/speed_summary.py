"""Every saved speed cell of `specextend` at its defaults, summed up per prompt length and
machine.

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
which). Prints a Markdown table; saves benchmarks/results/speed_summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.draft_cost import summary

RESULTS = Path(__file__).parent / "results"
FASTER_AIM = 0.97
DRAFT_MODEL_AIM = 1.1
DRAFT_MODEL_AIM_FROM_LENGTH = 8192


@dataclass(frozen=True)
class SpeedCell:
    run: str
    machine: str
    length: int
    text: str
    vs_faster: float
    vs_no_speculation: float
    vs_draft_model: float


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


def summarize(cells: list[SpeedCell]) -> list[dict[str, Any]]:
    """One row per (length, machine), shortest first.

    >>> cells = [
    ...     SpeedCell("a", "AMD EPYC", 8192, "x", 1.0, 1.2, 1.0),
    ...     SpeedCell("b", "AMD EPYC", 8192, "x", 1.3, 1.3, 1.4),
    ...     SpeedCell("b", "AMD EPYC", 8192, "y", 0.9, 0.9, 1.2),
    ... ]
    >>> row, = summarize(cells)
    >>> row["runs"], row["cells"], row["vs_faster"]["median"], row["meet_faster_aim"], row["meet_draft_model_aim"]
    (2, 3, 1.0, 2, 2)
    """
    rows = []
    for length, machine in sorted({(cell.length, cell.machine) for cell in cells}):
        group = [cell for cell in cells if (cell.length, cell.machine) == (length, machine)]
        rows.append(
            {
                "length": length,
                "machine": machine,
                "runs": len({cell.run for cell in group}),
                "cells": len(group),
                "vs_faster": summary([cell.vs_faster for cell in group]),
                "vs_no_speculation": summary([cell.vs_no_speculation for cell in group]),
                "vs_draft_model": summary([cell.vs_draft_model for cell in group]),
                "meet_faster_aim": sum(cell.vs_faster >= FASTER_AIM for cell in group),
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
    lines = [
        "| prompt | machine | runs | cells | vs the faster | >= 0.97x the faster "
        "| vs no speculation | vs `draft_model` | >= 1.1x `draft_model` |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        draft_model_aim = (
            "" if row["meet_draft_model_aim"] is None else f"{row['meet_draft_model_aim']} of {row['cells']}"
        )
        lines.append(
            f"| {row['length'] // 1024}K | {row['machine']} | {row['runs']} | {row['cells']} "
            f"| {ratio(row['vs_faster'])} | {row['meet_faster_aim']} of {row['cells']} "
            f"| {ratio(row['vs_no_speculation'])} | {ratio(row['vs_draft_model'])} | {draft_model_aim} |"
        )
    lines.append("")
    lines.append(f"Cells below {FASTER_AIM}x the faster (rounded down):")
    lines.extend(
        f"- {cell.length // 1024}K {cell.text} ({cell.machine}, {cell.run}): "
        f"{math.floor(cell.vs_faster * 1000) / 1000:.3f}"
        for cell in misses
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft-precision", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", default="speed_summary")
    args = parser.parse_args()

    cells = []
    for path in sorted(args.results.glob("long_inputs_speed*.json")):
        cells += cells_at_defaults(path.stem, json.loads(path.read_text()), args.draft_precision)
    if not cells:
        raise SystemExit(f"no speed cell at the defaults with a {args.draft_precision} draft in {args.results}")
    rows = summarize(cells)
    misses = sorted(
        (cell for cell in cells if cell.vs_faster < FASTER_AIM), key=lambda cell: (cell.length, cell.vs_faster)
    )
    print(markdown(rows, misses))
    record = {
        "args": {"draft_precision": args.draft_precision},
        "rows": rows,
        "below_faster_aim": [asdict(cell) for cell in misses],
        "cells": [asdict(cell) for cell in cells],
    }
    (args.results / f"{args.output}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
