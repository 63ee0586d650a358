"""What a decoding step's forwards cost on a GPU, at the real pair's shapes, and so whether
drafts and token trees pay there. A stand-in for vLLM's engine, which the GPU machines lent
here cannot install (no vLLM there, and its wheel is too large to carry): plain torch
decoders, no plugin code on the hot path but the merge of attention states.

The target has Qwen2.5-Coder-1.5B's shapes, the draft Qwen2.5-0.5B's (and the draft again
with the 32K-token vocabulary of `draft_vocab`), random bf16 weights (a forward's time does
not depend on their values): RMSNorm, rotary positions, grouped-query attention over a KV
cache of `context` tokens per request, SwiGLU, the LM head over every new token. A forward
of q new tokens per request attends as hybrid verification does: to the cache through
FlashAttention, which returns its log-sum-exp, the q new tokens among themselves under a
mask (a chain's causal mask; a tree's ancestor mask costs the same), the two merged by their
log-sum-exps (`ops.merge_attention_states_reference`, vLLM's `merge_attn_states` semantics).
Each forward is captured in a CUDA graph, as vLLM captures its decoding steps, and replayed;
a time is the median of repeats, with their range. Eager, a layer runs some 40 kernels
(each norm, rotary step, reshape and the merge apart); with `--compile` torch.compile fuses
them into fewer, nearer vLLM's fused kernels, and each shape compiles once (minutes: run it
on few contexts and batch sizes). Before timing, one layer's hybrid attention is checked
against one masked attention over the cache and the new tokens.

From the times, per context and batch size: c, a draft token's cost against a plain target
step, with the draft over the method's reduced cache (`token_budget` 1024 plus the newest
64 tokens) and over the whole cache (`draft_model`); a chain step of k = 4 (4 draft passes
of one token, then verifying 5); a 16-node tree's step (4 draft passes over 4 nodes, then
verifying 17); and the acceptance a tree needs, against the chain's, to decode 1.15x as fast.

    python -m benchmarks.gpu_step_cost --output benchmarks/results/gpu_step_cost.json
    python -m benchmarks.gpu_step_cost --compile --contexts 8192 --batches 1 \
        --output benchmarks/results/gpu_step_cost_compiled.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from specextend_vllm.ops.merge_attention_states import merge_attention_states_reference

CHAIN_DRAFTS = 4
TREE_NODES = 16
TREE_DEPTH = 4
TREE_AIM = 1.15
REDUCED_DRAFT_CONTEXT = 1024 + 64
# bf16 inputs and outputs, fp32 reference: the largest difference allowed before timing.
HYBRID_ATTENTION_TOLERANCE = 2e-2


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


TARGET = DecoderShape("target: Qwen2.5-Coder-1.5B", 28, 1536, 8960, 12, 2, 128, 151936)
DRAFT = DecoderShape("draft: Qwen2.5-0.5B", 24, 896, 4864, 14, 2, 64, 151936)
DRAFT_32K_VOCAB = dataclasses.replace(
    DRAFT, name="draft: Qwen2.5-0.5B, 32K vocabulary", vocab=32768
)


def attention_with_lse(
    query: torch.Tensor,  # [B, Hkv, M, D]
    key: torch.Tensor,  # [B, Hkv, N, D]
    value: torch.Tensor,  # [B, Hkv, N, D]
    scale: float,
    mask: torch.Tensor | None = None,  # [M, N] bool, True: attends
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its log-sum-exp ([B, Hkv, M, D], [B, Hkv, M] fp32): unmasked on a GPU
    through FlashAttention (torch's), which returns it; otherwise in fp32 math."""
    if mask is None and query.is_cuda:
        output, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, False, False, scale=scale
        )
        return output, lse
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), value.float()).to(query.dtype), lse


