"""Chunk scores from the target model's final attention layer."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specextend_vllm import ops
from specextend_vllm.final_layer_query import FinalLayerQuery
from specextend_vllm.metrics import RetrievalMetrics


class ChunkScorer:
    """Scores every chunk of every selected request in one op call."""

    def __init__(
        self,
        final_layer_query: FinalLayerQuery,
        key_cache_view: Callable[[], torch.Tensor],
        scale: float,
        chunk_size: int,
        metrics: RetrievalMetrics,
        mean_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.final_layer_query = final_layer_query
        self.key_cache_view = key_cache_view
        self.scale = scale
        self.chunk_size = chunk_size
        self.metrics = metrics
        self.mean_over_ranks = mean_over_ranks

    def __call__(
        self,
        token_rows: torch.Tensor,
        block_table: torch.Tensor,
        context_lens: torch.Tensor,
        num_chunks: int,
    ) -> torch.Tensor:
        """token_rows: the target batch row of each request's last accepted token;
        context_lens: tokens up to and including it. Returns [R, num_chunks] scores, the
        same on every tensor-parallel rank: each rank scores with its own query heads, and
        the ranks' means are averaged."""
        start = time.perf_counter()
        scores = ops.chunk_scores(
            self.final_layer_query.rows(token_rows),
            self.key_cache_view(),
            block_table,
            context_lens.to(torch.int32),
            self.chunk_size,
            self.scale,
            num_chunks,
        )
        if self.mean_over_ranks is not None:
            scores = self.mean_over_ranks(scores)
        self.metrics.record_scoring(time.perf_counter() - start)
        return scores
