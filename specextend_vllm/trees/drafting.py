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

from specextend_vllm.algorithm.token_tree import DynamicTreeGrowth, TokenTree
from specextend_vllm.ops.tree_attention import attention_to_nodes
from specextend_vllm.verification.prefix_attention import PrefixAttention
from specextend_vllm.vllm_access.attention import merge_attn_states


@dataclasses.dataclass(frozen=True)
class DraftTreePass:
    """The attention metadata of one tree pass, which every draft layer reads.

    R requests, W nodes each: nodes [W] their places in the node buffers; allowed
    [W, M] or [R, W, M] the buffer places each attends to (its ancestors and itself; the
    root is in the prefix); block_table [R, B] and prefix_lens [R] the context each
    request's draft keeps, max_seq_len the longest of them, on the host; node_keys,
    node_values: per draft layer, [R, M, Hkv, D] the keys and values of the nodes run so
    far.
    """

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
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


# vLLM's slot for tokens whose keys and values the cache update skips.
PADDING_SLOT = -1

DraftForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DraftTreePass], torch.Tensor]


@dataclasses.dataclass
class TreePasses:
    """Runs the draft over some nodes of every request's tree, one depth at a time.

    root_positions: [R]; reduced_block_table, reduced_prefix_lens: the context the
    nodes attend to (through the root), max_prefix_len the longest, read once;
    forward(input_ids, positions, slot_mapping, tree_pass) -> hidden states;
    compute_logits: hidden -> logits. The nodes' keys and
    values stay in the node buffers: their KV slots are vLLM's padding slot, which the
    cache update skips.
    """

    root_positions: torch.Tensor
    reduced_block_table: torch.Tensor
    reduced_prefix_lens: torch.Tensor
    max_prefix_len: int
    node_keys: list[torch.Tensor]
    node_values: list[torch.Tensor]
    forward: DraftForward
    compute_logits: Callable[[torch.Tensor], torch.Tensor]

    @classmethod
    def allocate(
        cls,
        num_buffer_nodes: int,
        kv_shape: tuple[int, int, torch.dtype],
        num_layers: int,
        **fields: Any,
    ) -> TreePasses:
        """kv_shape: (Hkv, D, dtype) of the draft's layers."""
        num_reqs = fields["root_positions"].shape[0]
        num_kv_heads, head_dim, dtype = kv_shape
        device = fields["root_positions"].device
        # Zeros, not empty: a masked node still meets its value as 0 * value.
        node_keys = [
            torch.zeros(num_reqs, num_buffer_nodes, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        return cls(
            max_prefix_len=int(fields["reduced_prefix_lens"].max()),
            node_keys=node_keys,
            node_values=[torch.zeros_like(k) for k in node_keys],
            **fields,
        )

    def run(
        self,
        tokens: torch.Tensor,
        depth: int,
        buffer_nodes: torch.Tensor,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        """tokens: [R, W] the nodes' tokens, at `depth`; buffer_nodes: [W] their places
        in the node buffers; allowed: see DraftTreePass. Returns the draft's logits at
        the nodes, [R, W, V]."""
        num_reqs, width = tokens.shape
        num_tokens = num_reqs * width
        tree_pass = DraftTreePass(
            num_actual_tokens=num_tokens,
            max_query_len=width,
            max_seq_len=self.max_prefix_len,
            query_start_loc=torch.arange(
                0, num_tokens + 1, width, dtype=torch.int32, device=tokens.device
            ),
            block_table=self.reduced_block_table,
            prefix_lens=self.reduced_prefix_lens.to(torch.int32),
            nodes=buffer_nodes,
            allowed=allowed,
            node_keys=self.node_keys,
            node_values=self.node_values,
        )
        hidden_states = self.forward(
            tokens.flatten(),
            (self.root_positions + depth).repeat_interleave(width),
            torch.full((num_tokens,), PADDING_SLOT, dtype=torch.long, device=tokens.device),
            tree_pass,
        )
        return self.compute_logits(hidden_states[:num_tokens]).view(num_reqs, width, -1)


class StaticTreeDrafter:
    """Fills a static tree for every request; the draft's top-ranked tokens at a node
    become its children, by rank."""

    def __init__(self, tree: TokenTree, device: torch.device):
        self.num_nodes = tree.num_drafts + 1
        self.num_buffer_nodes = self.num_nodes
        self.expansions = tree.expansions(device)
        allowed = tree.ancestor_mask(device)
        allowed[:, 0] = False
        self.allowed = allowed
        self.parents = torch.tensor(tree.parents, device=device)

    def draft(self, root_logits: torch.Tensor, passes: TreePasses) -> tuple[torch.Tensor, torch.Tensor]:
        """root_logits: [R, V] the draft's logits at each root. Returns (tokens [R, N],
        parents [R, N + 1]) in breadth-first order."""
        num_reqs = root_logits.shape[0]
        node_tokens = torch.zeros(num_reqs, self.num_nodes, dtype=torch.long, device=root_logits.device)
        self._fill_children(node_tokens, root_logits[:, None], self.expansions[0].child_of_rank)
        for depth, expansion in enumerate(self.expansions[1:], start=1):
            logits = passes.run(
                node_tokens[:, expansion.nodes],
                depth,
                expansion.nodes,
                self.allowed[expansion.nodes],
            )
            self._fill_children(node_tokens, logits, expansion.child_of_rank)
        return node_tokens[:, 1:], self.parents.expand(num_reqs, -1)

    @staticmethod
    def _fill_children(
        node_tokens: torch.Tensor, logits: torch.Tensor, child_of_rank: torch.Tensor
    ) -> None:
        """logits: [R, W, V] at the expanded nodes; child_of_rank: [W, C]."""
        candidates = logits.topk(child_of_rank.shape[1], dim=-1).indices  # [R, W, C]
        kept = child_of_rank >= 0
        node_tokens[:, child_of_rank[kept]] = candidates[:, kept]


class DynamicTreeDrafter:
    """Grows each request's tree from the draft's confidences (see DynamicTreeGrowth): the
    draft runs `width` nodes per depth, which sit in the node buffers depth by depth."""

    def __init__(self, num_nodes: int, branching: int, width: int, depth: int, device: torch.device):
        self.num_nodes = num_nodes
        self.branching = branching
        self.width = width
        self.depth = depth
        self.num_buffer_nodes = max((depth - 1) * width, 1)
        self.device = device

    def draft(self, root_logits: torch.Tensor, passes: TreePasses) -> tuple[torch.Tensor, torch.Tensor]:
        """As StaticTreeDrafter.draft, each request with its own tree."""
        num_reqs = root_logits.shape[0]
        growth = DynamicTreeGrowth(self.num_nodes, self.branching, self.width)
        growth.start(root_logits.log_softmax(dim=-1))
        ancestry = torch.zeros(
            num_reqs, self.width, self.num_buffer_nodes, dtype=torch.bool, device=self.device
        )
        columns = torch.arange(self.width, device=self.device)
        for depth in range(1, self.depth):
            expanded = growth.expand()  # [R, W] candidates of this depth
            if depth > 1:
                # Candidates of depth >= 2 come `branching` per expanded parent, in order.
                parent_places = (expanded // self.branching)[..., None]
                ancestry = ancestry.gather(1, parent_places.expand(-1, -1, self.num_buffer_nodes))
            buffer_nodes = (depth - 1) * self.width + columns
            ancestry[:, columns, buffer_nodes] = True
            logits = passes.run(
                growth.tokens[-1].gather(1, expanded),
                depth,
                buffer_nodes,
                ancestry,
            )
            growth.add_children(logits.log_softmax(dim=-1))
        return growth.tree()
