"""Tiny Qwen2 models with random weights, generated offline for the engine tests."""

from __future__ import annotations

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
