"""The main job: one long prompt through the real Qwen2.5-Coder pair, offline.

Runs no speculation, vLLM's `draft_model` and `specextend` (at its defaults, with the
draft's prefill deferred past the first token, drafting on the reduced cache at every step
(`retrieval: always`, the default before `auto`), drafting every step, and drafting every
step with the draft's vocabulary cut to its 32K most frequent tokens or with its LM head as
vLLM loaded it) on the same prompt and prints output equality, mean acceptance length and decode
speed (median of `--repeats` decodes of the prompt, after its prefill, with the spread);
saves the figures as JSON. The draft is the Qwen2.5-Coder 0.5B in the precision that costs
less per token on this machine (`--draft-precision auto`: int8, unless the CPU has no int8
dot-product instructions, where int8 costs more than fp32); a last row runs the other
precision for comparison.
c is what a drafted token costs next to a target step, from the step timings: the steps'
whole proposals (the draft's passes, its LM head, retrieval) over the tokens they drafted,
over the target's forward in a step without speculation.

    python -m benchmarks.demo [--prompt-tokens 3000] [--max-tokens 64] [--repeats 3]
        [--compiled] [--methods specextend,specextend_deferred_prefill] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from benchmarks import engine  # noqa: E402


def long_prompt(target: Path, num_tokens: int) -> list[int]:
    from transformers import AutoTokenizer

    from benchmarks.assets import long_texts
    from benchmarks.prompts import summary_prompt

    tokenizer = AutoTokenizer.from_pretrained(target)
    return summary_prompt(tokenizer, long_texts()["shakespeare/hamlet"], num_tokens)


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def run_method(
    name: str,
    target: Path,
    speculative_config: dict[str, Any] | None,
    prompt: list[int],
    max_tokens: int,
    repeats: int,
    compiled: bool,
) -> dict[str, Any]:
    from vllm import SamplingParams

    progress(f"{name}: starting the engine")
    llm = engine.make_llm(
        target, speculative_config, len(prompt) + max_tokens + 64, enforce_eager=not compiled
    )
    request = [{"prompt_token_ids": prompt}]
    progress(f"{name}: prefill of {len(prompt)} tokens")
    start = time.perf_counter()
    llm.generate(request, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    prefill_s = time.perf_counter() - start
    from specextend_vllm import step_timings

    step_timings(llm)
    before = spec_counts(llm)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    decode_s = []
    for repeat in range(repeats):
        progress(f"{name}: decoding {max_tokens} tokens ({repeat + 1} of {repeats})")
        start = time.perf_counter()
        output = llm.generate(request, params, use_tqdm=False)
        decode_s.append(time.perf_counter() - start)
    after = spec_counts(llm)
    tokens = list(output[0].outputs[0].token_ids)
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    draft_tokens = after.get("num_draft_tokens", 0) - before.get("num_draft_tokens", 0)
    speeds = [len(tokens) / seconds for seconds in decode_s]
    steps = engine.time_breakdown(step_timings(llm)[0], engine.MAX_DECODE_STEP_TOKENS, sum(decode_s))
    result = {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_tokens_per_s": statistics.median(speeds),
        "decode_tokens_per_s_min": min(speeds),
        "decode_tokens_per_s_max": max(speeds),
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "drafting_steps": drafts,
        "mean_drafts_per_step": draft_tokens / drafts if drafts else None,
        "steps": steps,
        "tokens": tokens,
        "text": output[0].outputs[0].text,
    }
    if speculative_config and speculative_config["method"] == "specextend":
        from specextend_vllm import retrieval_stats

        stats = retrieval_stats(llm)[0]
        stats.pop("selections")
        result["retrieval"] = stats
    engine.close(llm)
    progress(f"{name}: {result['decode_tokens_per_s']:.2f} decode tokens/s")
    return result


def draft_cost(result: dict[str, Any], target_step_s: float) -> float:
    """c: the proposals' time per drafted token (steps may draft fewer than k, or none)
    over the target's forward in a step without speculation."""
    steps = result["steps"]
    drafted = result["drafting_steps"] * result["mean_drafts_per_step"]
    return steps["propose_s"] * steps["steps"] / drafted / target_step_s


def spec_counts(llm: Any) -> dict[str, float]:
    return {
        m.name.removeprefix("vllm:spec_decode_"): m.value
        for m in llm.get_metrics()
        if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value")
    }


