"""Serving benchmark: `vllm bench serve` against `vllm serve` on the real pair, offline.

    python -m benchmarks.serving                       # 2K prompts, concurrency 1 and 4
    python -m benchmarks.serving --length 4096 --concurrency 1 4 16 --num-prompts 16

For each method (no speculation, `draft_model`, `specextend` with its default keys, so
`drafting: auto`, and with `draft_prefill: deferred`) one server starts on 127.0.0.1 and vLLM's own client runs the same
prompts at each concurrency, in the order given: long prompts cut from texts of five
genres, greedy, a fixed number of new tokens. The prefix cache stays on, as in serving, so
the first concurrency pays the prefills and the later ones find the prompts cached and
measure decoding under load (their time to first token is then that of a cached prompt).
With `--rounds N` the servers start in turn N times (no speculation, then the other
methods, again), so that a machine whose speed drifts slows every method alike, and each
method's ratios to no speculation are taken within a round and summed up as their median
(min-max) over rounds. Saves benchmarks/results/serving.json (vLLM's figures per run, what
each run added to the server's speculative counters and to the decoding steps its
scheduler timed, by batch sizes and drafts, and the summary) and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import engine
from benchmarks.draft_cost import summary
from benchmarks.genres import GENRES, genre_texts
from benchmarks.prompts import summary_prompt
from benchmarks.server_health import wait_until_healthy
from specextend_vllm.metrics import drafts_label

VLLM_CLI = Path(sys.executable).with_name("vllm")
START_TIMEOUT_S = 900
SERVER_ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
FIGURES = (
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_tpot_ms",
    "completed",
    "failed",
)
# Figures compared with no speculation's in the same round and at the same concurrency.
RATIOS = {
    "throughput_vs_no_speculation": "output_throughput",
    "mean_ttft_vs_no_speculation": "mean_ttft_ms",
    "mean_tpot_vs_no_speculation": "mean_tpot_ms",
}
# The server's counters each run adds to (0 where a server has none).
COUNTERS = {
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "skipped_draft_steps": "vllm:specextend_skipped_draft_steps_total",
    "catch_up_tokens": "vllm:specextend_catch_up_tokens_total",
    "unrepaid_drafting_steps": "vllm:specextend_unrepaid_drafting_steps_total",
    "prompt_pass_tokens": "vllm:specextend_prompt_pass_tokens_total",
    "prompt_pass_seconds": "vllm:specextend_prompt_pass_seconds_total",
}


# The decoding steps the scheduler timed, by batch sizes and drafts per request.
DECODING_STEP_SERIES = {
    "vllm:specextend_decoding_steps_total": "steps",
    "vllm:specextend_decoding_step_seconds_total": "seconds",
    "vllm:specextend_decoding_step_tokens_total": "tokens",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def speculative_configs(draft: Path, k: int) -> dict[str, dict[str, Any] | None]:
    common = {"model": str(draft), "num_speculative_tokens": k}
    return {
        "no_speculation": None,
        "draft_model": {"method": "draft_model", **common},
        "specextend": {"method": "specextend", **common},
        "specextend_deferred_prefill": {
            "method": "specextend", **common, "draft_prefill": "deferred"
        },
    }


def write_prompts(tokenizer: Any, length: int, num_prompts: int, path: Path) -> None:
    """`num_prompts` prompts of `length` tokens, taking texts from each genre in turn."""
    texts = [text for by_name in genre_texts(list(GENRES)).values() for text in by_name.values()]
    with path.open("w") as out:
        for index in range(num_prompts):
            token_ids = summary_prompt(tokenizer, texts[index % len(texts)], length)
            out.write(json.dumps({"prompt": tokenizer.decode(token_ids)}) + "\n")


def start_server(
    target: Path,
    speculative_config: dict[str, Any] | None,
    port: int,
    args: argparse.Namespace,
    log: Any,
) -> subprocess.Popen[bytes]:
    command = [
        str(VLLM_CLI), "serve", str(target), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", str(args.length + args.max_tokens + 256), "--seed", "0",
    ]
    if not args.compiled:
        command.append("--enforce-eager")
    if speculative_config is not None:
        command += ["--speculative-config", json.dumps(speculative_config)]
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **SERVER_ENV, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)},
        start_new_session=True,
    )


def wait_until_ready(server: subprocess.Popen[bytes], port: int) -> None:
    wait_until_healthy(server, f"http://127.0.0.1:{port}", START_TIMEOUT_S, poll_s=2)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, 15)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, 9)
        server.wait(timeout=30)


def server_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def counter_totals(metrics: str) -> dict[str, float]:
    """COUNTERS' totals in a /metrics text, summed over their labels."""
    names = {name: key for key, name in COUNTERS.items()}
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        key = names.get(series.split("{", 1)[0])
        if key is not None:
            totals[key] += float(value)
    return totals


