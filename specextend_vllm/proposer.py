"""SpecExtendProposer: vLLM's draft-model proposer drafting over retrieved chunks.

Glue: each step it derives a `DraftStep` from vLLM's batch, asks the algorithm which
requests select chunks and which chunks they keep, runs the ops (chunk scores, working
copies), and hands the draft a reduced block table.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from specextend_vllm.algorithm.draft_step import DraftStep
from specextend_vllm.algorithm.draft_vocab import scatter_kept_logits
from specextend_vllm.algorithm.positions import (
    DraftRotation,
    WorkingCopies,
    copy_kept_tokens,
    packed_chunk_tokens,
    packed_copy_slots,
)
from specextend_vllm.algorithm.retrieval_state import RetrievalState
from specextend_vllm.algorithm.selection import (
    chunks_to_blocks,
    kept_attention_share,
    reduced_block_indices,
    select_chunks,
)
from specextend_vllm.algorithm.triggers import due_by_schedule, lost_attention_share
from specextend_vllm.config import METHOD_NAME, SpecExtendConfig
from specextend_vllm.metrics import RetrievalMetrics
from specextend_vllm.scoring import ChunkScorer, FinalLayerQuery
from specextend_vllm.vllm_access.attention_seam import (
    AttentionLayerSeam,
    attention_layer_seam,
    limit_attention_window,
)
from specextend_vllm.vllm_access.rotary import extend_draft_rotary_table
from specextend_vllm.tree_drafting import (
    DraftTreeAttention,
    DraftTreePass,
    DynamicTreeDrafter,
    StaticTreeDrafter,
    TreePasses,
)
from specextend_vllm.tree_verification import TreeVerifier
from specextend_vllm.verification import (
    HybridVerificationAttention,
    PrefixAttention,
    cpu_prefix_attention,
    flash_attn_prefix_attention,
)
from specextend_vllm.vllm_access import layers, logger
from specextend_vllm.vllm_access.attention import (
    hybrid_cache_layout_blocker,
    plain_attention_blockers,
)
from specextend_vllm.vllm_access.parallel import mean_over_tensor_parallel_ranks
from specextend_vllm.vllm_access.config import (
    draft_trained_length,
    manager_block_size,
    working_copy_manager_blocks,
)
from specextend_vllm.vllm_access.quantization import (
    DRAFT_MODEL_PREFIX,
    match_ignored_layers_under_prefix,
)
from specextend_vllm.vllm_access.runner import (
    DraftModelProposer,
    request_ids,
    set_forward_context,
)


@dataclasses.dataclass
class ReducedDraftView:
    """What the draft attends to in one propose() call: a block table holding the kept
    blocks (or the working copy of the kept chunks) then the tail blocks, and how many
    tokens shorter each reduced sequence is. The first pass, which writes the draft's KV
    of the target's tokens, attends to the full cache for prompts: `first_pass_*`."""

    block_table: torch.Tensor
    seq_len_offset: torch.Tensor
    first_pass_block_table: torch.Tensor
    first_pass_seq_len_offset: torch.Tensor