def main() -> None:
    from benchmarks.assets import cheap_draft_precision, draft_vocab, int8_draft, qwen_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--target", type=Path, help="model folder (default: the Qwen2.5-Coder 1.5B)")
    parser.add_argument("--draft", type=Path, help="model folder (default: the Qwen2.5-Coder 0.5B)")
    parser.add_argument(
        "--draft-precision",
        choices=("auto", "int8", "fp32"),
        default="auto",
        help="auto: int8 unless this CPU has no int8 dot-product instructions (VNNI, AMX)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="vLLM's default torch.compile (inductor) instead of eager mode, for every row",
    )
    parser.add_argument(
        "--methods", help="comma-separated rows to run (default: all); no_speculation always runs"
    )
    parser.add_argument("--output", type=Path, help="JSON path (default: results/demo.json)")
    args = parser.parse_args()
    fp32_draft, target = (args.draft, args.target) if args.draft and args.target else qwen_pair()
    if args.draft_precision == "auto":
        args.draft_precision = cheap_draft_precision()
    other_precision = "fp32" if args.draft_precision == "int8" else "int8"
    draft = int8_draft() if not args.draft and args.draft_precision == "int8" else fp32_draft
    prompt = long_prompt(target, args.prompt_tokens)
    k = args.num_speculative_tokens
    methods = {
        "no_speculation": None,
        "draft_model": {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k},
        "specextend": {"method": "specextend", "model": str(draft), "num_speculative_tokens": k},
        "specextend_deferred_prefill": {
            "method": "specextend", "model": str(draft), "num_speculative_tokens": k,
            "draft_prefill": "deferred",
        },
        "specextend_retrieval_always": {
            "method": "specextend", "model": str(draft), "num_speculative_tokens": k,
            "retrieval": "always",
        },
        "specextend_always": {
            "method": "specextend", "model": str(draft), "num_speculative_tokens": k, "drafting": "always"
        },
    }
    if not args.draft:
        # The same with the draft's vocabulary cut to its 32K most frequent tokens, with its
        # LM head as loaded (an int8 draft's is int8 by default on a CPU with int8 dot
        # products), and with the draft in the other precision, for comparison.
        methods["specextend_always_vocab32k"] = {
            **methods["specextend_always"], "draft_vocab": str(draft_vocab())
        }
        methods["specextend_always_head_as_loaded"] = {
            **methods["specextend_always"], "draft_lm_head": "as_loaded"
        }
        other_draft = fp32_draft if other_precision == "fp32" else int8_draft()
        methods[f"specextend_always_{other_precision}"] = {
            **methods["specextend_always"], "model": str(other_draft)
        }
    if args.methods:
        wanted = {"no_speculation", *args.methods.split(",")}
        unknown = sorted(wanted - set(methods))
        if unknown:
            parser.error(f"--methods: unknown {unknown}; choose from {sorted(methods)}")
        methods = {name: config for name, config in methods.items() if name in wanted}
    results = {
        name: run_method(name, target, config, prompt, args.max_tokens, args.repeats, args.compiled)
        for name, config in methods.items()
    }
    baseline = results["no_speculation"]
    print(f"\nprompt: {len(prompt)} tokens, {args.max_tokens} new tokens, greedy, k={k}, draft {draft.name}")
    print(
        f"{'method':<28}{'same output':>12}{'decode tok/s (min-max)':>24}{'vs none':>9}"
        f"{'acceptance':>12}{'proposal ms':>13}{'c':>7}{'target fwd ms':>15}{'prefill s':>11}"
    )
    target_step_s = baseline["steps"].get("target_forward_s")
    for name, result in results.items():
        acceptance = result["mean_acceptance_length"]
        speed = f"{result['decode_tokens_per_s']:.2f} ({result['decode_tokens_per_s_min']:.2f}-{result['decode_tokens_per_s_max']:.2f})"
        proposal_s = result["steps"].get("propose_s") or None
        cost = f"{draft_cost(result, target_step_s):.2f}" if proposal_s and target_step_s else "-"
        print(
            f"{name:<28}{str(result['tokens'] == baseline['tokens']):>12}{speed:>24}"
            f"{result['decode_tokens_per_s'] / baseline['decode_tokens_per_s']:>9.2f}"
            f"{acceptance if acceptance is None else round(acceptance, 2)!s:>12}"
            f"{proposal_s * 1000 if proposal_s else 0:>13.1f}{cost:>7}"
            f"{1000 * result['steps'].get('target_forward_s', 0.0):>15.0f}{result['prefill_s']:>11.1f}"
        )
    for name, result in results.items():
        if "retrieval" in result:
            print(f"{name} retrieval:", result["retrieval"])
    print("output:", baseline["text"][:300].replace("\n", " "))
    engine.RESULTS.mkdir(exist_ok=True)
    path = args.output or engine.RESULTS / "demo.json"
    record = {"args": vars(args) | {"target": str(target), "draft": str(draft)}, "machine": engine.machine(), "results": results}
    path.write_text(json.dumps(record, indent=1, default=str))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