def decoding_steps(metrics: str) -> dict[str, dict[str, float]]:
    """The decoding steps the scheduler timed, in a /metrics text: "batch sizes x
    drafts" ("3": kept 3 drafts; "0->3": switched from none to 3) -> steps, seconds and
    tokens.

    >>> labels = '{batch_sizes="4-7",engine="0",next_drafts="3",num_drafts="0"}'
    >>> decoding_steps(
    ...     f"vllm:specextend_decoding_steps_total{labels} 2.0"
    ...     f"\\nvllm:specextend_decoding_step_tokens_total{labels} 19.0"
    ... )
    {'4-7 x 0->3': {'steps': 2.0, 'tokens': 19.0}}
    """
    steps: dict[str, dict[str, float]] = {}
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        figure = DECODING_STEP_SERIES.get(series.split("{", 1)[0])
        if figure is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
        drafts = drafts_label(int(labels["num_drafts"]), int(labels["next_drafts"]))
        key = f"{labels['batch_sizes']} x {drafts}"
        steps.setdefault(key, {})[figure] = float(value)
    return steps


def decoding_steps_added(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """What a run added to each bucket's and number of drafts' decoding steps, where it
    added any."""
    added = {}
    for key, figures in after.items():
        earlier = before.get(key, {})
        figures = {figure: value - earlier.get(figure, 0.0) for figure, value in figures.items()}
        if figures["steps"]:
            added[key] = figures
    return added


def against_plain_steps(steps: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per bucket of batch sizes, the tokens per second of all its decoding steps (plain,
    drafting and switching between the two) over those of its plain steps alone: what
    `drafting: auto`'s choices gave against decoding without drafts on the same server at
    the same time, where the server measured both.

    >>> against_plain_steps({
    ...     "4-7 x 0": {"steps": 10, "seconds": 3.0, "tokens": 40},
    ...     "4-7 x 0->1": {"steps": 1, "seconds": 0.5, "tokens": 4},
    ...     "4-7 x 1": {"steps": 10, "seconds": 4.0, "tokens": 60},
    ...     "1 x 4": {"steps": 5, "seconds": 2.0, "tokens": 15},
    ... })
    {'4-7': 1.04}
    """
    buckets: dict[str, list[dict[str, float]]] = {}
    for key, figures in steps.items():
        buckets.setdefault(key.split(" x ")[0], []).append(figures)
    ratios = {}
    for batch_sizes, tallies in buckets.items():
        plain = steps.get(f"{batch_sizes} x 0")
        if plain is None:
            continue
        rate = sum(t["tokens"] for t in tallies) / sum(t["seconds"] for t in tallies)
        ratios[batch_sizes] = round(rate / (plain["tokens"] / plain["seconds"]), 3)
    return ratios


def bench_serve(target: Path, port: int, prompts: Path, args: argparse.Namespace, concurrency: int, result: Path) -> dict[str, Any]:
    subprocess.run(
        [
            str(VLLM_CLI), "bench", "serve", "--backend", "vllm", "--host", "127.0.0.1",
            "--port", str(port), "--model", str(target), "--dataset-name", "custom",
            "--dataset-path", str(prompts), "--custom-output-len", str(args.max_tokens),
            "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
        ],
        check=True,
        timeout=args.run_timeout_s,
    )
    return json.loads(result.read_text())


def run(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any, work: Path) -> list[dict[str, Any]]:
    prompts = work / "prompts.jsonl"
    write_prompts(tokenizer, args.length, args.num_prompts, prompts)
    configs = speculative_configs(draft, args.k)
    rows = []
    for round_index in range(args.rounds):
        for method in args.methods:
            port = free_port()
            log_path = work / f"{method}_{round_index}.log"
            print(
                f"[serving] round {round_index + 1}, {method}: starting vllm serve "
                f"(log: {log_path})",
                flush=True,
            )
            with log_path.open("w") as log:
                server = start_server(target, configs[method], port, args, log)
                try:
                    wait_until_ready(server, port)
                    for concurrency in args.concurrency:
                        print(f"[serving] {method}: concurrency {concurrency}", flush=True)
                        before = server_metrics(port)
                        result = work / f"{method}_{round_index}_{concurrency}.json"
                        figures = bench_serve(target, port, prompts, args, concurrency, result)
                        after = server_metrics(port)
                        totals = counter_totals(before), counter_totals(after)
                        steps = decoding_steps_added(
                            decoding_steps(before), decoding_steps(after)
                        )
                        rows.append(
                            {"method": method, "round": round_index, "concurrency": concurrency}
                            | {"length": args.length}
                            | {key: figures.get(key) for key in FIGURES}
                            | {key: totals[1][key] - totals[0][key] for key in COUNTERS}
                            | {"decoding_steps": steps}
                            | {"against_plain_steps": against_plain_steps(steps)}
                        )
                finally:
                    stop_server(server)
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's RATIOS against no speculation's row of the same round and concurrency
    (rows saved before rounds existed count as round 0)."""
    plain = {
        (row.get("round", 0), row["concurrency"]): row
        for row in rows
        if row["method"] == "no_speculation"
    }
    for row in rows:
        reference = plain[row.get("round", 0), row["concurrency"]]
        for ratio, figure in RATIOS.items():
            row[ratio] = row[figure] / reference[figure]


def over_rounds(
    rows: Sequence[dict[str, Any]], keys: Sequence[str] = tuple(RATIOS)
) -> list[dict[str, Any]]:
    """Per method and concurrency, in the rows' order, each key's median, min and max over
    the rounds.

    >>> rows = [{"method": "m", "concurrency": 4, "round": r, "x": x}
    ...         for r, x in enumerate([0.9, 1.2, 1.0])]
    >>> over_rounds(rows, ["x"])
    [{'method': 'm', 'concurrency': 4, 'rounds': 3, 'x': {'median': 1.0, 'min': 0.9, 'max': 1.2}}]
    """
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["concurrency"]), []).append(row)
    return [
        {"method": method, "concurrency": concurrency, "rounds": len(group)}
        | {key: summary([row[key] for row in group]) for key in keys}
        for (method, concurrency), group in groups.items()
    ]


