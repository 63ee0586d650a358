"""SpecExtendProposer: vLLM's draft-model proposer drafting over retrieved chunks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from specextend_vllm import patches
from specextend_vllm.config import METHOD_NAME, SpecExtendConfig
from specextend_vllm.retrieval import (
    RetrievalState,
    chunks_to_blocks,
    reduced_block_indices,
    select_chunks,
)
from specextend_vllm.scoring import ChunkScorer, FinalLayerQuery
from specextend_vllm.stats import RetrievalStats


@dataclasses.dataclass
class ReducedDraftView:
    """What the draft attends to in one propose() call: a block table holding the kept
    blocks then the tail blocks, and how many tokens shorter each reduced sequence is."""

    block_table: torch.Tensor
    seq_len_offset: torch.Tensor


class SpecExtendProposer(patches.DraftModelProposer):
    def __init__(self, vllm_config: Any, device: torch.device, runner: Any = None):
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.runner = runner
        self.method_config = SpecExtendConfig(**vllm_config.additional_config[METHOD_NAME])
        self.stats = RetrievalStats()
        self.retrieval_state: RetrievalState | None = None
        self.chunk_scorer: ChunkScorer | None = None
        self._reduced_view: ReducedDraftView | None = None
        self._reduced_block_table: torch.Tensor | None = None

    def load_model(self, target_model: Any) -> None:
        super().load_model(target_model)
        layer = patches.target_final_attention_layer(self.vllm_config, self._draft_attn_layer_names)
        final_layer_query = FinalLayerQuery(layer.num_heads, layer.head_size)
        patches.observe_attention_query(layer, final_layer_query.observe)
        self.chunk_scorer = ChunkScorer(
            final_layer_query,
            key_cache_view=lambda: patches.key_cache_view(layer),
            scale=layer.impl.scale,
            chunk_size=self.method_config.chunk_size,
        )
        self.stats.scorer = self.chunk_scorer

    def initialize_attn_backend(self, *args: Any, **kwargs: Any) -> None:
        super().initialize_attn_backend(*args, **kwargs)
        chunk_size = self.method_config.chunk_size
        if chunk_size % self.block_size:
            raise ValueError(
                f"speculative_config['chunk_size'] ({chunk_size}) must be a multiple "
                f"of the attention kernel's block size ({self.block_size})."
            )
        self.retrieval_state = self._new_retrieval_state()

    def reconfigure(self, changes: Mapping[str, Any]) -> SpecExtendConfig:
        """Replaces some of the method's keys on a running engine, for example to compare
        policies on one prefill; every request selects its chunks afresh at its next step."""
        allowed = set(SpecExtendConfig.keys()) - {"chunk_size"}
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise ValueError(
                f"cannot reconfigure {unknown} on a running engine; allowed keys: {sorted(allowed)}."
            )
        config = dataclasses.replace(self.method_config, **changes)
        self.method_config = config.resolve_chunk_size(self.block_size)
        self.retrieval_state = self._new_retrieval_state()
        patches.logger.info("SpecExtend reconfigured: %s", self.method_config.to_dict())
        return self.method_config

    def _new_retrieval_state(self) -> RetrievalState:
        config = self.method_config
        assert config.chunk_size is not None
        max_kept_blocks = config.num_kept_chunks * (config.chunk_size // self.block_size)
        return RetrievalState(self.max_batch_size, max_kept_blocks, self.device)

    def on_requests_changed(self, finished: set[str], restarted: set[str]) -> None:
        if self.retrieval_state is not None:
            self.retrieval_state.free(list(finished))
            self.retrieval_state.reset(list(restarted))

    def propose(
        self,
        num_speculative_tokens: int,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata: Any,
        sampling_metadata: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.method_config.policy != "full" and self.retrieval_state is not None:
            self._reduced_view = self._plan_reduced_view(
                num_speculative_tokens, target_positions, token_indices_to_sample, common_attn_metadata
            )
        try:
            return super().propose(
                num_speculative_tokens=num_speculative_tokens,
                target_token_ids=target_token_ids,
                target_positions=target_positions,
                target_hidden_states=target_hidden_states,
                next_token_ids=next_token_ids,
                token_indices_to_sample=token_indices_to_sample,
                common_attn_metadata=common_attn_metadata,
                sampling_metadata=sampling_metadata,
                **kwargs,
            )
        finally:
            self._reduced_view = None
            if self.stats.due_for_log():
                patches.logger.info("SpecExtend: %s", self.stats.summary())

    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata: Any, draft_index: int = 0
    ) -> tuple[list[object], dict[str, object]]:
        view = self._reduced_view
        if view is not None:
            num_rows = common_attn_metadata.seq_lens.shape[0]
            common_attn_metadata = dataclasses.replace(
                common_attn_metadata,
                block_table_tensor=view.block_table,
                seq_lens=common_attn_metadata.seq_lens - view.seq_len_offset[:num_rows],
            )
        return super().build_per_group_and_layer_attn_metadata(common_attn_metadata, draft_index)

    def _plan_reduced_view(
        self,
        num_speculative_tokens: int,
        target_positions: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata: Any,
    ) -> ReducedDraftView | None:
        """Selects chunks where due, then lays out this step's reduced block tables."""
        config = self.method_config
        state = self.retrieval_state
        assert state is not None and config.chunk_size is not None
        num_reqs = common_attn_metadata.num_reqs
        query_start_loc = common_attn_metadata.query_start_loc[: num_reqs + 1]
        query_lens = query_start_loc[1:] - query_start_loc[:-1]
        sample_rows = (
            query_start_loc[1:] - 1 if token_indices_to_sample is None else token_indices_to_sample
        ).long()
        context_lens = target_positions[sample_rows] + 1
        first_query_positions = target_positions[query_start_loc[:-1].long()]

        request_ids = self.runner.input_batch.req_ids[:num_reqs]
        slots = state.slots(request_ids)
        blocks_per_chunk = config.chunk_size // self.block_size
        tail_start_chunk = first_query_positions // config.chunk_size
        eligible = (context_lens >= config.activation_length) & (
            query_lens <= num_speculative_tokens + 1
        )
        steps_since_selection = state.steps_since_selection[slots]
        needs_selection = eligible & (
            (steps_since_selection < 0)
            | (steps_since_selection >= config.retrieval_interval)
            | (first_query_positions < state.tail_start_block[slots] * self.block_size)
        )
        selected_rows = needs_selection.nonzero().squeeze(1)
        if selected_rows.numel():
            self._select(
                request_ids,
                selected_rows,
                slots,
                sample_rows,
                context_lens,
                tail_start_chunk,
                common_attn_metadata,
                blocks_per_chunk,
            )

        active = eligible & (state.steps_since_selection[slots] >= 0)
        num_kept_blocks = torch.where(active, state.num_kept_blocks[slots], 0)
        tail_start_block = torch.where(active, state.tail_start_block[slots], 0)
        full_block_table = common_attn_metadata.block_table_tensor
        indices = reduced_block_indices(
            state.kept_blocks[slots], num_kept_blocks, tail_start_block, full_block_table.shape[1]
        )
        reduced = self._reduced_block_table_buffer(full_block_table)
        reduced[:num_reqs] = full_block_table[:num_reqs].gather(1, indices)
        reduced[num_reqs:] = full_block_table[num_reqs:]
        seq_len_offset = (tail_start_block - num_kept_blocks) * self.block_size
        state.steps_since_selection.index_add_(0, slots, active.long())
        self.stats.record_draft_step(active, context_lens, seq_len_offset)
        return ReducedDraftView(reduced, seq_len_offset.to(common_attn_metadata.seq_lens.dtype))

    def _select(
        self,
        request_ids: list[str],
        rows: torch.Tensor,
        slots: torch.Tensor,
        sample_rows: torch.Tensor,
        context_lens: torch.Tensor,
        tail_start_chunk: torch.Tensor,
        common_attn_metadata: Any,
        blocks_per_chunk: int,
    ) -> None:
        config = self.method_config
        assert self.retrieval_state is not None and config.chunk_size is not None
        num_candidates = tail_start_chunk[rows]
        chunk_scores = None
        if config.policy == "cmr":
            assert self.chunk_scorer is not None
            num_chunks = -(-common_attn_metadata.max_seq_len // config.chunk_size)
            chunk_scores = self.chunk_scorer(
                sample_rows[rows],
                common_attn_metadata.block_table_tensor[rows],
                context_lens[rows],
                num_chunks,
            )
        kept_chunks, num_kept_chunks = select_chunks(
            config.policy, chunk_scores, num_candidates, config.num_kept_chunks
        )
        self.retrieval_state.store(
            slots[rows],
            chunks_to_blocks(kept_chunks, blocks_per_chunk),
            num_kept_chunks * blocks_per_chunk,
            tail_start_chunk[rows] * blocks_per_chunk,
        )
        self.stats.record_selection(
            request_ids,
            rows,
            context_lens[rows],
            num_candidates,
            kept_chunks,
            num_kept_chunks,
        )

    def _reduced_block_table_buffer(self, full_block_table: torch.Tensor) -> torch.Tensor:
        buffer = self._reduced_block_table
        if buffer is None or buffer.shape != full_block_table.shape:
            buffer = torch.empty_like(full_block_table)
            self._reduced_block_table = buffer
        return buffer
