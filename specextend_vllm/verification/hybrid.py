"""Hybrid tree attention for the target's verification rows.

A verification step's tokens attend to (1) their request's cached prefix, with no mask:
one paged-attention call that also returns its log-sum-exp, and (2) each other, under a
causal mask for a chain (an ancestor mask for a tree), from their own keys and values;
(3) the two parts merge exactly by their LSEs. Prefill rows and the draft's layers stay on
vLLM's kernel; plain decoding steps (one token per request) compute the same three parts
where `verification_attention: auto` measures them faster (`verification.measured`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch

from specextend_vllm.ops import merge_attention_states, tree_attention
from specextend_vllm.verification.prefix_attention import PrefixAttention, VerificationBatch
from specextend_vllm.vllm_access.attention import merge_attn_states


@dataclasses.dataclass(frozen=True)
class TreeAttentionStep:
    """The requests that verify a token tree this step, and every request's mask over
    its query tokens: [R, L, L] bool, the tree's ancestor mask for those requests and a
    causal mask for the others."""

    tree_requests: torch.Tensor
    masks: torch.Tensor


@dataclasses.dataclass(frozen=True)
class SubBatch:
    """Some requests of a verification batch, their query tokens packed."""

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor

    @classmethod
    def of(cls, batch: VerificationBatch, requests: torch.Tensor) -> tuple[SubBatch, torch.Tensor]:
        """The sub-batch of `requests` ([Rs] long), and the batch rows of its tokens."""
        starts = batch.query_start_loc[requests].long()
        query_lens = batch.query_start_loc[requests + 1].long() - starts
        query_start_loc = torch.zeros(requests.shape[0] + 1, dtype=torch.int32, device=starts.device)
        torch.cumsum(query_lens, 0, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        token_rows = torch.arange(num_tokens, device=starts.device) + (
            starts - query_start_loc[:-1].long()
        ).repeat_interleave(query_lens, output_size=num_tokens)
        return (
            cls(
                num_tokens,
                int(query_lens.max()),
                batch.max_seq_len,
                query_start_loc,
                batch.seq_lens[requests],
                batch.block_table[requests],
            ),
            token_rows,
        )


class TreeMasks(Protocol):
    """Who holds the tree masks of the target's current step (the tree session)."""

    def attention_step(self) -> TreeAttentionStep | None: ...


class HybridVerificationAttention:
    """Stands in for a target layer's attention on verification batches: those whose
    requests each bring 2 to `max_verified_tokens` new tokens, and, with token trees,
    every batch holding a request that verifies a tree (the others of a batch that also
    holds prompt chunks stay on vLLM's attention)."""

    def __init__(
        self,
        scale: float,
        max_verified_tokens: int,
        prefix_attention: PrefixAttention,
        on_verification: Callable[[], None] | None = None,
        tree_masks: TreeMasks | None = None,
    ):
        self.scale = scale
        self.max_verified_tokens = max_verified_tokens
        self.prefix_attention = prefix_attention
        self._on_verification = on_verification
        self._tree_masks = tree_masks

    def _tree_step(self) -> TreeAttentionStep | None:
        return None if self._tree_masks is None else self._tree_masks.attention_step()

    def handles(self, batch: Any) -> bool:
        if self._tree_step() is not None:
            return True
        return 2 <= getattr(batch, "max_query_len", 0) <= self.max_verified_tokens

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        raw_kv_cache: torch.Tensor,
        batch: VerificationBatch,
        output: torch.Tensor,
        backend: Callable[[], Any],
    ) -> torch.Tensor:
        """query, output: [num_tokens, Hq, D]; key, value: [num_tokens, Hkv, D] (rows
        past `batch.num_actual_tokens` are padding and left alone)."""
        tree_step = self._tree_step()
        if tree_step is None or batch.max_query_len <= self.max_verified_tokens:
            masks = None if tree_step is None else tree_step.masks
            self.attend(query, key, value, raw_kv_cache, batch, output, masks)
        else:
            backend()
            sub_batch, rows = SubBatch.of(batch, tree_step.tree_requests)
            sub_output = output.new_empty(rows.shape[0], *output.shape[1:])
            self.attend(
                query[rows], key[rows], value[rows], raw_kv_cache, sub_batch, sub_output,
                tree_step.masks[tree_step.tree_requests],
            )
            output[rows] = sub_output
        if self._on_verification is not None:
            self._on_verification()
        return output

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        raw_kv_cache: torch.Tensor,
        batch: VerificationBatch,
        output: torch.Tensor,
        masks: torch.Tensor | None,
    ) -> None:
        """The three parts for every query token of `batch`: the prefix, the new tokens
        under `masks` ([R, L, L] bool; None: causal), the merge. With one token per request
        (a plain decoding step) the second part is the token itself."""
        num_tokens = batch.num_actual_tokens
        num_reqs = batch.seq_lens.shape[0]
        query_start_loc = batch.query_start_loc[: num_reqs + 1]
        query_lens = query_start_loc[1:] - query_start_loc[:-1]
        prefix_lens = (batch.seq_lens - query_lens).to(torch.int32)
        query = query[:num_tokens]
        prefix_output, prefix_lse = self.prefix_attention(
            query, raw_kv_cache, batch, prefix_lens, self.scale
        )
        tree_output, tree_lse = tree_attention(
            query,
            key[:num_tokens],
            value[:num_tokens],
            query_start_loc,
            batch.max_query_len,
            self.scale,
            None if masks is None else masks[:num_reqs],
        )
        merge = merge_attention_states if output.device.type == "cpu" else merge_attn_states
        merge(output[:num_tokens], prefix_output, prefix_lse, tree_output, tree_lse)
