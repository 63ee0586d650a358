"""Sampler seams."""

from __future__ import annotations

from vllm.v1.sample import rejection_sampler

from specextend_vllm.algorithm import sampling
from specextend_vllm.patches.base import VllmPatch


class ExpandBatchToTokensOnCpu(VllmPatch):
    """vLLM 0.32's CPU stand-in for the Triton `expand_kernel` casts its output to int64
    and writes into that temporary copy, so `expand_batch_to_tokens` returns uninitialised
    memory: the rejection sampler then divides the target's logits by garbage temperatures
    and speculative sampling at temperature > 0 stops following the target's distribution
    (every speculative method, not only this one). The replacement is the same function in
    plain torch."""

    target = rejection_sampler
    attribute = "expand_batch_to_tokens"
    replacement = staticmethod(sampling.expand_batch_to_tokens)
