"""Long-input benchmarks on the real model pair, offline.

    python -m benchmarks.long_inputs speed   # speed, acceptance and time per step against length
    python -m benchmarks.long_inputs tiny_draft  # the same with a tiny draft trained on 8K positions
    python -m benchmarks.long_inputs needle  # how often the draft proposes a fact hidden in the prompt
    python -m benchmarks.long_inputs batch   # throughput with concurrent long prompts
    python -m benchmarks.long_inputs draft_step  # one draft pass against the tokens it attends to
    python -m benchmarks.long_inputs verification  # target verification: hybrid against native attention
    python -m benchmarks.long_inputs trees   # chain against static token trees
    python -m benchmarks.long_inputs plot    # PNG plots from the saved speed results

Methods, on the same prompts: no speculation, vLLM's `draft_model`, and `specextend` with
policies `cmr`, `streaming` and `full`. The three policies share one engine and one prefill
per prompt (`specextend_vllm.reconfigure` switches them); `cmr` runs first and pays the
prefill, so the others' time to first token is taken from it. `speed --at-defaults` runs
`specextend` at its default keys instead (`drafting` and `retrieval` choosing themselves,
never reconfigured, so its choosers keep what they learned from one prompt to the next);
`--genres` prompts with texts of the genres in `benchmarks.genres`, and `--draft-precision
int8` takes the int8 draft. Each section saves its raw figures and the machine's
description under benchmarks/results/; `speed` adds a cell per method and prompt (median
decode tokens/s of the repeats, their range, and the ratio to the faster of no speculation
and `draft_model`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from benchmarks import engine  # noqa: E402
from benchmarks.genres import GENRES, named_texts, prompt_texts  # noqa: E402
from benchmarks.prompts import (  # noqa: E402
    draft_origin_of_tokens,
    needle_prompt,
    needle_token_span,
    summary_prompt,
)

SPEED_TEXTS = (
    "shakespeare/hamlet",
    "paul_graham_essays",
    "milton/paradise_lost_no_introduction",
    "shakespeare/lear",
)
BATCH_TEXTS = (
    "shakespeare/hamlet",
    "shakespeare/macbeth",
    "shakespeare/othello",
    "shakespeare/tempest",
    "shakespeare/lear",
    "milton/paradise_lost_no_introduction",
    "milton/areopagitica",
    "paul_graham_essays",
)
HAYSTACK = "paul_graham_essays"
POLICIES = ("cmr", "streaming", "full")
# specextend runs of the tiny-draft section: absolute against compact positions, then
# compact positions with retrieval every 1 and 8 steps and with adaptive retrieval.
TINY_DRAFT_VARIANTS = {
    f"specextend_{name}": {"positions": positions, "retrieval_interval": interval, "retrieval_trigger": trigger}
    for name, positions, interval, trigger in (
        ("absolute", "absolute", 4, "interval"),
        ("compact", "compact", 4, "interval"),
        ("compact_interval1", "compact", 1, "interval"),
        ("compact_interval8", "compact", 8, "interval"),
        ("compact_adaptive", "compact", 8, "adaptive"),
    )
}


# Static trees of depth 4 (the chain's k) for the trees section: 8 and 16 nodes, wider
# near the root, where the draft is surest to be right and most often second-best.
TREES = {
    "tree8": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]],
    "tree16": [
        [0], [1], [2], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
        [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0],
    ],
}


def engine_configs(draft: Path, args: argparse.Namespace) -> dict[str, dict[str, Any] | None]:
    common = {"model": str(draft), "num_speculative_tokens": args.k}
    return {
        "no_speculation": None,
        "draft_model": {"method": "draft_model", **common},
        # Drafting every step, as draft_model does, so acceptance is measured at every step
        # (unless specextend runs at its defaults).
        "specextend": {
            "method": "specextend",
            **common,
            **({} if args.at_defaults else {"drafting": "always"}),
            **args.specextend_keys,
        },
    }


def specextend_variants(llm: Any, variants: dict[str, dict[str, Any]]) -> Iterator[str]:
    """Switches the running specextend engine to each variant's keys in turn."""
    from specextend_vllm import reconfigure

    for name, keys in variants.items():
        reconfigure(llm, **keys)
        yield name


