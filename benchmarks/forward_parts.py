"""Where the target's forward spends its time: a plain one-token step against a verification
of k + 1 tokens, part by part, and the draft's prefill against the target's.

    python -m benchmarks.forward_parts                       # 3K and 8K; about 10 min here
    python -m benchmarks.forward_parts --lengths 8192 --repeats 5

One in-process `specextend` engine at its defaults (int8 draft, `-k` drafts), eager
(torch.compile traces the model's parts into one graph, where a forward hook no longer times
each part). Forward hooks on every decoder layer's parts (QKV, rotary, attention, output
projection, the two norms, gate-up, activation, down) and on the LM head take each call's
wall time, grouped by the tokens in the pass. Per length (each from its own stretch of the
text, so each prompt prefills in full): the prefill and a first decode drafting k tokens
every step (the draft writes its KV of the prompt with the prefill), then `--repeats`
rounds of two decodes of `--max-tokens` greedy tokens, in turns (A B, B A, ...) so that a
slower stretch of the machine falls on both alike: `plain`, no drafts with vLLM's decode
attention (the forward no speculation runs), and `verifying`, k drafts every step
(`benchmarks.draft_length_modes`' modes), verified as the defaults choose. Reported per
forward, median of the rounds (min-max): each part's milliseconds in the plain one-token
forwards and in the verifying forwards of k + 1 tokens, and their ratio; and each part's
seconds in the target's prefill and in the draft's pass over the same prompt. Saved to
benchmarks/results/forward_parts.json.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from typing import Any

from benchmarks import assets, engine
from benchmarks.draft_cost import DEFAULT_TEXT, summary
from benchmarks.prompts import summary_prompt

# Each decoder layer's parts; the rotary embedding is one module shared by every layer.
LAYER_PARTS = (
    ("qkv", "self_attn.qkv_proj"),
    ("attention", "self_attn.attn"),
    ("o", "self_attn.o_proj"),
    ("norms", "input_layernorm"),
    ("norms", "post_attention_layernorm"),
    ("gate_up", "mlp.gate_up_proj"),
    ("activation", "mlp.act_fn"),
    ("down", "mlp.down_proj"),
)
CHARACTERS_PER_TOKEN = 6
# (model, part, tokens in the pass, seconds, calls)
Rows = list[tuple[str, str, int, float, int]]
PARTS = (
    "qkv", "rotary", "attention", "o", "norms", "gate_up", "activation", "down", "lm_head", "layers"
)


class PartClock:
    """Wall time per (model, part, tokens in the pass), summed until read."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.calls: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.started: dict[int, tuple[float, int]] = {}

    def attach(self, module: Any, model: str, part: str) -> None:
        def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            tokens = next(a for a in (*args, *kwargs.values()) if hasattr(a, "shape")).shape[0]
            self.started[id(module)] = (time.perf_counter(), tokens)

        def after(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            start, tokens = self.started.pop(id(module))
            self.seconds[(model, part, tokens)] += time.perf_counter() - start
            self.calls[(model, part, tokens)] += 1

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after, with_kwargs=True)

    def read(self) -> Rows:
        rows = [(*key, seconds, self.calls[key]) for key, seconds in self.seconds.items()]
        self.seconds.clear()
        self.calls.clear()
        return rows


def install(worker: Any) -> None:
    """Hooks the target's and the draft's parts."""
    runner = worker.model_runner
    clock = worker.forward_parts_clock = PartClock()
    for name, model in (("target", runner.model), ("draft", runner.drafter.model)):
        clock.attach(model.logits_processor, name, "lm_head")
        clock.attach(model.model.layers[0].get_submodule("self_attn.rotary_emb"), name, "rotary")
        for layer in model.model.layers:
            clock.attach(layer, name, "layers")
            for part, path in LAYER_PARTS:
                clock.attach(layer.get_submodule(path), name, part)


def read(worker: Any) -> Rows:
    return worker.forward_parts_clock.read()


def decode_figures(rows: Rows, model: str, tokens: int, num_layers: int) -> dict[str, float]:
    """Per part, milliseconds per forward of `tokens` tokens in `rows`."""
    seconds = {part: s for m, part, n, s, _ in rows if (m, n) == (model, tokens)}
    layer_calls = sum(c for m, part, n, _, c in rows if (m, part, n) == (model, "layers", tokens))
    forwards = layer_calls / num_layers
    return {part: 1000 * seconds.get(part, 0.0) / forwards for part in PARTS} if forwards else {}


