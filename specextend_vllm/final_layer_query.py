"""The target's final-layer query, which retrieval scores chunks with and tree
verification reorders with the step's rows."""

from __future__ import annotations

import torch


class FinalLayerQuery:
    """Holds the post-RoPE query of the target's final attention layer from its last
    forward pass: one row per token of the target batch, [num_tokens, Hq, D].

    `observe` watches that layer's attention (see `vllm_access.attention_seam`) and keeps a
    copy: under torch.compile the query is an intermediate buffer of the compiled graph,
    which the rest of the forward reuses for other tensors (a reference read after the
    forward gave scores of unrelated values, and retrieval kept the chunks a streaming
    policy keeps).
    """

    def __init__(self, num_heads: int, head_size: int):
        self.num_heads = num_heads
        self.head_size = head_size
        self.query: torch.Tensor | None = None

    def observe(self, query: torch.Tensor) -> None:
        self.query = query.view(-1, self.num_heads, self.head_size).clone()

    def rows(self, token_rows: torch.Tensor) -> torch.Tensor:
        if self.query is None:
            raise RuntimeError("the target's final attention layer has not run yet")
        return self.query[token_rows]