def step_records(llm: Any) -> list[dict[str, Any]]:
    from specextend_vllm import step_timings

    return step_timings(llm)[0]


# --- speed -------------------------------------------------------------------------------


def run_speed(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    """With --at-defaults, specextend runs at the keys it is given and is never
    reconfigured, so its choosers keep what they learned from one prompt to the next."""
    variants = (
        {}
        if args.at_defaults
        else {f"specextend_{policy}": {"policy": policy} for policy in args.policies}
    )
    configs = engine_configs(draft, args)
    extra_engines = {
        f"specextend_{name}": {**configs["specextend"], **keys}
        for name, keys in args.specextend_engines.items()
    }
    configs = {name: configs[name] for name in args.methods} | extra_engines
    return run_lengths(args, target, tokenizer, configs, variants, "speed")


def run_verification(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    """specextend (cmr) with the target verifying through hybrid tree attention and through
    vLLM's attention, on one prefill per prompt; no speculation for the plain step."""
    variants = {
        f"specextend_{mode}": {"verification_attention": mode} for mode in ("hybrid", "native")
    }
    configs = {name: config for name, config in engine_configs(draft, args).items() if name != "draft_model"}
    configs = {name: config for name, config in configs.items() if name in args.methods}
    return run_lengths(args, target, tokenizer, configs, variants, "verification")


def run_trees(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    """specextend (cmr) drafting a chain of k tokens against static trees of depth k and
    dynamic trees at most k deep, each tree on its own engine (a tree is fixed when the
    engine starts); no speculation for the plain step."""
    base = engine_configs(draft, args)
    configs = {"no_speculation": None, "specextend_chain": base["specextend"]}
    for name, tree in TREES.items():
        configs[f"specextend_{name}"] = {
            **base["specextend"], "tree": tree, "num_speculative_tokens": len(tree)
        }
    for num_nodes in (8, 16):
        configs[f"specextend_dynamic{num_nodes}"] = {
            **base["specextend"],
            "tree": "dynamic",
            "num_speculative_tokens": num_nodes,
            "tree_max_depth": args.k,
        }
    if args.tree_settings:
        configs = {
            name: config for name, config in configs.items()
            if name == "no_speculation" or name.removeprefix("specextend_") in args.tree_settings
        }
    return run_lengths(args, target, tokenizer, configs, {}, "trees")


def run_tiny_draft(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    """Speed and acceptance of a small draft with its own tokenizer and an 8K training
    length (SmolLM2-135M by default), paired through `use_heterogeneous_vocab`, on prompts
    up to twice its trained length; specextend with absolute and compact positions, and
    with retrieval intervals 1, 4, 8 and adaptive retrieval on compact positions."""
    configs = {
        name: None if config is None else {**config, "use_heterogeneous_vocab": True}
        for name, config in engine_configs(draft, args).items()
        if name in args.methods
    }
    return run_lengths(args, target, tokenizer, configs, TINY_DRAFT_VARIANTS, "tiny draft")


def run_lengths(
    args: argparse.Namespace,
    target: Path,
    tokenizer: Any,
    configs: dict[str, dict[str, Any] | None],
    specextend_variants_keys: dict[str, dict[str, Any]],
    description: str,
) -> dict[str, Any]:
    """Each engine of `configs` on each prompt; the specextend engine runs every variant
    on one prefill, the first variant paying for it."""
    from tqdm import tqdm

    prompts = [
        {"length": length, "genre": genre, "text": name, "token_ids": summary_prompt(tokenizer, text, length)}
        for length in args.lengths
        for genre, name, text in prompt_texts(
            args.texts[: args.texts_per_length], args.genres, args.skip_texts, args.texts_per_length
        )
    ]
    runs: list[dict[str, Any]] = []
    max_model_len = max(args.lengths) + args.max_tokens + 64
    runs_per_prompt = sum(
        max(len(specextend_variants_keys), 1) if name == "specextend" else 1 for name in configs
    )
    with tqdm(total=len(prompts) * runs_per_prompt, desc=description) as progress:
        for engine_name, speculative_config in configs.items():
            llm = engine.make_llm(
                target, speculative_config, max_model_len,
                block_size=args.block_size, enforce_eager=not args.compiled,
            )
            for prompt in prompts:
                llm.reset_prefix_cache()
                prefill_ttft: float | None = None
                methods = (
                    specextend_variants(llm, specextend_variants_keys)
                    if engine_name == "specextend" and specextend_variants_keys
                    else iter([engine_name])
                )
                tokens_per_step = (speculative_config or {}).get("num_speculative_tokens", 0) + 1
                for method in methods:
                    for repeat in range(args.repeats):
                        progress.set_postfix_str(f"{method} {prompt['length']} run {repeat + 1}")
                        run = measure_one(llm, method, prompt, args, tokens_per_step)
                        run["repeat"] = repeat
                        prefill_ttft = run["ttft_s"] if prefill_ttft is None else prefill_ttft
                        run["engine_ttft_s"] = prefill_ttft
                        runs.append(run)
                    progress.update()
            engine.close(llm)
            del llm
    earlier: dict[str, Any] = {}
    if args.append:
        earlier = json.loads(results_path(args).read_text())
        runs = earlier["runs"] + runs
    return {
        "runs": runs,
        "table": speed_table(runs, args.k),
        "cells": speed_cells(runs),
        "earlier_args": earlier.get("earlier_args", []) + ([earlier["args"]] if earlier else []),
    }


def results_path(args: argparse.Namespace) -> Path:
    section = "speed" if args.section == "plot" else args.section
    return engine.RESULTS / f"{args.output or f'long_inputs_{section}'}.json"


def measure_one(
    llm: Any, method: str, prompt: dict[str, Any], args: argparse.Namespace, tokens_per_step: int
) -> dict[str, Any]:
    """One prompt on one engine; `tokens_per_step`: target tokens of a decoding step."""
    step_records(llm)
    retrieval_before = engine.retrieval_counters(llm) if method.startswith("specextend") else {}
    machine_gflops = engine.machine_gflops()
    machine_memory_gbps = engine.machine_memory_gbps()
    [request], wall_s = engine.generate(llm, [prompt["token_ids"]], args.max_tokens)
    breakdown = engine.time_breakdown(step_records(llm), max(tokens_per_step, args.k + 1), request.decode_s)
    run = {
        "method": method,
        "length": prompt["length"],
        "genre": prompt["genre"],
        "text": prompt["text"],
        "wall_s": wall_s,
        "ttft_s": request.ttft_s,
        "decode_s": request.decode_s,
        "tokens": request.tokens,
        "accepted_per_step": request.accepted_per_step,
        "drafted_per_step": request.drafted_per_step,
        "time_per_step": breakdown,
        "machine_gflops": machine_gflops,
        "machine_memory_gbps": machine_memory_gbps,
    }
    if retrieval_before:
        after = engine.retrieval_counters(llm)
        steps = max(breakdown.get("steps", 0), 1)
        reduced_steps, mean_kept_tokens = engine.reduced_steps_between(retrieval_before, after)
        run["retrieval"] = {
            "retrievals": after["retrievals"] - retrieval_before["retrievals"],
            "reduced_draft_steps": reduced_steps,
            "mean_kept_tokens": mean_kept_tokens,
            "scorer_s_per_step": (after["scorer_seconds"] - retrieval_before["scorer_seconds"]) / steps,
        }
        breakdown["scorer_s"] = run["retrieval"]["scorer_s_per_step"]
    return run


def request_figures(runs: list[dict[str, Any]]) -> list[engine.RequestFigures]:
    return [
        engine.RequestFigures(r["tokens"], r["ttft_s"], r["decode_s"], r["accepted_per_step"], r["drafted_per_step"])
        for r in runs
    ]


def speed_table(runs: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    baseline_tokens = {(r["length"], r["text"]): r["tokens"] for r in runs if r["method"] == "no_speculation"}
    rows = []
    for method in dict.fromkeys(r["method"] for r in runs):
        for length in sorted({r["length"] for r in runs}):
            group = [r for r in runs if r["method"] == method and r["length"] == length]
            if not group:
                continue
            requests = request_figures(group)
            generated = sum(len(r["tokens"]) for r in group)
            repeats = sorted({r.get("repeat", 0) for r in group})
            rate_per_repeat = [
                sum(len(r["tokens"]) - 1 for r in group if r.get("repeat", 0) == repeat)
                / sum(r["decode_s"] for r in group if r.get("repeat", 0) == repeat)
                for repeat in repeats
            ]
            rows.append(
                {
                    "method": method,
                    "length": length,
                    "prompts": len(group),
                    "decode_tokens_per_s": sum(len(r["tokens"]) - 1 for r in group) / sum(r["decode_s"] for r in group),
                    "decode_tokens_per_s_min": min(rate_per_repeat),
                    "decode_tokens_per_s_max": max(rate_per_repeat),
                    "repeats": len(repeats),
                    "end_to_end_tokens_per_s": generated / sum(r["engine_ttft_s"] + r["decode_s"] for r in group),
                    "ttft_s": sum(r["engine_ttft_s"] for r in group) / len(group),
                    "mean_acceptance_length": engine.mean_acceptance_length(requests),
                    "acceptance_per_position": engine.acceptance_per_position(requests, k),
                    "same_output_as_no_speculation": all(
                        r["tokens"] == baseline_tokens.get((r["length"], r["text"])) for r in group
                    ),
                    "time_per_step": mean_breakdown([r["time_per_step"] for r in group]),
                }
            )
    for row in rows:
        for reference in ("no_speculation", "draft_model"):
            ref = next((r for r in rows if r["method"] == reference and r["length"] == row["length"]), None)
            if ref:
                row[f"decode_vs_{reference}"] = row["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
    return rows


def speed_cells(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method, length and text: the median decode tokens/s of the repeats with
    their range, and its ratio to no speculation's, to `draft_model`'s and to the faster
    of the two on the same prompt (the aims of issue 20 are read cell by cell)."""
    cells: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["method"], run["length"], run["text"]), []).append(run)
    rows = []
    for (method, length, text), group in cells.items():
        rates = [(len(r["tokens"]) - 1) / r["decode_s"] for r in group]
        steps = [r["time_per_step"] for r in group if r["time_per_step"]]
        requests = request_figures(group)
        rows.append(
            {
                "method": method,
                "length": length,
                "genre": group[0].get("genre"),
                "text": text,
                "repeats": len(group),
                "decode_tokens_per_s": statistics.median(rates),
                "decode_tokens_per_s_min": min(rates),
                "decode_tokens_per_s_max": max(rates),
                "mean_acceptance_length": engine.mean_acceptance_length(requests),
                "target_forward_ms": 1000 * statistics.median(s["target_forward_s"] for s in steps) if steps else None,
                "ttft_s": group[0]["engine_ttft_s"],
                "reduced_draft_steps": sum(r.get("retrieval", {}).get("reduced_draft_steps", 0) for r in group),
                "machine_gflops": median_or_none([r.get("machine_gflops") for r in group]),
                "machine_memory_gbps": median_or_none([r.get("machine_memory_gbps") for r in group]),
            }
        )
    by_key = {(r["method"], r["length"], r["text"]): r for r in rows}
    for row in rows:
        baselines = {
            reference: by_key.get((reference, row["length"], row["text"]))
            for reference in ("no_speculation", "draft_model")
        }
        for reference, baseline in baselines.items():
            if baseline:
                row[f"vs_{reference}"] = row["decode_tokens_per_s"] / baseline["decode_tokens_per_s"]
        if all(baselines.values()):
            fastest = max(b["decode_tokens_per_s"] for b in baselines.values() if b)
            row["vs_faster_alternative"] = row["decode_tokens_per_s"] / fastest
    return rows


def median_or_none(values: list[float | None]) -> float | None:
    """The median of the values given (runs saved before a figure existed give None).

    >>> median_or_none([3.0, None, 1.0, 2.0]), median_or_none([None])
    (2.0, None)
    """
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def mean_breakdown(breakdowns: list[dict[str, Any]]) -> dict[str, float]:
    breakdowns = [b for b in breakdowns if b]
    if not breakdowns:
        return {}
    keys = [k for k in breakdowns[0] if k != "steps"]
    return {k: sum(b.get(k, 0.0) for b in breakdowns) / len(breakdowns) for k in keys}


# --- needle ------------------------------------------------------------------------------


def run_needle(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    from tqdm import tqdm

    from benchmarks.assets import long_texts
    from specextend_vllm import reconfigure

    haystack = long_texts()[HAYSTACK]
    config = engine_configs(draft, args)["specextend"]
    llm = engine.make_llm(target, config, max(args.lengths) + args.max_tokens + 64, block_size=args.block_size)
    reconfigure(llm, token_budget=args.budget, activation_length=args.activation_length)
    trials = []
    cases = [(length, depth) for length in args.lengths for depth in args.depths]
    with tqdm(total=len(cases) * len(POLICIES), desc="needle") as progress:
        for seed, (length, depth) in enumerate(cases):
            prompt = needle_prompt(tokenizer, haystack, length, depth, seed)
            llm.reset_prefix_cache()
            for policy in POLICIES:
                reconfigure(llm, policy=policy)
                [request], _ = engine.generate(llm, [prompt.token_ids], args.max_tokens)
                trials.append(needle_trial(tokenizer, prompt, policy, length, request))
                progress.update()
    engine.close(llm)
    return {"trials": trials, "table": needle_table(trials)}


def needle_trial(tokenizer: Any, prompt: Any, policy: str, length: int, request: engine.RequestFigures) -> dict[str, Any]:
    """Counts the needle's tokens in the target's answer by where they came from; tokens of
    the first verify step are left out (that draft ran right after prefill, on the full cache)."""
    span = needle_token_span(tokenizer, request.tokens, prompt.value)
    origins = draft_origin_of_tokens(request.accepted_per_step, request.drafted_per_step, len(request.tokens))
    first_step_end = 1 + (request.accepted_per_step[0] + 1 if request.accepted_per_step else 0)
    counted = [origins[i] for i in (span or []) if i >= first_step_end and i < len(origins)]
    hits = counted.count("accepted")
    misses = counted.count("corrected")
    return {
        "policy": policy,
        "length": length,
        "depth": prompt.depth,
        "needle_position": prompt.needle_position,
        "value": prompt.value,
        "target_answered": span is not None,
        "draft_hits": hits,
        "draft_misses": misses,
        "text": tokenizer.decode(request.tokens),
    }


def needle_table(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for policy in POLICIES:
        for length in dict.fromkeys(t["length"] for t in trials):
            group = [t for t in trials if t["policy"] == policy and t["length"] == length and t["target_answered"]]
            hits = sum(t["draft_hits"] for t in group)
            proposed = hits + sum(t["draft_misses"] for t in group)
            rows.append(
                {
                    "policy": policy,
                    "length": length,
                    "trials": len(group),
                    "needle_tokens_drafted": hits / proposed if proposed else None,
                    "trials_fully_drafted": sum(t["draft_misses"] == 0 and t["draft_hits"] > 0 for t in group) / len(group)
                    if group
                    else None,
                }
            )
    return rows


# --- batch -------------------------------------------------------------------------------


def run_batch(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    from tqdm import tqdm

    from benchmarks.assets import long_texts

    texts = long_texts()
    names = (BATCH_TEXTS * args.batch_size)[: args.batch_size]
    prompts = [summary_prompt(tokenizer, texts[name], args.length) for name in names]
    configs = engine_configs(draft, args)
    rows = []
    baseline: list[list[int]] | None = None
    for engine_name in tqdm(configs, desc="batch"):
        llm = engine.make_llm(
            target, configs[engine_name], args.length + args.max_tokens + 64, block_size=args.block_size
        )
        prefill, prefill_s = engine.generate(llm, prompts, 1)
        step_records(llm)
        requests, decode_s = engine.generate(llm, prompts, args.max_tokens)
        breakdown = engine.time_breakdown(step_records(llm), args.batch_size * (args.k + 1), decode_s)
        tokens = [r.tokens for r in requests]
        baseline = tokens if baseline is None else baseline
        rows.append(
            {
                "method": engine_name if engine_name != "specextend" else "specextend_cmr",
                "batch_size": args.batch_size,
                "length": args.length,
                "prefill_s": prefill_s,
                "decode_s": decode_s,
                "decode_tokens_per_s": sum(len(t) for t in tokens) / decode_s,
                "end_to_end_tokens_per_s": sum(len(t) for t in tokens) / (prefill_s + decode_s),
                "mean_acceptance_length": engine.mean_acceptance_length(requests),
                "same_output_as_no_speculation": tokens == baseline,
                "time_per_step": breakdown,
                "retrieval": engine.retrieval_counters(llm) if engine_name == "specextend" else None,
            }
        )
        engine.close(llm)
        del llm
    for row in rows:
        for reference in ("no_speculation", "draft_model"):
            ref = next(r for r in rows if r["method"] == reference)
            row[f"decode_vs_{reference}"] = row["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
    return {"table": rows}


# --- draft step ----------------------------------------------------------------------------


def run_draft_step(args: argparse.Namespace, draft: Path, target: Path, tokenizer: Any) -> dict[str, Any]:
    """The draft model alone, decoding after prompts of each length: the time of one draft
    pass attending to that many tokens. A pass over a `token_budget` of 1K reads about as
    many tokens as the 1K row, whatever the context."""
    from tqdm import tqdm

    text = named_texts(args.texts[:1])[args.texts[0]]
    llm = engine.make_llm(draft, None, max(args.lengths) + args.max_tokens + 64, block_size=args.block_size)
    rows = []
    for length in tqdm(args.lengths, desc="draft step"):
        step_records(llm)
        [request], _ = engine.generate(llm, [summary_prompt(tokenizer, text, length)], args.max_tokens)
        records = [r for r in step_records(llm) if r["num_target_tokens"] == 1]
        rows.append(
            {
                "attended_tokens": length,
                "draft_pass_s": sum(r["target_forward_s"] for r in records) / len(records),
                "decode_step_s": request.decode_s / (len(request.tokens) - 1),
            }
        )
    engine.close(llm)
    return {"table": rows}


# --- main --------------------------------------------------------------------------------


SECTIONS = {
    "speed": run_speed,
    "tiny_draft": run_tiny_draft,
    "needle": run_needle,
    "batch": run_batch,
    "draft_step": run_draft_step,
    "verification": run_verification,
    "trees": run_trees,
}
ENGINES = ("no_speculation", "draft_model", "specextend")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("section", choices=[*SECTIONS, "plot"])
    parser.add_argument("--target", type=Path, help="model folder or Hugging Face id (default: Qwen2.5-Coder 1.5B)")
    parser.add_argument("--draft", type=Path, help="model folder or Hugging Face id (default: Qwen2.5-Coder 0.5B)")
    parser.add_argument(
        "--draft-precision",
        choices=("fp32", "int8"),
        default="fp32",
        help="the default Qwen draft as it is, or quantized to int8 (the cheap draft)",
    )
    parser.add_argument("-k", type=int, help="num_speculative_tokens (default: 3 for tiny_draft, else 4)")
    parser.add_argument(
        "--methods", nargs="+", choices=ENGINES, default=list(ENGINES), help="speed, tiny_draft: engines to run"
    )
    parser.add_argument("--block-size", type=int, help="KV cache block size (vLLM's default if not given)")
    parser.add_argument("--output", help="results file name without .json (default: long_inputs_SECTION)")
    parser.add_argument(
        "--specextend-keys", type=json.loads, default={}, help="extra keys of the specextend config, as JSON"
    )
    parser.add_argument(
        "--specextend-engines",
        type=json.loads,
        default={},
        help='speed: more specextend engines, each its own, as JSON {"NAME": {keys}}: specextend_NAME '
        "runs specextend's keys with these changed",
    )
    parser.add_argument("--lengths", type=int, nargs="+", help="prompt lengths in tokens")
    parser.add_argument("--max-tokens", type=int, help="new tokens per request")
    parser.add_argument("--texts", nargs="+", default=list(SPEED_TEXTS), help="speed, draft_step: texts, by name (code/MODULE: a module of the standard library)")
    parser.add_argument(
        "--genres", nargs="+", choices=list(GENRES), help="speed: prompt with these genres' texts instead of --texts"
    )
    parser.add_argument(
        "--policies", nargs="+", choices=POLICIES, default=list(POLICIES), help="speed: the specextend policies to run"
    )
    parser.add_argument(
        "--at-defaults",
        action="store_true",
        help="speed: specextend at its default keys (with --specextend-keys), never reconfigured",
    )
    parser.add_argument("--texts-per-length", type=int, default=2, help="speed, tiny_draft: prompts per length")
    parser.add_argument(
        "--skip-texts", type=int, default=0, help="speed with --genres: leave out each genre's first N texts"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="speed, tiny_draft, verification: decode each prompt this many times per method "
        "(the prefix cache keeps its prefill); tables give the spread of decode tokens/s",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="speed, trees, tiny_draft: vLLM's default compiled mode (torch.compile) instead of eager",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="speed, tiny_draft: add these runs to the saved ones (more texts, lengths or methods)",
    )
    parser.add_argument(
        "--tree-settings",
        nargs="+",
        help="trees: settings to run besides no speculation (chain, tree8, tree16, dynamic8, "
        "dynamic16; default all)",
    )
    parser.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9], help="needle")
    parser.add_argument("--budget", type=int, default=256, help="needle: token_budget")
    parser.add_argument("--activation-length", type=int, default=512, help="needle: activation_length")
    parser.add_argument("--batch-size", type=int, default=8, help="batch")
    parser.add_argument("--length", type=int, default=2048, help="batch: prompt length")
    args = parser.parse_args()
    defaults = {
        "speed": ([1024, 2048, 4096, 8192], 64),
        "tiny_draft": ([1024, 4096, 8192, 12288, 16384], 64),
        "needle": ([1024, 2048, 4096], 32),
        "batch": (None, 64),
        "draft_step": ([1024, 4096, 16384], 16),
        "verification": ([4096, 8192, 16384], 32),
        "trees": ([4096, 8192], 64),
        "plot": (None, None),
    }[args.section]
    args.lengths = args.lengths or defaults[0]
    args.max_tokens = args.max_tokens or defaults[1]
    args.k = args.k or (3 if args.section == "tiny_draft" else 4)
    return args


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import int8_draft, qwen_pair, tiny_draft
    from benchmarks.plots import plot_speed

    args = parse_args()
    if args.section == "plot":
        for path in plot_speed(results_path(args)):
            print(f"saved {path}")
        return
    if args.draft and args.target:
        draft, target = args.draft, args.target
    else:
        default_draft, default_target = qwen_pair()
        if args.section == "tiny_draft":
            default_draft = tiny_draft()
        elif args.draft_precision == "int8":
            default_draft = int8_draft()
        draft, target = args.draft or default_draft, args.target or default_target
    tokenizer = AutoTokenizer.from_pretrained(target)
    results = SECTIONS[args.section](args, draft, target, tokenizer)
    record = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | {"target": str(target), "draft": str(draft)},
        "machine": engine.machine(),
        **results,
    }
    engine.RESULTS.mkdir(exist_ok=True)
    path = results_path(args)
    path.write_text(json.dumps(record, indent=1))
    print_table(results["table"])
    if results.get("cells"):
        print_table(results["cells"])
    print(f"saved {path}")
    if args.section in ("speed", "tiny_draft", "verification", "trees"):
        for png in plot_speed(path):
            print(f"saved {png}")


def print_table(rows: list[dict[str, Any]]) -> None:
    columns = [k for k, v in rows[0].items() if not isinstance(v, (dict, list)) and v is not None or k == "mean_acceptance_length"]
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(f"{row.get(c):.3g}" if isinstance(row.get(c), float) else str(row.get(c)) for c in columns))


if __name__ == "__main__":
    main()
