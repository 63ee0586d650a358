"""What the plugin's small-batch int8 kernel saves a decoding step, against vLLM's oneDNN
GEMM, inside one engine.

    python -m benchmarks.draft_int8_kernel                  # 8K, 4K, 1K; about 10 min here
    python -m benchmarks.draft_int8_kernel --lengths 4096 --repeats 5

One `specextend` engine (the int8 draft, k = 4, drafting every step on the reduced cache,
`draft_lm_head: int8`) decodes one text cut to each length (longest first, so the shorter
prompts' prefill comes from the prefix cache), `--max-tokens` greedy tokens per decode. The
draft's int8 layers and its int8 LM head are switched on the running engine between the
plugin's kernel (`ops.int8_linear` for up to 5 tokens, what the plugin installs on CPUs with
AVX-512 VNNI) and vLLM's oneDNN GEMM, alternating decode by decode (`--repeats` decodes of
each), so that a machine that speeds up or slows down during the run moves both alike. Per
length and kernel, medians (min-max) of the step timings: the draft's later passes (one
token per request each), its first pass, the whole proposal, the target's forward, and
decode tokens/s; outputs must be equal (the target decides them). Saved to
benchmarks/results/draft_int8_kernel.json.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the switch runs on the worker

from benchmarks import assets, engine  # noqa: E402
from benchmarks.draft_cost import DEFAULT_TEXT, summary  # noqa: E402
from benchmarks.method_cost import PER_STEP_FIELDS, decode_once, ms  # noqa: E402
from benchmarks.prompts import summary_prompt  # noqa: E402

KERNELS = ("plugin", "onednn")


def use_kernel(worker: Any, kernel: str) -> int:
    """Runs the draft's int8 layers and int8 LM head on `kernel`; returns how many layers
    were switched (0 where the plugin's kernel was not installed: nothing to compare)."""
    from specextend_vllm.vllm_access.cpu_int8 import SmallBatchInt8Linear
    from specextend_vllm.vllm_access.layers import Int8RowsLogits

    model = worker.model_runner.drafter.model
    switched = 0
    for module in model.modules():
        int8_kernel = getattr(getattr(module, "scheme", None), "kernel", None)
        installed = getattr(int8_kernel, "linear_method", None)
        if isinstance(getattr(installed, "__self__", None), SmallBatchInt8Linear):
            int8_kernel.plugin_linear_method = installed
        if not hasattr(int8_kernel, "plugin_linear_method"):
            continue
        int8_kernel.linear_method = (
            int8_kernel.plugin_linear_method if kernel == "plugin" else int8_kernel._apply_weights_onednn
        )
        switched += 1
    logits = model.compute_logits
    if isinstance(logits, Int8RowsLogits):
        if not hasattr(logits, "plugin_small_batches"):
            logits.plugin_small_batches = logits._small_batches
        logits._small_batches = logits.plugin_small_batches if kernel == "plugin" else None
    return switched


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 4096, 1024])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--text", default=DEFAULT_TEXT, help="a name from benchmarks.assets.long_texts()")
    parser.add_argument("--output", default="draft_int8_kernel")
    args = parser.parse_args()
    _, target = assets.qwen_pair()
    draft = assets.int8_draft()
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = assets.long_texts()[args.text]
    lengths = sorted(args.lengths, reverse=True)
    llm = engine.make_llm(target, engine.specextend_every_step(draft, args.k), max(lengths) + args.max_tokens + 64)
    results: dict[str, dict[str, Any]] = {}
    try:
        if min(llm.collective_rpc(use_kernel, args=("plugin",))) == 0:
            raise SystemExit("the plugin's int8 kernel is not installed on this CPU (no AVX-512 VNNI)")
        for length in lengths:
            prompt = summary_prompt(tokenizer, text, length)
            started = time.perf_counter()
            engine.generate(llm, [prompt], args.max_tokens)
            print(f"{length}: prefill and a first decode {time.perf_counter() - started:.0f} s", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {kernel: [] for kernel in KERNELS}
            for _ in range(args.repeats):
                for kernel in KERNELS:
                    llm.collective_rpc(use_kernel, args=(kernel,))
                    runs[kernel].append(decode_once(llm, prompt, args.max_tokens))
            outputs = {tuple(run.pop("tokens")) for kernel_runs in runs.values() for run in kernel_runs}
            results[str(length)] = {
                "same_output": len(outputs) == 1,
                **{
                    kernel: {
                        field: summary([run[field] for run in kernel_runs])
                        for field in (*PER_STEP_FIELDS, "tokens_per_s", "mean_acceptance_length")
                    }
                    for kernel, kernel_runs in runs.items()
                },
            }
            plugin, onednn = (results[str(length)][kernel] for kernel in KERNELS)
            print(
                f"  later draft pass {1000 * plugin['later_draft_pass_s']['median']:.1f} ms (plugin) against "
                f"{1000 * onednn['later_draft_pass_s']['median']:.1f} (oneDNN); tokens/s "
                f"{plugin['tokens_per_s']['median']:.2f} against {onednn['tokens_per_s']['median']:.2f}",
                flush=True,
            )
    finally:
        llm.collective_rpc(use_kernel, args=("plugin",))
        engine.close(llm)
    print_table(results)
    print(f"saved {engine.save_record(args.output, args, results)}")


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(
        "\n| context | kernel | later draft pass ms | first draft pass ms | proposal ms | target forward ms"
        " | decode tokens/s | mean acceptance length | same output |"
    )
    print("|---" * 9 + "|")
    for length, by_kernel in results.items():
        for kernel in KERNELS:
            figures = by_kernel[kernel]
            tokens_per_s = figures["tokens_per_s"]
            print(
                f"| {int(length) // 1024}K | {kernel} | {ms(figures, 'later_draft_pass_s')} "
                f"| {ms(figures, 'first_draft_pass_s')} | {ms(figures, 'propose_s')} "
                f"| {ms(figures, 'target_forward_s')} | {tokens_per_s['median']:.2f} "
                f"({tokens_per_s['min']:.2f}-{tokens_per_s['max']:.2f}) "
                f"| {figures['mean_acceptance_length']['median']:.2f} | {by_kernel['same_output']} |"
            )


if __name__ == "__main__":
    main()
