"""SpecExtendProposer: vLLM's draft-model proposer, with the method's rooms behind its
hooks. It builds them when the models load and hands each step to them:

- `retrieval.planner.RetrievalPlanner`: what each request's draft attends to this step;
- `trees.session.TreeSession`: the token trees, drafted here and verified by the target;
- `verification.routing.VerificationRouting`: the target layers' verification attention.

Everything else is vLLM's: the draft's first pass over the target's tokens and the chain
passes after it, with the reduced block tables swapped into their attention metadata. A
step that drafts nothing does not run the draft; the next one that does first writes the
draft's KV of the tokens it missed, in one pass (`algorithm.draft_lag`). Blocks of a prompt
cached whole that vLLM computes again get the draft's KV from their cached twins, and the
first pass leaves their tokens out but the last (`algorithm.block_twins`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from specextend_vllm.algorithm.block_twins import BlockTwins, TwinCopies, twin_copies
from specextend_vllm.algorithm.draft_lag import CatchUp, DraftLag, StepTokens
from specextend_vllm.algorithm.draft_vocab import KeptVocabLogits
from specextend_vllm.algorithm.kv_cache_layout import copy_blocks
from specextend_vllm.algorithm.prefill_window import SINK_BLOCKS, windowed_rows
from specextend_vllm.algorithm.positions import DraftRotation, WorkingCopies
from specextend_vllm.config import KEYS_FIXED_AT_LOAD, METHOD_NAME, SpecExtendConfig
from specextend_vllm.metrics import RetrievalMetrics
from specextend_vllm.profiling import (
    PRICING_PASS_TOKENS,
    PROMPT_PASS_MIN_TOKENS,
    DraftPassClock,
    device_synchronizer,
)
from specextend_vllm.retrieval.planner import DraftGeometry, ReducedDraftView, RetrievalPlanner
from specextend_vllm.final_layer_query import FinalLayerQuery
from specextend_vllm.retrieval.scoring import ChunkScorer
from specextend_vllm.retrieval.working_copies import DraftWorkingCopies
from specextend_vllm.trees.drafting import DraftTreePass
from specextend_vllm.trees.session import TreeSession
from specextend_vllm.verification.routing import VerificationRouting
from specextend_vllm.vllm_access import layers, logger
from specextend_vllm.vllm_access.attention import attends_on_cpu_backend
from specextend_vllm.vllm_access.attention_seam import (
    attention_layer_seam,
    limit_attention_window,
)
from specextend_vllm.vllm_access.cpu_int8 import cpu_flags, has_int8_dot_products
from specextend_vllm.vllm_access.config import (
    draft_trained_length,
    manager_block_size,
    working_copy_manager_blocks,
)
from specextend_vllm.vllm_access.parallel import mean_over_tensor_parallel_ranks
from specextend_vllm.vllm_access.quantization import (
    DRAFT_MODEL_PREFIX,
    match_ignored_layers_under_prefix,
)
from specextend_vllm.vllm_access.rotary import extend_draft_rotary_table, rotary_embedding_types
from specextend_vllm.vllm_access.runner import (
    DraftModelProposer,
    extension_attention_metadata,
    keep_tokens,
    request_ids,
    set_forward_context,
    split_attention_rows,
    token_ids,
)


class SpecExtendProposer(DraftModelProposer):
    def __init__(self, vllm_config: Any, device: torch.device, runner: Any = None):
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.runner = runner
        self.method_config = SpecExtendConfig(**vllm_config.additional_config[METHOD_NAME])
        self.metrics = RetrievalMetrics()
        self.trained_length = draft_trained_length(vllm_config.speculative_config)
        self.max_drafts = vllm_config.speculative_config.num_speculative_tokens
        self.draft_lag: DraftLag | None = None
        self._block_twins: Mapping[str, BlockTwins] = {}
        self._unrepaid_drafting = False
        self._prompt_tokens_priced = False
        self._kernel_blocks_per_block = 1
        self.planner: RetrievalPlanner | None = None
        self.tree_session: TreeSession | None = None
        self.verification: VerificationRouting | None = None
        self._chunk_scorer: ChunkScorer | None = None
        self._final_layer_query: FinalLayerQuery | None = None
        self._draft_layers: list[Any] = []
        self._rotation: DraftRotation | None = None
        self._working_copy_region = (0, 0)
        self._reduced_view: ReducedDraftView | None = None
        self._first_pass_sample_rows: torch.Tensor | None = None
        self._root_hidden_states: torch.Tensor | None = None
        self._windows_prompts = False

    # Loading: the models, then the rooms.

    def _create_draft_vllm_config(self) -> Any:
        draft_vllm_config = super()._create_draft_vllm_config()
        match_ignored_layers_under_prefix(draft_vllm_config.quant_config, DRAFT_MODEL_PREFIX)
        return draft_vllm_config

    def load_model(self, target_model: Any) -> None:
        super().load_model(target_model)
        self._set_draft_logits()
        self._draft_pass_clock = DraftPassClock(self.model, device_synchronizer(self.device))
        self._draft_layers = layers.attention_layers(self.vllm_config, self._draft_attn_layer_names)
        self._windows_prompts = all(attends_on_cpu_backend(layer) for layer in self._draft_layers)
        if self.method_config.prefill_window() is not None and not self._windows_prompts:
            logger.info(
                "SpecExtend: draft_prefill_window applies on vLLM's CPU attention backend; "
                "on this one the draft's prefill attends to whole prompts (proposals only)."
            )
        if self.method_config.uses_compact_positions() and self.trained_length < self.max_model_len:
            limit_attention_window(self._draft_layers, self.trained_length)
        final_layer = layers.target_final_attention_layer(
            self.vllm_config, self._draft_attn_layer_names
        )
        self._final_layer_query = FinalLayerQuery(final_layer.num_heads, final_layer.head_size)
        attention_layer_seam(final_layer).observe_query(self._final_layer_query.observe)
        self._chunk_scorer = ChunkScorer(
            self._final_layer_query,
            key_cache_view=lambda: layers.key_cache_view(final_layer),
            scale=final_layer.impl.scale,
            chunk_size=self.method_config.chunk_size,
            metrics=self.metrics,
            mean_over_ranks=mean_over_tensor_parallel_ranks(),
        )
        self._rotation = extend_draft_rotary_table(self.model, self.max_model_len)
        self._check_draft_rope(self.method_config)

    def _check_draft_rope(self, config: SpecExtendConfig) -> None:
        """What the configs showed was checked before loading; the loaded layers decide."""
        if self._rotation is None:
            types = ", ".join(rotary_embedding_types(self.model))
            config.check_draft_rope(f"not one plain RoPE ({types})")

    def _set_draft_logits(self) -> None:
        """The draft's logits come from the rows `draft_vocab` keeps (the other tokens get
        none), in the precision `draft_lm_head` gives."""
        ids = self.method_config.draft_vocab_ids()
        int8 = self._int8_lm_head()
        if ids is None and not int8:
            return
        vocab_size = self.vllm_config.speculative_config.draft_model_config.get_vocab_size()
        if ids is None:
            self.model.compute_logits = layers.lm_head_logits(
                self.model, torch.arange(vocab_size, device=self.device), int8
            )
        else:
            kept_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
            self.model.compute_logits = KeptVocabLogits(
                layers.lm_head_logits(self.model, kept_ids, int8), kept_ids, vocab_size
            )
        logger.info(
            "SpecExtend draft LM head: %d of %d tokens, %s",
            vocab_size if ids is None else len(ids),
            vocab_size,
            "int8 rows" if int8 else "as loaded",
        )

    def _int8_lm_head(self) -> bool:
        if self.method_config.draft_lm_head != "auto":
            return self.method_config.draft_lm_head == "int8"
        return (
            self.device.type == "cpu"
            and layers.has_int8_linear_layers(self.model)
            and layers.has_unquantized_lm_head(self.model)
            and has_int8_dot_products(cpu_flags()) is not False
        )

    def _target_layers(self) -> list[Any]:
        return layers.target_attention_layers(self.vllm_config, self._draft_attn_layer_names)

    def initialize_attn_backend(self, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().initialize_attn_backend(kv_cache_config, *args, **kwargs)
        config = self.method_config.check_block_size(self.block_size)
        assert self._chunk_scorer is not None and self._final_layer_query is not None
        target_layers = self._target_layers()
        if config.tree != "chain":
            self.tree_session = TreeSession(
                config,
                self.max_drafts,
                self.max_batch_size,
                self.device,
                lambda: [layers.raw_kv_cache(layer) for layer in target_layers],
                self._final_layer_query,
                self.block_size,
                self._draft_layers,
                self.dtype,
            )
        self.verification = VerificationRouting(
            target_layers,
            self.max_drafts + 1,
            self.device,
            self.metrics.record_hybrid_verification,
            self.metrics.record_native_verification,
            self.metrics.record_kernel_decode_step,
            self.tree_session,
        )
        self.verification.find_blockers()
        self.verification.route(config)
        reserved = working_copy_manager_blocks(self.vllm_config, kv_cache_config)
        kernel_blocks_per_manager_block = manager_block_size(kv_cache_config) // self.block_size
        self._kernel_blocks_per_block = kernel_blocks_per_manager_block
        self._working_copy_region = (
            (kv_cache_config.num_blocks - reserved) * kernel_blocks_per_manager_block,
            reserved * kernel_blocks_per_manager_block,
        )
        self.draft_lag = DraftLag(
            self.max_batch_size,
            kv_cache_config.num_blocks * kernel_blocks_per_manager_block,
            self.block_size,
        )
        self.planner = RetrievalPlanner(
            config,
            DraftGeometry(self.block_size, self.trained_length, rotates=self._rotation is not None),
            self.max_batch_size,
            self.max_drafts,
            DraftWorkingCopies(
                self._working_copies(config),
                lambda: [layers.raw_kv_cache(layer) for layer in self._draft_layers],
                self._rotation,
                config.chunk_size,
                self.block_size,
            ),
            self._chunk_scorer,
            self.metrics,
            self.device,
            mean_over_tensor_parallel_ranks(),
        )

    def _working_copies(self, config: SpecExtendConfig) -> WorkingCopies:
        return WorkingCopies(
            *self._working_copy_region,
            config.max_kept_tokens(self.block_size) // self.block_size,
            self.device,
        )

    # The running engine.

    def reconfigure(self, changes: Mapping[str, Any]) -> SpecExtendConfig:
        """Replaces some of the method's keys on a running engine, for example to compare
        policies on one prefill; every request selects its chunks afresh at its next step."""
        allowed = set(SpecExtendConfig.keys()) - set(KEYS_FIXED_AT_LOAD)
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise ValueError(
                f"cannot reconfigure {unknown} on a running engine; allowed keys: {sorted(allowed)}."
            )
        config = dataclasses.replace(self.method_config, **changes).check_block_size(
            self.block_size
        )
        config.check_draft_trained_length(self.trained_length)
        self._check_draft_rope(config)
        config.check_tree_combination({"num_speculative_tokens": self.max_drafts})
        if config.uses_working_copies(self.block_size) and not self._working_copy_region[1]:
            raise ValueError(
                f"cannot reconfigure to {config.to_dict()}: it drafts on working copies, and "
                "the engine started with positions 'absolute' and whole-block chunks, or "
                "policy 'full', so it set no KV cache blocks aside for them."
            )
        assert self.verification is not None and self.planner is not None
        self.verification.route(config)
        self.method_config = config
        self.planner.reconfigure(config, self._working_copies(config))
        logger.info("SpecExtend reconfigured: %s", self.method_config.to_dict())
        return self.method_config

    def num_tracked_requests(self) -> int:
        """Requests holding per-request state (retrieval, draft lag or tree slots): those
        running or preempted, never finished ones."""
        holders = (
            None if self.planner is None else self.planner.state,
            self.draft_lag,
            self.tree_session,
        )
        return len(set().union(*(holder.request_ids for holder in holders if holder is not None)))

    def on_requests_changed(self, finished: set[str], restarted: set[str]) -> None:
        if self.planner is not None:
            self.planner.state.free(list(finished))
            self.planner.state.reset(list(restarted))
        if self.tree_session is not None:
            self.tree_session.forget(list(finished))
        if self.draft_lag is not None:
            self.draft_lag.on_requests_changed(list(finished), list(restarted))

    def note_scheduled_step(self, twins: Mapping[str, BlockTwins], unrepaid_drafting: bool) -> None:
        """The cached twins the scheduler found of the blocks this step's requests compute
        (`algorithm.block_twins`), and whether it took the step's drafts back because they
        would not repay the draft's pending prompt work (`algorithm.prompt_work`)."""
        self._block_twins = twins
        self._unrepaid_drafting = unrepaid_drafting

    # A draft step.

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
        planner = self.planner
        num_reqs = common_attn_metadata.num_reqs
        batch_request_ids = request_ids(self.runner, num_reqs)
        # The planner reads the target's batch: its final-layer queries are the target's
        # tokens'. The draft's pass leaves out what the twin copies hold.
        target_batch = (
            target_positions,
            common_attn_metadata.query_start_loc[: num_reqs + 1],
            token_indices_to_sample,
        )
        copies = self._copies_twin_blocks(batch_request_ids, target_positions, common_attn_metadata)
        if copies is not None:
            (
                target_token_ids,
                target_positions,
                target_hidden_states,
                token_indices_to_sample,
                common_attn_metadata,
            ) = self._leaves_out_copied_tokens(
                copies,
                target_token_ids,
                target_positions,
                target_hidden_states,
                token_indices_to_sample,
                common_attn_metadata,
            )
        if self._unrepaid_drafting and not self._prompt_tokens_priced:
            self._price_prompt_tokens()
        passes = self._draft_pass_clock.start() if self._times_passes(common_attn_metadata) else []
        if self._skips_draft_or_catches_up(
            batch_request_ids, num_speculative_tokens, target_positions, common_attn_metadata
        ):
            self._draft_pass_clock.stop()
            self.metrics.record_skipped_draft_step(num_reqs)
            if self._unrepaid_drafting:
                self.metrics.record_unrepaid_drafting_step(num_reqs)
            return torch.empty(
                common_attn_metadata.batch_size(), 0, dtype=torch.int64, device=self.device
            )
        view = None
        if self.method_config.policy != "full" and planner is not None:
            view = planner.plan(
                batch_request_ids,
                *target_batch,
                common_attn_metadata.block_table_tensor,
                common_attn_metadata.max_seq_len,
                num_speculative_tokens,
            )
        self._reduced_view = view
        drafts_tree = self.tree_session is not None and num_speculative_tokens > 0
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
            if planner is not None:
                planner.working_copies.discard_pending()
            raise
        finally:
            self._reduced_view = None
            self._draft_pass_clock.stop()
        self._record_prompt_passes(passes, num_reqs)
        if planner is not None:
            planner.working_copies.first_pass_done()
        if drafts_tree:
            drafts = self._draft_tree(batch_request_ids, view, common_attn_metadata)
        return drafts

    def _times_passes(self, metadata: Any) -> bool:
        """Whether this step's draft may pass over prompts: a request lags (a catch-up), or
        one's pass is longer than a decoding step's."""
        assert self.draft_lag is not None
        return self.draft_lag.may_lag or bool(self._writes_prompt_kv(query_lens(metadata)).any())

    def _record_prompt_passes(self, passes: list[tuple[int, float]], num_reqs: int) -> None:
        """The step's draft passes over prompts, among its catch-up passes and first pass
        (the clock stops before the passes after it): of PROMPT_PASS_MIN_TOKENS tokens or
        more, and more than a decoding step's first pass (1 + k per request)."""
        least = max(PROMPT_PASS_MIN_TOKENS, num_reqs * (self.max_drafts + 1) + 1)
        prompt_passes = [(tokens, seconds) for tokens, seconds in passes if tokens >= least]
        if prompt_passes:
            self._prompt_tokens_priced = True
            self.metrics.record_prompt_pass(
                sum(tokens for tokens, _ in prompt_passes),
                sum(seconds for _, seconds in prompt_passes),
            )

    def _price_prompt_tokens(self) -> None:
        """Where the scheduler took a batch's drafts back because no pass over prompts had
        been timed yet: a pass of the draft over PRICING_PASS_TOKENS tokens, timed after one
        more that warms its kernels to the shape, gives prompt tokens their price. Its
        attention is left out (no metadata), a small share of a pass at these lengths; the
        passes over real prompts soon outweigh it (`algorithm.prompt_work`)."""
        num_tokens = min(PRICING_PASS_TOKENS, self.max_num_tokens)
        passes = self._draft_pass_clock.start()
        try:
            for _ in range(2):
                self.dummy_run(num_tokens, use_cudagraphs=False, is_graph_capturing=True)
        finally:
            self._draft_pass_clock.stop()
        self.metrics.record_prompt_pass(*passes[-1])
        self._prompt_tokens_priced = True

    def _skips_draft_or_catches_up(
        self,
        batch_request_ids: list[str],
        num_speculative_tokens: int,
        target_positions: torch.Tensor,
        metadata: Any,
    ) -> bool:
        """Whether the step skips the draft: where it drafts nothing (its prefills too: a
        request that never drafts never pays the draft's prefill), or, with `draft_prefill:
        deferred`, where every request prefills. A step that runs it first writes the
        draft's KV of the tokens its requests missed."""
        skips = num_speculative_tokens == 0
        if not skips and self.method_config.draft_prefill == "deferred":
            skips = bool(self._writes_prompt_kv(query_lens(metadata)).all())
        draft_lag = self.draft_lag
        assert draft_lag is not None
        if not skips and not draft_lag.may_lag:
            return False
        step = self._step_tokens(target_positions, metadata)
        if skips:
            draft_lag.skipped(batch_request_ids, step)
            return True
        catch_up = draft_lag.catch_up(batch_request_ids, step)
        if catch_up is not None:
            for piece in catch_up.pieces(self.max_num_tokens):
                self._catch_up(piece, metadata.block_table_tensor)
        return False

    def _step_tokens(self, target_positions: torch.Tensor, metadata: Any) -> StepTokens:
        num_reqs = metadata.num_reqs
        return StepTokens(
            first_positions=target_positions[metadata.query_start_loc[:num_reqs].long()]
            .cpu()
            .numpy(),
            query_lens=query_lens(metadata),
            block_table=metadata.block_table_tensor[:num_reqs].cpu().numpy(),
        )

    def _copies_twin_blocks(
        self, batch_request_ids: list[str], target_positions: torch.Tensor, metadata: Any
    ) -> TwinCopies | None:
        """Copies the draft's KV of the blocks this step computes again from their cached
        twins (`algorithm.block_twins`); None where nothing is copied."""
        twins, self._block_twins = self._block_twins, {}
        if not twins:
            return None
        step = self._step_tokens(target_positions, metadata)
        copies = twin_copies(
            batch_request_ids,
            twins,
            step,
            self.block_size * self._kernel_blocks_per_block,
            self._kernel_blocks_per_block,
        )
        if copies is None:
            return None
        source_blocks = torch.from_numpy(copies.sources).to(self.device)
        destination_blocks = torch.from_numpy(copies.destinations).to(self.device)
        for layer in self._draft_layers:
            copy_blocks(layers.raw_kv_cache(layer), source_blocks, destination_blocks)
        rows = np.nonzero(copies.rows)[0]
        assert self.draft_lag is not None
        self.draft_lag.copied(
            [batch_request_ids[row] for row in rows],
            step.select(rows),
            copies.sources,
            copies.destinations,
        )
        return copies

    def _leaves_out_copied_tokens(
        self,
        copies: TwinCopies,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        metadata: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, Any]:
        """The draft's first-pass inputs without the copied requests' tokens before their
        last one."""
        num_reqs = metadata.num_reqs
        query_start_loc = metadata.query_start_loc_cpu[: num_reqs + 1].numpy()
        kept_tokens, kept_start_loc = copies.kept_tokens(query_start_loc)
        left_out = np.cumsum(np.diff(query_start_loc) - np.diff(kept_start_loc))
        self.metrics.record_copied_prompt_tokens(int(left_out[-1]))
        if token_indices_to_sample is not None:
            token_indices_to_sample = token_indices_to_sample.clone()
            token_indices_to_sample[:num_reqs] -= torch.from_numpy(left_out).to(
                token_indices_to_sample
            )
        kept = torch.from_numpy(kept_tokens).to(self.device)
        return (
            target_token_ids[kept],
            target_positions[..., kept],
            target_hidden_states[kept],
            token_indices_to_sample,
            keep_tokens(metadata, kept_tokens, kept_start_loc),
        )

    def _catch_up(self, catch_up: CatchUp, block_table: torch.Tensor) -> None:
        """Writes the draft's KV of the tokens the lagging requests missed, attending to
        their full caches, before this step's selection reads it."""
        token_rows, positions = catch_up.token_rows_and_positions()
        input_ids = torch.from_numpy(token_ids(self.runner, token_rows, positions)).to(self.device)
        if self.use_heterogeneous_vocab:
            assert self.vocab_mapping is not None
            input_ids = self.vocab_mapping.map_target_to_draft_ids(input_ids)
        lagging_block_table = block_table[torch.from_numpy(catch_up.rows).to(self.device)]
        sub_rows = np.repeat(np.arange(catch_up.rows.shape[0]), catch_up.lengths)
        device_positions = torch.from_numpy(positions).to(self.device)
        slot_mapping = (
            lagging_block_table[
                torch.from_numpy(sub_rows).to(self.device), device_positions // self.block_size
            ].long()
            * self.block_size
            + device_positions % self.block_size
        )
        metadata = extension_attention_metadata(
            lagging_block_table,
            torch.from_numpy(catch_up.lengths).to(self.device),
            torch.from_numpy(catch_up.starts + catch_up.lengths).to(self.device),
            slot_mapping,
        )
        _, per_layer_metadata = super().build_per_group_and_layer_attn_metadata(
            self._windowed_prompt_passes(metadata), 0
        )
        names = self._draft_attn_layer_names
        with set_forward_context(
            per_layer_metadata,
            self.vllm_config,
            num_tokens=input_ids.shape[0],
            slot_mapping={name: slot_mapping for name in names},
        ):
            self.model(input_ids=input_ids, positions=device_positions, inputs_embeds=None)
        self.metrics.record_catch_up(catch_up.num_tokens)

    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata: Any, draft_index: int = 0
    ) -> tuple[list[object], dict[str, object]]:
        view = self._reduced_view
        if draft_index > 0:
            self._draft_pass_clock.stop()
        if draft_index > 0 and self.planner is not None:
            self.planner.working_copies.first_pass_done()
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
        if draft_index == 0:
            common_attn_metadata = self._windowed_prompt_passes(common_attn_metadata)
        return super().build_per_group_and_layer_attn_metadata(common_attn_metadata, draft_index)

    def _writes_prompt_kv(self, query_lens: np.ndarray) -> np.ndarray:
        """[num_reqs] whether each request's pass is longer than any drafting step's k + 1
        tokens: a prompt's prefill (or a piece of it) or a catch-up pass."""
        return query_lens > self.max_drafts + 1

    def _windowed_prompt_passes(self, metadata: Any) -> Any:
        """With `draft_prefill_window`, the pass's requests of more than k + 1 tokens
        (prompts, catch-up) as rows of pieces, each attending to the sink block and its
        window (`algorithm.prefill_window`); the metadata as it was otherwise."""
        window = self.method_config.prefill_window()
        if window is None or not self._windows_prompts:
            return metadata
        num_reqs = metadata.num_reqs
        query_start_loc = metadata.query_start_loc_cpu[: num_reqs + 1].numpy().astype(np.int64)
        long_queries = self._writes_prompt_kv(np.diff(query_start_loc))
        if not long_queries.any():
            return metadata
        seq_lens = metadata.seq_lens[:num_reqs].cpu().numpy().astype(np.int64)
        split = windowed_rows(query_start_loc, seq_lens, long_queries, window, self.block_size)
        if split is None:
            return metadata
        block_table = metadata.block_table_tensor[torch.from_numpy(split.rows).to(self.device)]
        block_table = block_table.gather(1, split.block_indices(block_table.shape[1], self.device))
        windowed = split_attention_rows(
            metadata, split.rows, split.query_start_loc, split.cut, block_table
        )
        if windowed is None:
            return metadata
        self.metrics.record_windowed_prompt_tokens(
            int(np.diff(split.query_start_loc)[split.tail_start_block > SINK_BLOCKS].sum())
        )
        return windowed

    def set_inputs_first_pass(self, *args: Any, **kwargs: Any) -> Any:
        num_tokens, sample_rows, metadata = super().set_inputs_first_pass(*args, **kwargs)
        self._first_pass_sample_rows = sample_rows
        return num_tokens, sample_rows, metadata

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any) -> Any:
        if self.tree_session is not None:
            self._root_hidden_states = hidden_states
        return super()._sample_draft_tokens(hidden_states, sampling_metadata)

    def _draft_tree(
        self,
        batch_request_ids: list[str],
        view: ReducedDraftView | None,
        common_attn_metadata: Any,
    ) -> torch.Tensor:
        """The rest of each request's tree, below the root vLLM's first pass drafted."""
        assert self.tree_session is not None
        root_hidden_states, self._root_hidden_states = self._root_hidden_states, None
        assert root_hidden_states is not None and self._first_pass_sample_rows is not None
        num_reqs = root_hidden_states.shape[0]
        root_positions = self.positions[self._first_pass_sample_rows].long()[:num_reqs]
        block_table = common_attn_metadata.block_table_tensor[:num_reqs]
        offsets = torch.zeros_like(root_positions)
        if view is not None:
            block_table = view.block_table[:num_reqs]
            offsets = view.seq_len_offset[:num_reqs].long()
        tokens = self.tree_session.draft(
            batch_request_ids,
            self._draft_logits(root_hidden_states),
            root_positions,
            block_table,
            root_positions + 1 - offsets,
            self._tree_pass_forward,
            self._draft_logits,
        )
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


def query_lens(metadata: Any) -> np.ndarray:
    """[num_reqs] the tokens each request's pass computes this step."""
    return np.diff(metadata.query_start_loc_cpu[: metadata.num_reqs + 1].numpy())
