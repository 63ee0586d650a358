"""The tree session: owns each request's token tree from the draft step that grows it to
the target step that verifies it, and the target step's tree state in between.

Draft step (`draft`): the drafter grows every request's tree below its root; the
session keeps each tree's parents under the request's id. Target step:
`plan_verification` (once vLLM has laid out the step) places the nodes by depth and
sets the step's masks, which the hybrid verification attention reads through
`attention_step`; `verify` (in place of vLLM's rejection sampler) accepts each
request's longest matching path and leaves the step as the chain of that path.
"""

from __future__ import annotations

from collections.abc import Callable, KeysView
from typing import Any

import torch

from specextend_vllm.algorithm.request_slots import RequestSlots
from specextend_vllm.config import SpecExtendConfig
from specextend_vllm.final_layer_query import FinalLayerQuery
from specextend_vllm.trees.drafting import (
    DraftForward,
    DraftTreeAttention,
    DynamicTreeDrafter,
    StaticTreeDrafter,
    TreePasses,
)
from specextend_vllm.trees.verification import TreeVerifier
from specextend_vllm.verification.hybrid import TreeAttentionStep
from specextend_vllm.verification.prefix_attention import prefix_attention_for
from specextend_vllm.vllm_access.attention_seam import attention_layer_seam
from specextend_vllm.vllm_access.sampling import SamplerOutput


class TreeSession:
    """num_drafts: nodes per tree below the root; target_caches(): the target layers' raw
    KV caches; draft_layers: the draft's attention layers, which compute tree passes
    through `DraftTreeAttention`; draft_dtype: the dtype of the draft's keys and values."""

    def __init__(
        self,
        config: SpecExtendConfig,
        num_drafts: int,
        max_requests: int,
        device: torch.device,
        target_caches: Callable[[], list[torch.Tensor]],
        final_layer_query: FinalLayerQuery,
        block_size: int,
        draft_layers: list[Any],
        draft_dtype: torch.dtype,
    ):
        static_tree = config.token_tree()
        if static_tree is not None:
            self.drafter: StaticTreeDrafter | DynamicTreeDrafter = StaticTreeDrafter(static_tree, device)
            max_depth = static_tree.max_depth
        else:
            branching, width, max_depth = config.dynamic_tree_shape(num_drafts)
            self.drafter = DynamicTreeDrafter(num_drafts, branching, width, max_depth, device)
        self.verifier = TreeVerifier(
            num_drafts, max_depth, device, target_caches, final_layer_query, block_size
        )
        self._parents = torch.zeros(max_requests, num_drafts + 1, dtype=torch.long, device=device)
        self._request_slots = RequestSlots(max_requests)
        self._draft_layers = draft_layers
        self._draft_dtype = draft_dtype
        prefix_attention = prefix_attention_for(device)
        for index, layer in enumerate(draft_layers):
            attention_layer_seam(layer).compute_with(
                DraftTreeAttention(index, layer.impl.scale, prefix_attention)
            )

    def _slots(self, request_ids: list[str]) -> torch.Tensor:
        slots, _ = self._request_slots.assign(request_ids)
        return torch.tensor(slots, dtype=torch.long).to(self._parents.device, non_blocking=True)

    def draft(
        self,
        request_ids: list[str],
        root_logits: torch.Tensor,
        root_positions: torch.Tensor,
        block_table: torch.Tensor,
        prefix_lens: torch.Tensor,
        forward: DraftForward,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """root_logits: [R, V] the draft's logits at each request's root, at
        root_positions [R]; block_table [R, W] and prefix_lens [R]: the context the draft
        keeps, through the root. Returns the nodes' tokens, [R, N] in breadth-first order."""
        layer = self._draft_layers[0]
        passes = TreePasses.allocate(
            self.drafter.num_buffer_nodes,
            (layer.num_kv_heads, layer.head_size, self._draft_dtype),
            len(self._draft_layers),
            root_positions=root_positions,
            reduced_block_table=block_table,
            reduced_prefix_lens=prefix_lens,
            forward=forward,
            compute_logits=compute_logits,
        )
        tokens, parents = self.drafter.draft(root_logits, passes)
        self._parents[self._slots(request_ids)] = parents
        return tokens

    def plan_verification(
        self, metadata: Any, positions: torch.Tensor, batch_request_ids: list[str]
    ) -> None:
        """metadata: vLLM's SpecDecodeMetadata of the target step (None without drafts);
        positions: the step's positions, changed in place; batch_request_ids: the ids of
        the runner's batch, in row order."""
        self.verifier.plan(
            metadata,
            positions,
            lambda num_reqs: self._parents[self._slots(batch_request_ids[:num_reqs])],
        )

    def attention_step(self) -> TreeAttentionStep | None:
        return self.verifier.attention_step()

    def verifies_this_step(self) -> bool:
        return self.verifier.step is not None

    def verify(
        self,
        logits: torch.Tensor,
        cu_num_sampled_tokens: torch.Tensor,
        sampling_metadata: Any,
        sampler: Any,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> SamplerOutput:
        """The target's choice at every node, the accepted paths as vLLM's chain output;
        the step's rows and KV are then left in chain order."""
        output, paths = self.verifier.sample(
            logits, cu_num_sampled_tokens, sampling_metadata, sampler, input_ids
        )
        self.verifier.leave_chain(paths, input_ids, positions, slot_mapping)
        return output

    @property
    def request_ids(self) -> KeysView[str]:
        """The requests holding a slot."""
        return self._request_slots.request_ids

    def forget(self, request_ids: list[str]) -> None:
        self._request_slots.free(request_ids)
