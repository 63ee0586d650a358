"""Token-tree drafting: after the draft's first pass (vLLM's, over the target's tokens),
whose logits at each request's root give the root's children, one pass per depth over
the nodes of that depth that have children, every request at once. A node attends to
the context the draft keeps (one paged prefix-attention call over the reduced block
table, with its LSE) and to its ancestors in the tree (held per layer in a small
buffer), merged by the LSEs; it sits at position `root position + depth`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from specextend_vllm.algorithm.token_tree import TokenTree
from specextend_vllm.ops.tree_attention import attention_to_nodes
from specextend_vllm.verification import PrefixAttention
from specextend_vllm.vllm_access.attention import merge_attn_states


@dataclasses.dataclass(frozen=True)
class DraftTreePass:
    """The attention metadata of one tree pass, which every draft layer reads.

    R requests, W nodes each: nodes [W] the nodes of this depth; allowed [W, N + 1]
    their ancestors and themselves (not the root, which the prefix holds);
    block_table [R, B] and prefix_lens [R] the context each request's draft keeps;
    node_keys, node_values: per draft layer, [R, N + 1, Hkv, D] the tree's nodes so far.
    """

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    block_table: torch.Tensor
    prefix_lens: torch.Tensor
    nodes: torch.Tensor
    allowed: torch.Tensor
    node_keys: list[torch.Tensor]
    node_values: list[torch.Tensor]


class DraftTreeAttention:
    """Stands in for one draft layer's attention on tree passes."""

    def __init__(self, layer_index: int, scale: float, prefix_attention: PrefixAttention):
        self.layer_index = layer_index
        self.scale = scale
        self.prefix_attention = prefix_attention

    def handles(self, batch: Any) -> bool:
        return isinstance(batch, DraftTreePass)

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        raw_kv_cache: torch.Tensor,
        batch: DraftTreePass,
        output: torch.Tensor,
        backend: Callable[[], Any],
    ) -> torch.Tensor:
        num_tokens = batch.num_actual_tokens
        num_reqs, width = batch.prefix_lens.shape[0], batch.max_query_len
        node_keys = batch.node_keys[self.layer_index]
        node_values = batch.node_values[self.layer_index]
        node_keys[:, batch.nodes] = key[:num_tokens].reshape(num_reqs, width, *key.shape[1:])
        node_values[:, batch.nodes] = value[:num_tokens].reshape(num_reqs, width, *value.shape[1:])
        query = query[:num_tokens]
        prefix_output, prefix_lse = self.prefix_attention(
            query, raw_kv_cache, batch, batch.prefix_lens, self.scale
        )
        node_output, node_lse = attention_to_nodes(
            query.reshape(num_reqs, width, *query.shape[1:]),
            node_keys,
            node_values,
            batch.allowed,
            self.scale,
        )
        merge_attn_states(output[:num_tokens], prefix_output, prefix_lse, node_output, node_lse)
        return output


DraftForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DraftTreePass], torch.Tensor]


class TreeDrafter:
    """Fills a static tree for every request of a draft batch; the draft's top-ranked
    tokens at a node become its children, by rank."""

    def __init__(self, tree: TokenTree, device: torch.device, block_size: int):
        self.tree = tree
        self.num_nodes = tree.num_drafts + 1
        self.expansions = tree.expansions(device)
        allowed = tree.ancestor_mask(device)
        allowed[:, 0] = False
        self.allowed = allowed
        self.block_size = block_size

    def draft(
        self,
        root_logits: torch.Tensor,
        root_positions: torch.Tensor,
        block_table: torch.Tensor,
        reduced_block_table: torch.Tensor,
        reduced_prefix_lens: torch.Tensor,
        kv_shape: tuple[int, int, torch.dtype],
        num_layers: int,
        forward: DraftForward,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """root_logits: [R, V] the draft's logits at each request's root;
        root_positions: [R]; block_table: [R, B] the full table (the nodes' KV slots);
        reduced_block_table, reduced_prefix_lens: the context the nodes attend to
        (through the root); kv_shape: (Hkv, D, dtype) of the draft's layers;
        forward(input_ids, positions, slot_mapping, tree_pass) -> hidden states.
        Returns [R, N] the nodes' tokens in breadth-first order."""
        num_reqs = root_logits.shape[0]
        device = root_logits.device
        node_tokens = torch.zeros(num_reqs, self.num_nodes, dtype=torch.long, device=device)
        self._fill_children(node_tokens, root_logits.view(num_reqs, 1, -1), self.expansions[0].child_of_rank)
        num_kv_heads, head_dim, dtype = kv_shape
        node_keys = [
            torch.empty(num_reqs, self.num_nodes, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        node_values = [torch.empty_like(keys) for keys in node_keys]
        for depth, expansion in enumerate(self.expansions[1:], start=1):
            width = expansion.nodes.shape[0]
            num_tokens = num_reqs * width
            positions = (root_positions + depth).repeat_interleave(width)
            slot_positions = root_positions[:, None] + expansion.nodes[None, :]
            blocks = block_table.gather(1, (slot_positions // self.block_size).long())
            slot_mapping = blocks.long() * self.block_size + slot_positions % self.block_size
            tree_pass = DraftTreePass(
                num_actual_tokens=num_tokens,
                max_query_len=width,
                query_start_loc=torch.arange(
                    0, num_tokens + 1, width, dtype=torch.int32, device=device
                ),
                block_table=reduced_block_table,
                prefix_lens=reduced_prefix_lens.to(torch.int32),
                nodes=expansion.nodes,
                allowed=self.allowed[expansion.nodes],
                node_keys=node_keys,
                node_values=node_values,
            )
            hidden_states = forward(
                node_tokens[:, expansion.nodes].flatten(),
                positions,
                slot_mapping.flatten(),
                tree_pass,
            )
            logits = compute_logits(hidden_states[:num_tokens]).view(num_reqs, width, -1)
            self._fill_children(node_tokens, logits, expansion.child_of_rank)
        return node_tokens[:, 1:]

    @staticmethod
    def _fill_children(
        node_tokens: torch.Tensor, logits: torch.Tensor, child_of_rank: torch.Tensor
    ) -> None:
        """logits: [R, W, V] at the expanded nodes; child_of_rank: [W, C]."""
        candidates = logits.topk(child_of_rank.shape[1], dim=-1).indices  # [R, W, C]
        kept = child_of_rank >= 0
        node_tokens[:, child_of_rank[kept]] = candidates[:, kept]
