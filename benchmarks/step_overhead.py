"""What speculative decoding's machinery adds to a step that drafts nothing.

A step without drafts (`drafting: auto` chose none, or a batch size whose schedule gives
none) runs neither the draft nor verification, but it still passes through vLLM's
speculative-decoding path and the plugin's seams (the proposer's call, the scheduler's
patches, the final layer's query capture, the decode-attention chooser). That cost does not
grow with the model's width, so it is measured where the model costs almost nothing: a tiny
random Qwen2 target (the engine tests' own, `tests/tiny_models.py`) with the real target's 28
layers (the seams run once per layer), 4 prompts of about 700 tokens
decoding together, the speculative engines drafting 0 tokens at every batch size
(`num_speculative_tokens_per_batch_size`), the target drafting for itself. Each round starts
one engine per mode, in a process of its own (vLLM keeps one engine's state per process),
the modes' order reversed every other round; each engine decodes the prompts `--repeats`
times after a warm-up.

    python -m benchmarks.step_overhead [--rounds 3] [--repeats 5] [--tokens 200]

Prints milliseconds per decoding step (medians over every repeat of every round, with
their range) and each speculative mode's excess over no speculation; saves
benchmarks/results/step_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import engine

PROMPT_LENGTHS = (700, 710, 720, 730)
# Qwen2.5-Coder 1.5B's.
NUM_LAYERS = 28
NO_DRAFTS = [[1, 16, 0]]
MODES = ("no_speculation", "specextend", "draft_model")
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def speculative_config(mode: str, target: Path) -> dict[str, Any] | None:
    if mode == "no_speculation":
        return None
    return {
        "method": mode,
        "model": str(target),
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": NO_DRAFTS,
    }


def step_milliseconds(mode: str, target: Path, repeats: int, tokens: int) -> list[float]:
    """In this process: one engine of `mode`, the prompts decoded `repeats` times; the
    milliseconds per step of each (every request decodes one token a step)."""
    import torch
    from vllm import SamplingParams

    generator = torch.Generator().manual_seed(5)
    prompts = [
        {"prompt_token_ids": torch.randint(2, 500, (n,), generator=generator).tolist()}
        for n in PROMPT_LENGTHS
    ]
    llm = engine.make_llm(
        target,
        speculative_config(mode, target),
        max_model_len=1024,
        skip_tokenizer_init=True,
        max_num_seqs=16,
        per_request_spec_decode_metrics="none",
    )

    def decode(max_tokens: int) -> float:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    decode(8)
    return [1000 * decode(tokens) / tokens for _ in range(repeats)]


def run_mode(mode: str, target: Path, args: argparse.Namespace) -> list[float]:
    command = [
        sys.executable, "-m", "benchmarks.step_overhead", "--one", mode, "--target", str(target),
        "--repeats", str(args.repeats), "--tokens", str(args.tokens),
    ]
    completed = subprocess.run(
        command, env={**os.environ, **ENGINE_ENV}, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=200, help="new tokens per request")
    parser.add_argument("--output", default="step_overhead")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(step_milliseconds(args.one, args.target, args.repeats, args.tokens)))
        return

    from tests.tiny_models import save_tiny_model

    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as work:
        target = save_tiny_model(Path(work) / "target", seed=0, num_layers=NUM_LAYERS)
        for round_index in range(args.rounds):
            for mode in MODES if round_index % 2 == 0 else reversed(MODES):
                steps[mode] += run_mode(mode, target, args)
                print(f"round {round_index + 1}, {mode}: {steps[mode][-args.repeats:]}")
    base = statistics.median(steps["no_speculation"])
    results = {
        mode: {
            "ms_per_step": values,
            "median": statistics.median(values),
            "excess_ms": statistics.median(values) - base,
        }
        for mode, values in steps.items()
    }
    print("| mode | ms per step, median (min-max) | excess over no speculation, ms |")
    print("|---|---|---|")
    for mode, figures in results.items():
        values = figures["ms_per_step"]
        print(
            f"| {mode} | {figures['median']:.2f} ({min(values):.2f}-{max(values):.2f}) "
            f"| {figures['excess_ms']:+.2f} |"
        )
    print(f"saved {engine.save_record(args.output, args, results)}")


if __name__ == "__main__":
    main()
