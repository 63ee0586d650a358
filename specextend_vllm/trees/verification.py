"""Token-tree verification in the target, one step at a time:

1. `plan`, once vLLM has laid out the step: each request's nodes go to positions by
   depth (their KV slots stay those of their flat order), and the hybrid verification
   attention gets every request's mask.
2. `sample`, after the target's forward: the target's choice at every node (argmax, or
   one sample of its distribution), the longest path of drafts matching the choice at
   their parents, and vLLM's chain output (the path, then the choice at its end).
3. `leave_chain`: the step's tokens, positions, final-layer queries and the target's KV
   are moved so that the accepted path sits in the first slots, as a chain would;
   vLLM's rollback, the draft's next pass and retrieval then read a chain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from specextend_vllm.algorithm.positions import copy_kept_tokens
from specextend_vllm.algorithm.sampling import expand_batch_to_tokens
from specextend_vllm.algorithm.token_tree import (
    AcceptedPaths,
    accept_paths,
    ancestors_from_parents,
    masks_from_ancestors,
)
from specextend_vllm.final_layer_query import FinalLayerQuery
from specextend_vllm.verification.hybrid import TreeAttentionStep
from specextend_vllm.vllm_access.sampling import SamplerOutput, apply_top_k_top_p


# Sampling parameters whose effect depends on the tokens before each node, which the
# tree verifier does not apply (it applies temperature, top-k and top-p), with the value
# that leaves them off.
SAMPLING_PARAMS_OFF_WITH_TREES: dict[str, Any] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_tokens": 0,
    "bad_words": None,
    "logit_bias": None,
    "allowed_token_ids": None,
    "logits_processors": None,
    "structured_outputs": None,
}


def sampling_params_unsupported_with_trees(params: Any) -> list[str]:
    """The names of the request's sampling parameters that token trees cannot honour.

    >>> from types import SimpleNamespace
    >>> sampling_params_unsupported_with_trees(SimpleNamespace(min_tokens=3, bad_words=[]))
    ['min_tokens']
    """
    return [
        name for name, off in SAMPLING_PARAMS_OFF_WITH_TREES.items()
        if getattr(params, name, off) not in (off, [], {})
    ]


@dataclasses.dataclass(frozen=True)
class TreeVerificationStep:
    """num_drafts: [R] nodes each request verifies (0 for prompt chunks and requests
        that drafted nothing); parents, ancestors: [R, N + 1] and [R, N + 1, D + 1] each
        request's tree; logit_rows: [R, N + 1] each node's row of the step's logits
        (clamped past a request's nodes); step_rows: [R, N + 1] its row of the target
        batch; attention: the masks, None when no request verifies a tree."""

    num_drafts: torch.Tensor
    num_draft_tokens: list[int]
    parents: torch.Tensor
    ancestors: torch.Tensor
    logit_rows: torch.Tensor
    step_rows: torch.Tensor
    attention: TreeAttentionStep | None


class TreeVerifier:
    def __init__(
        self,
        num_drafts: int,
        max_depth: int,
        device: torch.device,
        target_caches: Callable[[], list[torch.Tensor]],
        final_layer_query: FinalLayerQuery,
        block_size: int,
    ):
        self.num_nodes = num_drafts + 1
        self.max_depth = max_depth
        self.causal_mask = torch.ones(self.num_nodes, self.num_nodes, dtype=torch.bool, device=device).tril()
        self.node_columns = torch.arange(self.num_nodes, device=device)
        self.target_caches = target_caches
        self.final_layer_query = final_layer_query
        self.block_size = block_size
        self.step: TreeVerificationStep | None = None

    def attention_step(self) -> TreeAttentionStep | None:
        return None if self.step is None else self.step.attention

    def plan(
        self, metadata: Any, positions: torch.Tensor, parents_of_batch: Callable[[int], torch.Tensor]
    ) -> None:
        """metadata: vLLM's SpecDecodeMetadata of the step (None without drafts);
        positions: [num_tokens] the step's positions, changed in place;
        parents_of_batch(R): [R, N + 1] the tree each request of the batch drafted.

        A request verifying nodes (root, a, b, c) of the tree [[0], [1], [0, 0]] from
        position 40 gets positions (40, 41, 41, 42)."""
        if metadata is None:
            self.step = None
            return
        device = positions.device
        num_drafts = torch.tensor(metadata.num_draft_tokens, device=device)
        num_reqs = num_drafts.shape[0]
        parents = parents_of_batch(num_reqs)
        ancestors = ancestors_from_parents(parents, self.max_depth)
        depths = (ancestors >= 0).sum(dim=2) - 1
        num_sampled = num_drafts + 1
        logits_indices = metadata.logits_indices.long()
        num_logit_rows = logits_indices.shape[0]
        first_logit_row = metadata.cu_num_sampled_tokens.long() - num_sampled
        request_of_row = torch.arange(num_reqs, device=device).repeat_interleave(
            num_sampled, output_size=num_logit_rows
        )
        columns = torch.arange(num_logit_rows, device=device) - first_logit_row[request_of_row]
        positions.index_add_(
            0, logits_indices, (depths[request_of_row, columns] - columns).to(positions.dtype)
        )
        logit_rows = (first_logit_row[:, None] + self.node_columns[None, :]).clamp(
            max=num_logit_rows - 1
        )
        has_tree = num_drafts > 0
        tree_requests = has_tree.nonzero().squeeze(1)
        attention = None
        if tree_requests.numel():
            masks = torch.where(
                has_tree[:, None, None], masks_from_ancestors(ancestors), self.causal_mask
            )
            attention = TreeAttentionStep(tree_requests, masks)
        self.step = TreeVerificationStep(
            num_drafts,
            list(metadata.num_draft_tokens),
            parents,
            ancestors,
            logit_rows,
            logits_indices[logit_rows],
            attention,
        )

    def sample(
        self,
        logits: torch.Tensor,
        cu_num_sampled_tokens: torch.Tensor,
        sampling_metadata: Any,
        sampler: Any,
        input_ids: torch.Tensor,
    ) -> tuple[SamplerOutput, AcceptedPaths]:
        """logits: [S, V] the step's logit rows (each request's nodes, in order);
        input_ids: the step's tokens. Returns vLLM's sampler output, shaped as the
        chain rejection sampler's ([R, max drafts + 1], -1 past the accepted tokens,
        logprobs of the accepted tokens), and the accepted paths."""
        step = self.step
        assert step is not None
        choices = logits.argmax(dim=-1)
        if not sampling_metadata.all_greedy:
            sampled = self._sample_every_row(logits, cu_num_sampled_tokens, sampling_metadata)
            greedy = (
                expand_batch_to_tokens(
                    sampling_metadata.temperature, cu_num_sampled_tokens, logits.shape[0]
                )
                == 0
            )
            choices = torch.where(greedy, choices, sampled)
        paths = accept_paths(
            input_ids[step.step_rows],
            choices[step.logit_rows],
            step.ancestors,
            step.parents,
            step.num_drafts,
        )
        width = max(step.num_draft_tokens) + 1
        output_tokens = paths.output_tokens[:, :width].to(torch.int32)
        logprobs = None
        if sampling_metadata.max_num_logprobs is not None:
            chain_logit_rows = step.logit_rows.gather(1, paths.chain_order)[:, :width]
            accepted_logits = logits[chain_logit_rows.flatten()].float()
            if sampler.logprobs_mode != "raw_logits":
                accepted_logits = sampler.compute_logprobs(accepted_logits)
            logprobs = sampler.gather_logprobs(
                accepted_logits,
                sampling_metadata.max_num_logprobs,
                output_tokens.flatten().clamp(min=0).long(),
            )
        return SamplerOutput(sampled_token_ids=output_tokens, logprobs_tensors=logprobs), paths

    @staticmethod
    def _sample_every_row(
        logits: torch.Tensor, cu_num_sampled_tokens: torch.Tensor, sampling_metadata: Any
    ) -> torch.Tensor:
        """One sample of each row's distribution (temperature, top-k, top-p), drawn by
        the exponential race; seeded requests draw from their own generators."""
        num_rows = logits.shape[0]
        temperature = expand_batch_to_tokens(
            sampling_metadata.temperature, cu_num_sampled_tokens, num_rows, replace_to=1
        )
        top_k, top_p = (
            None if values is None
            else expand_batch_to_tokens(values, cu_num_sampled_tokens, num_rows)
            for values in (sampling_metadata.top_k, sampling_metadata.top_p)
        )
        scaled = apply_top_k_top_p(logits.float() / temperature[:, None], top_k, top_p)
        probs = scaled.softmax(dim=-1)
        race = torch.empty_like(probs).exponential_()
        if sampling_metadata.generators:
            ends = cu_num_sampled_tokens.tolist()
            for request, generator in sampling_metadata.generators.items():
                start = ends[request - 1] if request else 0
                race[start : ends[request]].exponential_(generator=generator)
        return (probs / race).argmax(dim=-1)

    def leave_chain(
        self,
        paths: AcceptedPaths,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Moves each request's rows into chain order (root, accepted path, the rest) in
        the step's tokens, positions and final-layer queries, and the accepted nodes'
        keys and values into the first slots after the root in every target layer."""
        step = self.step
        assert step is not None
        columns = self.node_columns[None, :]
        is_node = columns <= step.num_drafts[:, None]
        chain_rows = step.step_rows.gather(1, paths.chain_order)
        destinations, sources = step.step_rows[is_node], chain_rows[is_node]
        input_ids[destinations] = input_ids[sources]
        positions[destinations] = positions[sources]
        query = self.final_layer_query.query
        if query is not None:
            query[destinations] = query[sources]
        moved = (
            (columns >= 1)
            & (columns <= paths.num_accepted[:, None])
            & (paths.chain_order != columns)
        )
        if not bool(moved.any()):
            return
        source_slots = slot_mapping[chain_rows[moved]].long()
        destination_slots = slot_mapping[step.step_rows[moved]].long()
        block_size = self.block_size
        for raw_cache in self.target_caches():
            copy_kept_tokens(
                raw_cache,
                (source_slots // block_size, source_slots % block_size),
                (destination_slots // block_size, destination_slots % block_size),
                None,
                None,
            )
