"""Tiny Qwen2 models with random weights, generated offline for the engine tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB_SIZE = 512


def tiny_qwen2_config(num_layers: int = 2) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )


def save_tiny_model(
    path: Path,
    seed: int,
    *,
    num_layers: int = 2,
    base: Path | None = None,
    noise: float = 0.0,
    logit_scale: float = 1.0,
) -> Path:
    """A random model, or `base`'s weights plus Gaussian noise (a draft that agrees
    with its target on some tokens only). `logit_scale` sharpens the output
    distribution, so that sampling tests see a few likely tokens."""
    torch.manual_seed(seed)
    if base is None:
        model = Qwen2ForCausalLM(tiny_qwen2_config(num_layers))
    else:
        model = Qwen2ForCausalLM.from_pretrained(base, dtype=torch.float32)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(noise * parameter.std() * torch.randn_like(parameter))
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    return path


def set_trained_length(path: Path, max_position_embeddings: int) -> Path:
    """Marks a saved model as trained on `max_position_embeddings` positions only."""
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = max_position_embeddings
    (path / "config.json").write_text(json.dumps(config))
    return path


def save_word_tokenizer(path: Path, tokens: list[str]) -> None:
    """A whitespace word-level tokenizer whose token i is tokens[i]; tokens[0] is <unk>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(
        models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token=tokens[0])
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token=tokens[0], eos_token=tokens[1]
    ).save_pretrained(path)


def save_cross_tokenizer_pair(
    root: Path, target: Path, num_shared: int, seed: int
) -> tuple[Path, Path]:
    """The target with a word tokenizer, and a draft with another tokenizer: its token j
    < num_shared is the target's token permutation[j], with the target's weights for it,
    and its other tokens are its own. (target_dir, draft_dir)."""
    target_words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(2, VOCAB_SIZE)]
    target_dir = root / "cross_target"
    Qwen2ForCausalLM.from_pretrained(target, dtype=torch.float32).save_pretrained(
        target_dir, safe_serialization=True
    )
    save_word_tokenizer(target_dir, target_words)

    generator = torch.Generator().manual_seed(seed)
    permutation = torch.cat(
        [torch.arange(2), 2 + torch.randperm(VOCAB_SIZE - 2, generator=generator)]
    )
    draft_words = [
        target_words[int(permutation[j])] if j < num_shared else f"d{j}" for j in range(VOCAB_SIZE)
    ]
    model = Qwen2ForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        for weight in (model.model.embed_tokens.weight, model.lm_head.weight):
            weight[:num_shared] = weight[permutation[:num_shared]].clone()
    model.generation_config.eos_token_id = None
    draft_dir = root / "cross_draft"
    model.save_pretrained(draft_dir, safe_serialization=True)
    save_word_tokenizer(draft_dir, draft_words)
    return target_dir, draft_dir


NEEDLE_TOKEN = 7


def save_needle_model(path: Path, base: Path, needle: int = NEEDLE_TOKEN) -> Path:
    """`base` turned into a model whose last layer attends to the `needle` token wherever
    it stands and to nothing else, and whose other layers' attention adds nothing: its
    outputs depend on whether the needle is in view. A copy of it as the draft predicts
    the target exactly on a reduced cache that keeps the needle's chunk, and not on one
    that misses it.

    The last layer's queries hold a large constant in RoPE's slowest-turning pair of
    dimensions and its keys there hold their alignment with the needle's normalized
    hidden state: the needle's score exceeds every other token's by ~100 at any
    position a tiny model reaches."""
    model = Qwen2ForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = model.config
    head_dim = config.head_dim
    slowest = [head_dim // 2 - 1, head_dim - 1]
    with torch.no_grad():
        for layer in model.model.layers[:-1]:
            layer.self_attn.o_proj.weight.zero_()
        hidden = model(torch.tensor([[needle]]), output_hidden_states=True).hidden_states[-2]
        last = model.model.layers[-1]
        direction = last.input_layernorm(hidden)[0, 0]
        direction = direction / direction.norm()
        attention = last.self_attn
        for head in range(config.num_attention_heads):
            rows = [head * head_dim + d for d in slowest]
            attention.q_proj.weight[rows] = 0.0
            attention.q_proj.bias[rows] = 50.0
        for head in range(config.num_key_value_heads):
            rows = [head * head_dim + d for d in slowest]
            attention.k_proj.weight[rows] = direction
            attention.k_proj.bias[rows] = 0.0
    model.generation_config.eos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    return path


def save_int8_model(source: Path, path: Path, keep: tuple[str, ...] = ()) -> Path:
    """`source` quantized to int8 W8A8 as the assets quantize the benchmarks' draft."""
    from benchmarks.assets import quantize_to_int8

    return quantize_to_int8(source, path, keep, quiet=True)