class SpecExtendProposer(DraftModelProposer):
    def __init__(self, vllm_config: Any, device: torch.device, runner: Any = None):
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.runner = runner
        self.method_config = SpecExtendConfig(**vllm_config.additional_config[METHOD_NAME])
        self.metrics = RetrievalMetrics()
        self.retrieval_state: RetrievalState | None = None
        self.chunk_scorer: ChunkScorer | None = None
        self._reduced_view: ReducedDraftView | None = None
        self._copies_after_first_pass: Callable[[], None] | None = None
        self._reduced_block_table: torch.Tensor | None = None
        self.rotation: DraftRotation | None = None
        self.trained_length = draft_trained_length(vllm_config.speculative_config)
        self._working_copy_region = (0, 0)
        self.working_copies: WorkingCopies | None = None
        self._draft_layers: list[Any] = []
        self._verification_paths: list[tuple[AttentionLayerSeam, HybridVerificationAttention]] = []
        self._verification_blockers: list[str] = []
        self.drafts_trees = self.method_config.tree != "chain"
        self.tree_verifier: TreeVerifier | None = None
        self.tree_drafter: StaticTreeDrafter | DynamicTreeDrafter | None = None
        self._tree_parents: torch.Tensor | None = None
        self._final_layer_query: FinalLayerQuery | None = None
        self._first_pass_sample_rows: torch.Tensor | None = None
        self._root_hidden_states: torch.Tensor | None = None

    def _restrict_draft_vocab(self) -> None:
        """With `draft_vocab`, the draft's logits come from the kept rows of its LM head."""
        ids = self.method_config.draft_vocab_ids()
        if ids is None:
            return
        kept_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        kept_logits = layers.kept_rows_logits(self.model, kept_ids)
        vocab_size = self.vllm_config.speculative_config.draft_model_config.get_vocab_size()
        self.model.compute_logits = lambda hidden_states: scatter_kept_logits(
            kept_logits(hidden_states), kept_ids, vocab_size
        )
        logger.info("SpecExtend draft vocabulary: %d of its tokens kept", len(ids))

    @property
    def _prefix_attention(self) -> PrefixAttention:
        return flash_attn_prefix_attention if self.device.type == "cuda" else cpu_prefix_attention

    def _create_draft_vllm_config(self) -> Any:
        draft_vllm_config = super()._create_draft_vllm_config()
        match_ignored_layers_under_prefix(draft_vllm_config.quant_config, DRAFT_MODEL_PREFIX)
        return draft_vllm_config

    def load_model(self, target_model: Any) -> None:
        super().load_model(target_model)
        self._restrict_draft_vocab()
        self.rotation = extend_draft_rotary_table(self.model, self.max_model_len)
        self._draft_layers = layers.attention_layers(self.vllm_config, self._draft_attn_layer_names)
        if self.method_config.uses_compact_positions() and self.trained_length < self.max_model_len:
            limit_attention_window(self._draft_layers, self.trained_length)
        layer = layers.target_final_attention_layer(self.vllm_config, self._draft_attn_layer_names)
        final_layer_query = FinalLayerQuery(layer.num_heads, layer.head_size)
        attention_layer_seam(layer).observe_query(final_layer_query.observe)
        self._final_layer_query = final_layer_query
        self.chunk_scorer = ChunkScorer(
            final_layer_query,
            key_cache_view=lambda: layers.key_cache_view(layer),
            scale=layer.impl.scale,
            chunk_size=self.method_config.chunk_size,
            metrics=self.metrics,
            mean_over_ranks=mean_over_tensor_parallel_ranks(),
        )
        self._prepare_verification_paths()

    def _prepare_verification_paths(self) -> None:
        """One hybrid verification path per target attention layer, routed or not by
        `verification_attention` once the layers' cache layouts are known."""
        target_layers = layers.target_attention_layers(
            self.vllm_config, self._draft_attn_layer_names
        )
        self._verification_paths = [
            (
                attention_layer_seam(layer),
                HybridVerificationAttention(
                    layer.impl.scale,
                    self.num_speculative_tokens + 1,
                    self._prefix_attention,
                    self.metrics.record_hybrid_verification if index == 0 else None,
                    self._tree_attention_step if self.drafts_trees else None,
                ),
            )
            for index, layer in enumerate(target_layers)
        ]

    def _find_verification_blockers(self) -> None:
        """What keeps hybrid attention from verifying exactly, read off the target's
        layers: the configs' view checked before loading, and what only the layers show
        (attention sinks, the backend's cache layout)."""
        target_layers = layers.target_attention_layers(
            self.vllm_config, self._draft_attn_layer_names
        )
        self._verification_blockers = sorted(
            {
                blocker
                for layer in target_layers
                for blocker in [*plain_attention_blockers(layer.impl), hybrid_cache_layout_blocker(layer)]
                if blocker is not None
            }
        )

    def _route_verification(self, config: SpecExtendConfig) -> None:
        verification = config.exact_verification_attention(
            self._verification_blockers, self.device.type
        )
        for seam, path in self._verification_paths:
            seam.compute_with(path if verification == "hybrid" else None)
        logger.info("SpecExtend: verification attention %s", verification)

    def initialize_attn_backend(self, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().initialize_attn_backend(kv_cache_config, *args, **kwargs)
        self.method_config.check_block_size(self.block_size)
        self._find_verification_blockers()
        self._route_verification(self.method_config)
        reserved = working_copy_manager_blocks(self.vllm_config, kv_cache_config)
        kernel_blocks_per_manager_block = manager_block_size(kv_cache_config) // self.block_size
        self._working_copy_region = (
            (kv_cache_config.num_blocks - reserved) * kernel_blocks_per_manager_block,
            reserved * kernel_blocks_per_manager_block,
        )
        self.retrieval_state = self._new_retrieval_state()
        if self.drafts_trees:
            self._prepare_trees()

    def _prepare_trees(self) -> None:
        """The tree verifier for the target's steps, and tree attention in every draft
        layer (used by tree passes only)."""
        assert self._final_layer_query is not None
        num_nodes = self.num_speculative_tokens
        static_tree = self.method_config.token_tree()
        if static_tree is not None:
            self.tree_drafter = StaticTreeDrafter(static_tree, self.device)
            max_depth = static_tree.max_depth
        else:
            branching, width, max_depth = self.method_config.dynamic_tree_shape(num_nodes)
            self.tree_drafter = DynamicTreeDrafter(num_nodes, branching, width, max_depth, self.device)
        self._tree_parents = torch.zeros(
            self.max_batch_size, num_nodes + 1, dtype=torch.long, device=self.device
        )
        target_layers = layers.target_attention_layers(
            self.vllm_config, self._draft_attn_layer_names
        )
        self.tree_verifier = TreeVerifier(
            num_nodes,
            max_depth,
            self.device,
            lambda: [layers.raw_kv_cache(layer) for layer in target_layers],
            self._final_layer_query,
            self.block_size,
        )
        for index, layer in enumerate(self._draft_layers):
            attention_layer_seam(layer).compute_with(
                DraftTreeAttention(index, layer.impl.scale, self._prefix_attention)
            )

    def _tree_attention_step(self) -> Any:
        return None if self.tree_verifier is None else self.tree_verifier.attention_step()

    def tree_parents_of_batch(self, num_reqs: int) -> torch.Tensor:
        """[R, N + 1] the tree each request of the runner's batch drafted last."""
        assert self._tree_parents is not None and self.retrieval_state is not None
        slots = self.retrieval_state.slots(request_ids(self.runner, num_reqs))
        return self._tree_parents[slots]

    def reconfigure(self, changes: Mapping[str, Any]) -> SpecExtendConfig:
        """Replaces some of the method's keys on a running engine, for example to compare
        policies on one prefill; every request selects its chunks afresh at its next step."""
        allowed = set(SpecExtendConfig.keys()) - {"drafting", "tree", "draft_vocab"}
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise ValueError(
                f"cannot reconfigure {unknown} on a running engine; allowed keys: {sorted(allowed)}."
            )
        config = dataclasses.replace(self.method_config, **changes).check_block_size(
            self.block_size
        )
        config.check_draft_trained_length(self.trained_length)
        config.check_tree_combination({"num_speculative_tokens": self.num_speculative_tokens})
        if config.uses_working_copies(self.block_size) and not self._working_copy_region[1]:
            raise ValueError(
                f"cannot reconfigure to {config.to_dict()}: it drafts on working copies, and "
                "the engine started with positions 'absolute' and whole-block chunks, or "
                "policy 'full', so it set no KV cache blocks aside for them."
            )
        self._route_verification(config)
        self.method_config = config
        assert self.chunk_scorer is not None
        self.chunk_scorer.chunk_size = config.chunk_size
        self.retrieval_state = self._new_retrieval_state()
        if self._tree_parents is not None:
            self._tree_parents.zero_()
        logger.info("SpecExtend reconfigured: %s", self.method_config.to_dict())
        return self.method_config

    def _new_retrieval_state(self) -> RetrievalState:
        config = self.method_config
        self.working_copies = WorkingCopies(
            *self._working_copy_region,
            config.max_kept_tokens(self.block_size) // self.block_size,
            self.device,
        )
        return RetrievalState(
            self.max_batch_size, config.num_kept_chunks(self.block_size), self.device
        )

    def num_tracked_requests(self) -> int:
        """Requests holding retrieval state: those running or preempted, never finished ones."""
        return 0 if self.retrieval_state is None else len(self.retrieval_state)

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
        view = None
        if self.method_config.policy != "full" and self.retrieval_state is not None:
            view = self._plan_reduced_view(
                num_speculative_tokens,
                target_positions,
                token_indices_to_sample,
                common_attn_metadata,
            )
        self._reduced_view = view
        drafts_tree = self.drafts_trees and num_speculative_tokens > 0
        try:
            drafts = super().propose(
                num_speculative_tokens=1 if drafts_tree else num_speculative_tokens,
                target_token_ids=target_token_ids,
                target_positions=target_positions,
                target_hidden_states=target_hidden_states,
                next_token_ids=next_token_ids,
                token_indices_to_sample=token_indices_to_sample,
                common_attn_metadata=common_attn_metadata,
                sampling_metadata=sampling_metadata,
                **kwargs,
            )
        except BaseException:
            self._copies_after_first_pass = None
            raise
        finally:
            self._reduced_view = None
        self._build_copies_after_first_pass()
        if drafts_tree:
            drafts = self._draft_tree(view, common_attn_metadata)
        return drafts

    def set_inputs_first_pass(self, *args: Any, **kwargs: Any) -> Any:
        num_tokens, sample_rows, metadata = super().set_inputs_first_pass(*args, **kwargs)
        self._first_pass_sample_rows = sample_rows
        return num_tokens, sample_rows, metadata

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any) -> Any:
        if self.tree_drafter is not None:
            self._root_hidden_states = hidden_states
        return super()._sample_draft_tokens(hidden_states, sampling_metadata)

    def _draft_tree(self, view: ReducedDraftView | None, common_attn_metadata: Any) -> torch.Tensor:
        """Drafts the rest of each request's tree below the root the first pass drafted
        from, and keeps its shape for the verification."""
        assert self.tree_drafter is not None and self._tree_parents is not None
        assert self.retrieval_state is not None
        root_hidden_states, self._root_hidden_states = self._root_hidden_states, None
        assert root_hidden_states is not None and self._first_pass_sample_rows is not None
        num_reqs = root_hidden_states.shape[0]
        root_positions = self.positions[self._first_pass_sample_rows].long()[:num_reqs]
        reduced_block_table = common_attn_metadata.block_table_tensor[:num_reqs]
        offsets = torch.zeros_like(root_positions)
        if view is not None:
            reduced_block_table = view.block_table[:num_reqs]
            offsets = view.seq_len_offset[:num_reqs].long()
        layer = self._draft_layers[0]
        passes = TreePasses.allocate(
            self.tree_drafter.num_buffer_nodes,
            (layer.num_kv_heads, layer.head_size, self.dtype),
            len(self._draft_layers),
            root_positions=root_positions,
            reduced_block_table=reduced_block_table,
            reduced_prefix_lens=root_positions + 1 - offsets,
            forward=self._tree_pass_forward,
            compute_logits=self._draft_logits,
        )
        tokens, parents = self.tree_drafter.draft(self._draft_logits(root_hidden_states), passes)
        slots = self.retrieval_state.slots(request_ids(self.runner, num_reqs))
        self._tree_parents[slots] = parents
        if self.use_heterogeneous_vocab:
            assert self.vocab_mapping is not None
            tokens = self.vocab_mapping.map_draft_to_target_ids(tokens)
        return tokens

    def _draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The draft's logits; with another tokenizer, over the tokens both vocabularies
        share only (the tree is drafted in the draft's ids, mapped to the target's at the
        end)."""
        logits = self.model.compute_logits(hidden_states)
        if self.use_heterogeneous_vocab:
            assert self.vocab_mapping is not None
            logits = self.vocab_mapping.constrain_draft_logits(logits)
        return logits

    def _tree_pass_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        tree_pass: DraftTreePass,
    ) -> torch.Tensor:
        names = self._draft_attn_layer_names
        with set_forward_context(
            {name: tree_pass for name in names},
            self.vllm_config,
            num_tokens=input_ids.shape[0],
            slot_mapping={name: slot_mapping for name in names},
        ):
            hidden_states = self.model(input_ids=input_ids, positions=positions, inputs_embeds=None)
        return hidden_states[0] if self.model_returns_tuple() else hidden_states

    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata: Any, draft_index: int = 0
    ) -> tuple[list[object], dict[str, object]]:
        view = self._reduced_view
        if draft_index > 0:
            self._build_copies_after_first_pass()
        if view is not None:
            num_rows = common_attn_metadata.seq_lens.shape[0]
            block_table, seq_len_offset = (
                (view.first_pass_block_table, view.first_pass_seq_len_offset)
                if draft_index == 0
                else (view.block_table, view.seq_len_offset)
            )
            common_attn_metadata = dataclasses.replace(
                common_attn_metadata,
                block_table_tensor=block_table,
                seq_lens=common_attn_metadata.seq_lens - seq_len_offset[:num_rows],
            )
        return super().build_per_group_and_layer_attn_metadata(common_attn_metadata, draft_index)

    def _plan_reduced_view(
        self,
        num_speculative_tokens: int,
        target_positions: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata: Any,
    ) -> ReducedDraftView:
        """Selects chunks where due, then lays out this step's reduced block tables."""
        config = self.method_config
        state, copies = self.retrieval_state, self.working_copies
        assert state is not None and copies is not None
        num_reqs = common_attn_metadata.num_reqs
        batch_request_ids = request_ids(self.runner, num_reqs)
        step = DraftStep.from_target_batch(
            slots=state.slots(batch_request_ids),
            target_positions=target_positions,
            query_start_loc=common_attn_metadata.query_start_loc[: num_reqs + 1],
            token_indices_to_sample=token_indices_to_sample,
            block_table=common_attn_metadata.block_table_tensor,
            max_seq_len=common_attn_metadata.max_seq_len,
            tail_alignment=max(config.chunk_size, self.block_size),
            activation_length=config.activation_length,
            num_speculative_tokens=num_speculative_tokens,
        )
        slots = step.slots
        compact = self._drafts_compact(step.context_lens, slots)
        chunks_within_blocks = self._chunks_within_blocks
        on_copy = copies.has_copy(slots) & (compact | chunks_within_blocks)
        reducible = step.eligible & (on_copy | (not chunks_within_blocks))
        needs_selection = due_by_schedule(
            reducible,
            state.steps_since_selection[slots],
            step.newest_positions,
            state.tail_start[slots],
            compact,
            state.compact[slots],
            config.retrieval_interval,
        ) | (reducible & step.prefilling)
        if config.retrieval_trigger == "adaptive":
            selected = state.steps_since_selection[slots] >= 0
            needs_selection |= self._adaptive_trigger(
                step, reducible & selected & ~needs_selection
            )
        selected_rows = needs_selection.nonzero().squeeze(1)
        if selected_rows.numel():
            self._select(step, selected_rows, compact, on_copy, batch_request_ids)

        active = reducible & (state.steps_since_selection[slots] >= 0)
        kept_tokens = torch.where(active, state.num_kept_chunks[slots] * config.chunk_size, 0)
        tail_start = torch.where(active, state.tail_start[slots], 0)
        full_block_table = step.block_table
        reduced = self._reduced_block_table_buffer(full_block_table)
        reduced[:num_reqs] = full_block_table[:num_reqs].gather(
            1,
            reduced_block_indices(
                self._kept_logical_blocks(slots),
                kept_tokens // self.block_size,
                tail_start // self.block_size,
                full_block_table.shape[1],
            ),
        )
        reduced[num_reqs:] = full_block_table[num_reqs:]
        drafts_on_copy = active & on_copy
        self._point_kept_blocks_to_working_copies(
            reduced[:num_reqs], slots, drafts_on_copy, kept_tokens // self.block_size
        )
        seq_len_offset = tail_start - kept_tokens
        state.steps_since_selection.index_add_(0, slots, active.long())
        self.metrics.record_draft_step(
            active,
            active & state.compact[slots],
            step.context_lens,
            seq_len_offset,
            step.verified_drafts,
            step.accepted_drafts,
            state.drafted_reduced[slots],
        )
        state.drafted_reduced[slots] = active
        seq_len_offset = seq_len_offset.to(common_attn_metadata.seq_lens.dtype)
        first_pass_reduced = active & ~step.prefilling
        first_pass_block_table = reduced
        if not bool(first_pass_reduced.all()):
            first_pass_block_table = full_block_table.clone()
            first_pass_block_table[:num_reqs] = torch.where(
                first_pass_reduced[:, None], reduced[:num_reqs], full_block_table[:num_reqs]
            )
        return ReducedDraftView(
            reduced,
            seq_len_offset,
            first_pass_block_table,
            torch.where(first_pass_reduced, seq_len_offset, 0),
        )

    @property
    def _chunks_within_blocks(self) -> bool:
        """Chunks smaller than a KV block: the draft reads them from working copies only."""
        return self.method_config.chunk_size % self.block_size != 0

    def _kept_logical_blocks(self, slots: torch.Tensor) -> torch.Tensor:
        """The logical blocks of the kept chunks, where chunks are whole blocks; a
        placeholder column otherwise, as every kept chunk is then read from a copy."""
        state = self.retrieval_state
        assert state is not None
        if self._chunks_within_blocks:
            return torch.zeros(slots.shape[0], 1, dtype=torch.int64, device=slots.device)
        return chunks_to_blocks(
            state.kept_chunks[slots], self.method_config.chunk_size // self.block_size
        )

    def _drafts_compact(self, context_lens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Which requests draft on compact positions: by the `positions` key, where the
        draft's RoPE allows it and the request's slot has a working copy."""
        config = self.method_config
        assert self.working_copies is not None
        if not config.uses_compact_positions() or self.rotation is None:
            return torch.zeros_like(context_lens, dtype=torch.bool)
        wanted = (
            context_lens > self.trained_length
            if config.positions == "auto"
            else torch.ones_like(context_lens, dtype=torch.bool)
        )
        return wanted & self.working_copies.has_copy(slots)

    def _adaptive_trigger(self, step: DraftStep, watched: torch.Tensor) -> torch.Tensor:
        """Requests whose last verification accepted no draft token, or whose kept chunks
        lost attention share since their selection."""
        triggered = watched & (step.accepted_drafts == 0)
        rows = (watched & ~triggered).nonzero().squeeze(1)
        if rows.numel():
            state = self.retrieval_state
            assert state is not None
            row_slots = step.slots[rows]
            share = kept_attention_share(
                self._chunk_scores(step, rows),
                state.kept_chunks[row_slots],
                state.num_kept_chunks[row_slots],
                state.tail_start[row_slots] // self.method_config.chunk_size,
            )
            lost = lost_attention_share(share, state.selected_share[row_slots])
            triggered = triggered.index_put((rows,), lost | triggered[rows])
        return triggered

    def _chunk_scores(self, step: DraftStep, rows: torch.Tensor) -> torch.Tensor:
        assert self.chunk_scorer is not None
        return self.chunk_scorer(
            step.sample_rows[rows],
            step.block_table[rows],
            step.context_lens[rows],
            -(-step.max_seq_len // self.method_config.chunk_size),
        )

    def _select(
        self,
        step: DraftStep,
        rows: torch.Tensor,
        compact: torch.Tensor,
        on_copy: torch.Tensor,
        batch_request_ids: list[str],
    ) -> None:
        config = self.method_config
        assert self.retrieval_state is not None
        num_candidates = step.tail_start[rows] // config.chunk_size
        chunk_scores = None
        if config.policy == "cmr" or config.retrieval_trigger == "adaptive":
            chunk_scores = self._chunk_scores(step, rows)
        kept_chunks, num_kept_chunks = select_chunks(
            config.policy, chunk_scores, num_candidates, config.num_kept_chunks(self.block_size)
        )
        selected_share = (
            torch.zeros(rows.shape, device=rows.device)
            if chunk_scores is None
            else kept_attention_share(chunk_scores, kept_chunks, num_kept_chunks, num_candidates)
        )
        self.retrieval_state.store(
            step.slots[rows],
            kept_chunks,
            num_kept_chunks,
            step.tail_start[rows],
            compact[rows],
            selected_share,
        )
        copy_rows = rows[on_copy[rows] & ~step.prefilling[rows]]
        if copy_rows.numel():
            self._build_working_copies(copy_rows, step.slots, compact, step.block_table)
        prompt_rows = rows[on_copy[rows] & step.prefilling[rows]]
        if prompt_rows.numel():
            # Kept chunks of a prompt may lie in this step's tokens, whose draft KV the
            # draft's first pass writes: copy them once it has run.
            self._copies_after_first_pass = functools.partial(
                self._build_working_copies, prompt_rows, step.slots, compact, step.block_table
            )
        self.metrics.record_selection(
            batch_request_ids,
            rows,
            step.context_lens[rows],
            num_candidates,
            kept_chunks,
            num_kept_chunks,
        )

    def _build_working_copies(
        self,
        rows: torch.Tensor,
        slots: torch.Tensor,
        compact: torch.Tensor,
        full_block_table: torch.Tensor,
    ) -> None:
        """Packs the kept chunks of these requests side by side into their working
        copies, in every draft layer; on compact positions the keys are re-rotated so
        that the kept tokens end where the tail starts."""
        state, copies, rotation = self.retrieval_state, self.working_copies, self.rotation
        assert state is not None and copies is not None
        row_slots = slots[rows]
        sources, shifts, is_kept = packed_chunk_tokens(
            state.kept_chunks[row_slots],
            state.num_kept_chunks[row_slots],
            self.method_config.chunk_size,
            state.tail_start[row_slots],
        )
        source_slots, copy_slots = packed_copy_slots(
            full_block_table[rows], copies.block_ids(row_slots), sources, is_kept, self.block_size
        )
        cos_sin = None
        if bool(compact[rows].any()):
            assert rotation is not None
            token_shifts = torch.where(compact[rows][:, None], shifts, 0)[is_kept]
            cos_sin = rotation.cos_sin[token_shifts]
        for layer in self._draft_layers:
            copy_kept_tokens(layers.raw_kv_cache(layer), source_slots, copy_slots, cos_sin, rotation)

    def _build_copies_after_first_pass(self) -> None:
        build, self._copies_after_first_pass = self._copies_after_first_pass, None
        if build is not None:
            build()

    def _point_kept_blocks_to_working_copies(
        self,
        reduced_block_table: torch.Tensor,
        slots: torch.Tensor,
        drafts_on_copy: torch.Tensor,
        num_kept_blocks: torch.Tensor,
    ) -> None:
        copies = self.working_copies
        assert copies is not None
        if not copies.num_copies:
            return
        width = min(copies.blocks_per_copy, reduced_block_table.shape[1])
        columns = torch.arange(width, device=slots.device)[None, :]
        on_copy = drafts_on_copy[:, None] & (columns < num_kept_blocks[:, None])
        kept_part = reduced_block_table[:, :width]
        reduced_block_table[:, :width] = torch.where(
            on_copy, copies.block_ids(slots)[:, :width].to(kept_part.dtype), kept_part
        )

    def _reduced_block_table_buffer(self, full_block_table: torch.Tensor) -> torch.Tensor:
        buffer = self._reduced_block_table
        if buffer is None or buffer.shape != full_block_table.shape:
            buffer = torch.empty_like(full_block_table)
            self._reduced_block_table = buffer
        return buffer