def plot(results_path: Path) -> Path:
    """Output tokens/s relative to no speculation, and time per output token, per
    method and concurrency: medians over the rounds, bars from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(results_path.read_text())
    rows = record["table"]
    methods = list(dict.fromkeys(row["method"] for row in rows))
    concurrencies = sorted({row["concurrency"] for row in rows})
    figure, panels = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(methods)
    keys = ("throughput_vs_no_speculation", "mean_tpot_ms")
    over = over_rounds(rows, keys)
    for index, method in enumerate(methods):
        by_concurrency = {cell["concurrency"]: cell for cell in over if cell["method"] == method}
        offsets = [c + (index - (len(methods) - 1) / 2) * width for c in range(len(concurrencies))]
        for panel, key in zip(panels, keys):
            cells = [by_concurrency[c][key] for c in concurrencies]
            medians = [cell["median"] for cell in cells]
            spread = [
                [cell["median"] - cell["min"] for cell in cells],
                [cell["max"] - cell["median"] for cell in cells],
            ]
            panel.bar(offsets, medians, width, yerr=spread, capsize=2, label=method)
    for panel, label in zip(panels, ("output tokens/s / no speculation", "mean time per output token (ms)")):
        panel.set_xticks(range(len(concurrencies)), [f"concurrency {c}" for c in concurrencies])
        panel.set_ylabel(label)
        panel.grid(alpha=0.3, axis="y")
    panels[0].axhline(1.0, color="black", linewidth=0.8)
    panels[0].legend(fontsize=8)
    figure.suptitle(
        f"vllm bench serve, {record['args']['length']}-token prompts, "
        f"{record['args']['max_tokens']} new tokens ({record['machine']['cpu']})",
        fontsize=9,
    )
    path = results_path.with_suffix(".png")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import int8_draft, qwen_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, help="model folder (default: Qwen2.5-Coder 1.5B)")
    parser.add_argument("--draft", type=Path, help="model folder (default: Qwen2.5-Coder 0.5B)")
    parser.add_argument("--draft-precision", choices=("fp32", "int8"), default="fp32",
                        help="without --draft: the fp32 0.5B draft or its int8 W8A8 copy")
    parser.add_argument("--length", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--methods", nargs="+", default=["no_speculation", "draft_model", "specextend"])
    parser.add_argument("--kv-cache-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE of each server")
    parser.add_argument("--rounds", type=int, default=1, help="times the servers start in turn")
    parser.add_argument("--run-timeout-s", type=int, default=3600)
    parser.add_argument(
        "--compiled", action="store_true",
        help="vLLM's default torch.compile (inductor) instead of --enforce-eager, for every server",
    )
    parser.add_argument("--output", default="serving", help="results file name without .json")
    parser.add_argument("--plot-only", action="store_true", help="plot the saved results")
    args = parser.parse_args()
    if "no_speculation" not in args.methods:
        parser.error("--methods must include no_speculation: the table is relative to it")
    allowed = sorted(speculative_configs(Path(), args.k))
    unknown = sorted(set(args.methods) - set(allowed))
    if unknown:
        parser.error(f"unknown --methods {unknown}; allowed: {allowed}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    path = engine.RESULTS / f"{args.output}.json"
    if args.plot_only:
        print(f"saved {plot(path)}")
        return
    draft, target = (args.draft, args.target) if args.draft and args.target else qwen_pair()
    if not args.draft and args.draft_precision == "int8":
        draft = int8_draft()
    tokenizer = AutoTokenizer.from_pretrained(target)
    with tempfile.TemporaryDirectory(prefix="specextend-serving-") as work:
        rows = run(args, draft, target, tokenizer, Path(work))
    over = over_rounds(rows)
    record = {"args": vars(args), "machine": engine.machine(), "table": rows, "summary": over}
    path.write_text(json.dumps(record, indent=1))
    print(
        "round | method | concurrency | output tok/s | vs no spec | median TTFT ms | "
        "median ITL ms | p99 ITL ms | failed"
    )
    for row in rows:
        print(
            f"{row['round'] + 1} | {row['method']} | {row['concurrency']} | "
            f"{row['output_throughput']:.2f} | "
            f"{row['throughput_vs_no_speculation']:.2f} | {row['median_ttft_ms']:.0f} | "
            f"{row['median_itl_ms']:.0f} | {row['p99_itl_ms']:.0f} | {row['failed']}"
        )
    print(
        "method | concurrency | rounds | vs no spec, median (min-max): output tok/s, "
        "mean TTFT, mean time per output token"
    )
    for cell in over:
        figures = ", ".join(
            f"{cell[key]['median']:.2f} ({cell[key]['min']:.2f}-{cell[key]['max']:.2f})"
            for key in RATIOS
        )
        print(f"{cell['method']} | {cell['concurrency']} | {cell['rounds']} | {figures}")
    print(
        "round | method | concurrency | decoding steps the scheduler timed (batch sizes x "
        "drafts: steps, mean step ms, tokens/s) | their tokens/s over its plain steps'"
    )
    for row in rows:
        if row["decoding_steps"]:
            steps = "; ".join(
                f"{key}: {figures['steps']:.0f}, "
                f"{1000 * figures['seconds'] / figures['steps']:.0f}, "
                f"{figures['tokens'] / figures['seconds']:.2f}"
                for key, figures in row["decoding_steps"].items()
            )
            ratios = ", ".join(
                f"{sizes}: {ratio:.2f}" for sizes, ratio in row["against_plain_steps"].items()
            )
            print(
                f"{row['round'] + 1} | {row['method']} | {row['concurrency']} | {steps} | "
                f"{ratios}"
            )
    print(f"saved {path} and {plot(path)}")


if __name__ == "__main__":
    main()