def prefill_figures(rows: Rows, model: str) -> dict[str, float]:
    """Per part, seconds over the prompt's passes (every pass of more than 64 tokens)."""
    totals: collections.Counter[str] = collections.Counter()
    for m, part, n, seconds, _ in rows:
        if m == model and n > engine.MAX_DECODE_STEP_TOKENS and part != "lm_head":
            totals[part] += seconds
    return {part: totals[part] for part in PARTS if part != "lm_head"}


def measure(llm: Any, prompt: list[int], args: Any) -> dict[str, Any]:
    """One prompt: its prefill's parts, then the rounds' plain and verifying forwards'."""
    from benchmarks.draft_length_modes import (
        draft_length_chooser,
        fixed_draft_length,
        held_choices,
    )

    chooser = draft_length_chooser(llm)
    num_layers = llm.llm_engine.vllm_config.model_config.hf_config.num_hidden_layers
    llm.collective_rpc(read)
    # Drafting from the prefill step on, so that the draft writes its KV of the prompt there.
    with fixed_draft_length(chooser, args.k):
        [first], _ = engine.generate(llm, [prompt], args.max_tokens)
    prefill_rows = llm.collective_rpc(read)[0]
    modes = {"plain": (0, 1), "verifying": (args.k, args.k + 1)}
    forwards: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    same_output = True
    for round_index in range(args.repeats):
        for mode in list(modes) if round_index % 2 == 0 else list(reversed(modes)):
            num_drafts, tokens = modes[mode]
            with fixed_draft_length(chooser, num_drafts), held_choices(
                llm, ("vllm_decode_attention",) if mode == "plain" else ()
            ):
                [request], _ = engine.generate(llm, [prompt], args.max_tokens)
            same_output &= request.tokens == first.tokens
            rows = llm.collective_rpc(read)[0]
            forwards[mode].append(decode_figures(rows, "target", tokens, num_layers))
    return {
        "same_output": same_output,
        "forward_tokens": {mode: tokens for mode, (_, tokens) in modes.items()},
        "forward_ms": {
            mode: {part: summary([f[part] for f in rounds]) for part in PARTS}
            for mode, rounds in forwards.items()
        },
        "prefill_s": {model: prefill_figures(prefill_rows, model) for model in ("target", "draft")},
    }


def print_table(length: int, figures: dict[str, Any]) -> None:
    plain, verifying = figures["forward_ms"]["plain"], figures["forward_ms"]["verifying"]
    tokens = figures["forward_tokens"]["verifying"]
    target_prefill, draft_prefill = figures["prefill_s"]["target"], figures["prefill_s"]["draft"]
    print(
        f"\n{length} tokens | part | plain 1-token forward ms | verifying {tokens}-token forward ms"
        " | ratio | target prefill s | draft prefill s |"
    )
    print("|---" * 7 + "|")
    for part in PARTS:
        one, many = plain[part], verifying[part]
        ratio = many["median"] / one["median"] if one["median"] else float("nan")
        prefill = "- | -"
        if part in target_prefill:
            prefill = f"{target_prefill[part]:.2f} | {draft_prefill[part]:.2f}"
        print(
            f"| {part} | {one['median']:.2f} ({one['min']:.2f}-{one['max']:.2f}) "
            f"| {many['median']:.2f} ({many['min']:.2f}-{many['max']:.2f}) | {ratio:.2f} "
            f"| {prefill} |"
        )


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[3072, 8192])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument(
        "--text", default=DEFAULT_TEXT, help="a name from benchmarks.assets.long_texts()"
    )
    parser.add_argument("--output", default="forward_parts")
    args = parser.parse_args()
    _, target = assets.qwen_pair()
    args.models = (target, assets.int8_draft())
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = assets.long_texts()[args.text]
    # Each length from its own stretch of the text: no prompt reuses another's cached blocks,
    # so each prefills in full (its repeats then reuse its own).
    prompts, offset = {}, 0
    for length in sorted(args.lengths):
        prompts[length] = summary_prompt(tokenizer, text[offset:], length)
        offset += CHARACTERS_PER_TOKEN * length
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the chooser is read in process
    config = {
        "method": "specextend", "model": str(args.models[1]), "num_speculative_tokens": args.k
    }
    llm = engine.make_llm(target, config, max(prompts) + args.max_tokens + 64)
    results: dict[str, Any] = {}
    try:
        llm.collective_rpc(install)
        for length, prompt in prompts.items():
            print(f"{time.strftime('%H:%M:%S')} {length} tokens", flush=True)
            results[str(length)] = measure(llm, prompt, args)
            print_table(length, results[str(length)])
    finally:
        engine.close(llm)
    args.models = [str(model) for model in args.models]
    print(f"saved {engine.save_record(args.output, args, results)}")


if __name__ == "__main__":
    main()