def hybrid_attention(
    query: torch.Tensor,  # [B, q, H, D]
    key: torch.Tensor,  # [B, q, Hkv, D], the new tokens'
    value: torch.Tensor,  # [B, q, Hkv, D]
    key_cache: torch.Tensor,  # [B, Hkv, context, D]
    value_cache: torch.Tensor,  # [B, Hkv, context, D]
    new_token_mask: torch.Tensor,  # [q, q] bool
    scale: float,
) -> torch.Tensor:  # [B, q, H, D]
    """The new tokens' attention to the cache and among themselves, merged. Grouped-query
    heads fold into the query rows: [B, Hkv, G q, D], row g q + t for query head g of
    token t, so that the cache part runs as one unmasked attention per KV head."""
    batch, new_tokens, heads, head_dim = query.shape
    kv_heads = key.shape[2]
    group = heads // kv_heads
    folded = query.view(batch, new_tokens, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    folded = folded.reshape(batch, kv_heads, group * new_tokens, head_dim)
    prefix_out, prefix_lse = attention_with_lse(folded, key_cache, value_cache, scale)
    suffix_out, suffix_lse = attention_with_lse(
        folded, key.transpose(1, 2), value.transpose(1, 2), scale, new_token_mask.repeat(group, 1)
    )
    rows = batch * group * new_tokens

    def token_major(part: torch.Tensor) -> torch.Tensor:  # [B, Hkv, G q, D] -> [B G q, Hkv, D]
        return part.transpose(1, 2).reshape(rows, kv_heads, head_dim)

    def head_major(lse: torch.Tensor) -> torch.Tensor:  # [B, Hkv, G q] -> [Hkv, B G q]
        return lse.transpose(0, 1).reshape(kv_heads, rows)

    merged = torch.empty(rows, kv_heads, head_dim, dtype=torch.float32, device=query.device)
    merge_attention_states_reference(
        merged, token_major(prefix_out), head_major(prefix_lse),
        token_major(suffix_out), head_major(suffix_lse),
    )
    merged = merged.view(batch, group, new_tokens, kv_heads, head_dim).permute(0, 2, 3, 1, 4)
    return merged.reshape(batch, new_tokens, heads, head_dim).to(query.dtype)


class RandomDecoder:
    """A decoder of `shape` with random weights, forwarding q new tokens per request after a
    KV cache of `context` tokens each."""

    def __init__(
        self, shape: DecoderShape, device: torch.device, dtype: torch.dtype, compiled: bool
    ):
        self.shape = shape
        maybe_compile = (lambda f: torch.compile(f, dynamic=False)) if compiled else (lambda f: f)
        self.projections = maybe_compile(layer_projections)
        self.attention_and_mlp = maybe_compile(layer_attention_and_mlp)
        s = shape

        def weight(*size: int) -> torch.Tensor:
            return torch.empty(*size, device=device, dtype=dtype).normal_(std=0.02)

        self.embedding = weight(s.vocab, s.hidden)
        self.lm_head = weight(s.hidden, s.vocab)
        self.layers = [
            {
                "qkv": weight(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim),
                "qkv_bias": weight((s.heads + 2 * s.kv_heads) * s.head_dim),
                "out": weight(s.heads * s.head_dim, s.hidden),
                "gate_up": weight(s.hidden, 2 * s.intermediate),
                "down": weight(s.intermediate, s.hidden),
                "norms": torch.ones(2, s.hidden, device=device, dtype=dtype),
            }
            for _ in range(s.layers)
        ]
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.inv_frequency = 1.0 / (
            1_000_000.0 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim)
        )

    def new_cache(self, batch: int, context: int, new_tokens: int) -> list[torch.Tensor]:
        """Per layer, [2, B, Hkv, context + new_tokens, D]."""
        s = self.shape
        return [
            torch.empty(
                2, batch, s.kv_heads, context + new_tokens, s.head_dim,
                device=self.embedding.device, dtype=self.embedding.dtype,
            ).normal_()
            for _ in range(s.layers)
        ]

    def rotary(self, context: int, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(context, context + new_tokens, device=self.embedding.device)
        angles = torch.outer(positions.float(), self.inv_frequency)
        angles = torch.cat([angles, angles], dim=-1)[None, :, None, :]
        return angles.cos().to(self.embedding.dtype), angles.sin().to(self.embedding.dtype)

    def forward(
        self, tokens: torch.Tensor, caches: list[torch.Tensor], context: int,
        rotary: tuple[torch.Tensor, torch.Tensor], new_token_mask: torch.Tensor,
    ) -> torch.Tensor:
        """tokens [B, q] -> logits [B q, vocab]. Each layer writes the new tokens' K and V
        into its cache before attending, as vLLM's attention does, outside the compiled
        parts: compiled, a write into a slice of the cache copied the whole cache."""
        batch, new_tokens = tokens.shape
        hidden = self.embedding[tokens].flatten(0, 1)
        for weights, cache in zip(self.layers, caches):
            query, key, value = self.projections(
                self.shape, weights, hidden.view(batch, new_tokens, -1), *rotary
            )
            cache[0, :, :, context:].copy_(key.transpose(1, 2))
            cache[1, :, :, context:].copy_(value.transpose(1, 2))
            hidden = self.attention_and_mlp(
                self.shape, weights, hidden, query, key, value,
                cache[0, :, :, :context], cache[1, :, :, :context], new_token_mask,
            )
        return rms_norm(hidden, self.final_norm) @ self.lm_head


def layer_projections(
    s: DecoderShape,
    weights: dict[str, torch.Tensor],
    hidden: torch.Tensor,  # [B, q, hidden]
    rotary_cos: torch.Tensor,  # [1, q, 1, D]
    rotary_sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [B, q, H or Hkv, D]
    """A layer's query, key and value of the new tokens, positions rotated."""
    batch, new_tokens, _ = hidden.shape
    normed = rms_norm(hidden.flatten(0, 1), weights["norms"][0])
    qkv = torch.addmm(weights["qkv_bias"], normed, weights["qkv"])
    qkv = qkv.view(batch, new_tokens, s.heads + 2 * s.kv_heads, s.head_dim)
    query, key, value = qkv.split([s.heads, s.kv_heads, s.kv_heads], dim=2)
    return rotate(query, rotary_cos, rotary_sin), rotate(key, rotary_cos, rotary_sin), value


def layer_attention_and_mlp(
    s: DecoderShape,
    weights: dict[str, torch.Tensor],
    hidden: torch.Tensor,  # [B q, hidden]
    query: torch.Tensor,  # [B, q, H, D]
    key: torch.Tensor,  # [B, q, Hkv, D]
    value: torch.Tensor,  # [B, q, Hkv, D]
    key_cache: torch.Tensor,  # [B, Hkv, context, D]
    value_cache: torch.Tensor,  # [B, Hkv, context, D]
    new_token_mask: torch.Tensor,  # [q, q] bool
) -> torch.Tensor:  # [B q, hidden]
    """The rest of the layer: attention (hybrid), its projection, the MLP, residuals."""
    attended = hybrid_attention(
        query, key, value, key_cache, value_cache, new_token_mask, 1.0 / math.sqrt(s.head_dim)
    )
    hidden = hidden + attended.flatten(0, 1).flatten(1) @ weights["out"]
    gate, up = (rms_norm(hidden, weights["norms"][1]) @ weights["gate_up"]).chunk(2, dim=-1)
    return hidden + (F.silu(gate) * up) @ weights["down"]


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    variance = hidden.float().pow(2).mean(-1, keepdim=True)
    return (hidden.float() * torch.rsqrt(variance + 1e-6)).to(hidden.dtype) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def hybrid_attention_error(
    device: torch.device, context: int = 4096, new_tokens: int = 17
) -> float:
    """The largest difference between hybrid attention (cache part on FlashAttention where
    on a GPU, new tokens under a random ancestor-like mask, merged) and one fp32 masked
    attention over cache and new tokens together, at the target's head shapes, bf16 inputs."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    s = TARGET

    def sample(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(device=device, dtype=torch.bfloat16)

    batch = 2
    query = sample(batch, new_tokens, s.heads, s.head_dim)
    key = sample(batch, new_tokens, s.kv_heads, s.head_dim)
    value = sample(batch, new_tokens, s.kv_heads, s.head_dim)
    key_cache = sample(batch, s.kv_heads, context, s.head_dim)
    value_cache = sample(batch, s.kv_heads, context, s.head_dim)
    mask = torch.rand(new_tokens, new_tokens, generator=generator) < 0.5
    mask = (mask.tril() | torch.eye(new_tokens, dtype=torch.bool)).to(device)
    scale = 1.0 / math.sqrt(s.head_dim)
    hybrid = hybrid_attention(query, key, value, key_cache, value_cache, mask, scale)
    group = s.heads // s.kv_heads
    full_key = torch.cat([key_cache, key.transpose(1, 2)], dim=2)
    full_value = torch.cat([value_cache, value.transpose(1, 2)], dim=2)
    full_key, full_value = (x.repeat_interleave(group, dim=1) for x in (full_key, full_value))
    cache_mask = torch.ones(new_tokens, context, dtype=torch.bool, device=device)
    full_mask = torch.cat([cache_mask, mask], dim=1)
    reference, _ = attention_with_lse(
        query.transpose(1, 2).float(), full_key.float(), full_value.float(), scale, full_mask
    )
    return (hybrid.float() - reference.transpose(1, 2)).abs().max().item()


def time_forward(
    run: Callable[[], object], device: torch.device, repeats: int, replays: int
) -> tuple[list[float], str]:
    """Milliseconds per forward in each of `repeats` timings of `replays` replays of its
    CUDA graph (on a CPU, or where capture fails, of eager calls), and which it was."""
    for _ in range(3):
        run()
    mode = "eager"
    call = run
    if device.type == "cuda":
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            call, mode = graph.replay, "cuda graph"
        except RuntimeError as error:
            print(f"  CUDA graph capture failed, timing eagerly: {error}", file=sys.stderr)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / replays)
        else:
            began = time.perf_counter()
            for _ in range(replays):
                call()
            times.append((time.perf_counter() - began) * 1000 / replays)
    return times, mode


def measure(
    decoder: RandomDecoder, context: int, new_tokens: int, batch: int,
    device: torch.device, repeats: int, replays: int,
) -> dict[str, object]:
    caches = decoder.new_cache(batch, context, new_tokens)
    rotary = decoder.rotary(context, new_tokens)
    mask = torch.ones(new_tokens, new_tokens, dtype=torch.bool, device=device).tril()
    tokens = torch.randint(decoder.shape.vocab, (batch, new_tokens), device=device)
    with torch.inference_mode():
        times, mode = time_forward(
            lambda: decoder.forward(tokens, caches, context, rotary, mask), device, repeats, replays
        )
    del caches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "model": decoder.shape.name, "context": context, "new_tokens": new_tokens, "batch": batch,
        "ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times), "mode": mode,
    }


def step_model(
    cells: list[dict[str, object]], shapes: tuple[DecoderShape, DecoderShape, DecoderShape],
    contexts: list[int], batches: list[int],
) -> list[dict[str, object]]:
    """Per context and batch size: c, chain and tree steps, and the acceptance a tree needs
    (`shapes`: the target, the draft, the draft with the 32K vocabulary)."""
    target, draft, draft_32k_vocabulary = shapes

    times = {(c["model"], c["context"], c["new_tokens"], c["batch"]): c["ms"] for c in cells}

    def ms(model: DecoderShape, context: int, new_tokens: int, batch: int) -> float:
        return float(times[model.name, context, new_tokens, batch])

    rows = []
    nodes_per_depth = TREE_NODES // TREE_DEPTH
    for context in contexts:
        for batch in batches:
            plain = ms(target, context, 1, batch)
            reduced = min(REDUCED_DRAFT_CONTEXT, context)
            draft_reduced = ms(draft, reduced, 1, batch)
            chain = ms(target, context, CHAIN_DRAFTS + 1, batch) + CHAIN_DRAFTS * draft_reduced
            tree = ms(target, context, TREE_NODES + 1, batch) + TREE_DEPTH * ms(
                draft, reduced, nodes_per_depth, batch
            )
            rows.append({
                "context": context, "batch": batch, "plain_ms": plain,
                "c_reduced": draft_reduced / plain,
                "c_reduced_32k_vocabulary": ms(draft_32k_vocabulary, reduced, 1, batch) / plain,
                "c_full": ms(draft, context, 1, batch) / plain,
                "verify_5_over_plain": ms(target, context, CHAIN_DRAFTS + 1, batch) / plain,
                "verify_17_over_verify_5": ms(target, context, TREE_NODES + 1, batch)
                / ms(target, context, CHAIN_DRAFTS + 1, batch),
                "chain_step_ms": chain, "tree_step_ms": tree,
                "chain_breaks_even_at_tokens_per_step": chain / plain,
                "tree_acceptance_needed_over_chain": TREE_AIM * tree / chain,
            })
    return rows


def print_model(rows: list[dict[str, object]]) -> None:
    print(
        "| context | batch | plain step ms | c (reduced cache) | c (32K vocabulary) "
        "| c (whole cache) "
        "| verify 5 / plain | verify 17 / verify 5 | chain step ms | tree step ms "
        "| chain breaks even at tokens/step | tree acceptance for 1.15x chain |"
    )
    print("|" + "---|" * 12)
    for r in rows:
        print(
            f"| {r['context']} | {r['batch']} | {r['plain_ms']:.2f} | {r['c_reduced']:.2f} "
            f"| {r['c_reduced_32k_vocabulary']:.2f} | {r['c_full']:.2f} "
            f"| {r['verify_5_over_plain']:.2f} | {r['verify_17_over_verify_5']:.2f} "
            f"| {r['chain_step_ms']:.2f} | {r['tree_step_ms']:.2f} "
            f"| {r['chain_breaks_even_at_tokens_per_step']:.2f} "
            f"| {r['tree_acceptance_needed_over_chain']:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument(
        "--shrink", type=int, default=1, help="divide layers and widths by this (a CPU smoke run)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="run each layer through torch.compile"
    )
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    if args.compile:
        # One compilation per model, context, batch size and token count; past the limit
        # torch.compile would run the layer eagerly.
        config = torch._dynamo.config
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, limit, 256)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = tuple(
        dataclasses.replace(
            s, layers=max(s.layers // args.shrink, 1), hidden=s.hidden // args.shrink,
            intermediate=s.intermediate // args.shrink, vocab=s.vocab // args.shrink,
        )
        for s in (TARGET, DRAFT, DRAFT_32K_VOCAB)
    )
    target, draft, draft_32k_vocabulary = shapes
    machine = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"{machine}, torch {torch.__version__}")
    error = hybrid_attention_error(device)
    print(f"hybrid attention against one masked attention, largest difference: {error:.2e}")
    if error > HYBRID_ATTENTION_TOLERANCE:
        raise SystemExit(f"hybrid attention differs by more than {HYBRID_ATTENTION_TOLERANCE}")
    contexts = sorted(set(args.contexts))
    draft_contexts = sorted({min(REDUCED_DRAFT_CONTEXT, c) for c in contexts} | set(contexts))
    plan = [
        (target, contexts, (1, CHAIN_DRAFTS + 1, TREE_NODES + 1)),
        (draft, draft_contexts, (1, TREE_NODES // TREE_DEPTH)),
        (draft_32k_vocabulary, sorted({min(REDUCED_DRAFT_CONTEXT, c) for c in contexts}), (1,)),
    ]
    cells = []
    for shape, shape_contexts, token_counts in plan:
        decoder = RandomDecoder(shape, device, dtype, args.compile)
        for context in shape_contexts:
            for batch in args.batches:
                for new_tokens in token_counts:
                    cell = measure(
                        decoder, context, new_tokens, batch, device, args.repeats, args.replays
                    )
                    print(
                        f"  {shape.name}, context {context}, batch {batch}, {new_tokens} new: "
                        f"{cell['ms']:.3f} ms ({cell['ms_min']:.3f}-{cell['ms_max']:.3f}, "
                        f"{cell['mode']})",
                        flush=True,
                    )
                    cells.append(cell)
        del decoder
    rows = step_model(cells, shapes, contexts, args.batches)
    print_model(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "machine": machine, "torch": torch.__version__,
        "args": {k: str(v) for k, v in vars(args).items()},
        "hybrid_attention_max_difference": error, "cells": cells, "model": rows,
    }, indent=1))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
