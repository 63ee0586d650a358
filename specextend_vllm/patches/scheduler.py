"""Scheduler seams."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from vllm.config import VllmConfig
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from specextend_vllm import profiling
from specextend_vllm.algorithm.answer_length import AnswerLengths
from specextend_vllm.algorithm.block_twins import BlockTwins
from specextend_vllm.algorithm.draft_acceptance import accepted_shares
from specextend_vllm.algorithm.draft_length import DraftLengthChooser
from specextend_vllm.algorithm.prompt_work import (
    MIN_BATCH_SIZE,
    MissingDraftTokens,
    PromptWork,
    drafting_repays,
)
from specextend_vllm.metrics import DecodingSteps
from specextend_vllm.patches.base import VllmDataclassField, VllmPatch
from specextend_vllm.vllm_access import logger
from specextend_vllm.vllm_access.config import specextend_config, working_copy_manager_blocks
from specextend_vllm.vllm_access.prefix_cache import recomputed_block_twins


class SchedulerLeavesWorkingCopyBlocks(VllmPatch):
    """With working copies (compact positions, or chunks smaller than a block) the
    scheduler allocates from fewer blocks than the workers hold: the last ones keep the
    draft's copies of its kept chunks."""

    target = Scheduler
    attribute = "__init__"

    @staticmethod
    def replacement(
        self: Any,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        reserved = working_copy_manager_blocks(vllm_config, kv_cache_config)
        if reserved:
            logger.info(
                "SpecExtend: %d of %d KV cache blocks hold the draft's working copies",
                reserved,
                kv_cache_config.num_blocks,
            )
            kv_cache_config = dataclasses.replace(
                kv_cache_config, num_blocks=kv_cache_config.num_blocks - reserved
            )
        SchedulerLeavesWorkingCopyBlocks.original(
            self, vllm_config, kv_cache_config, *args, **kwargs
        )


def draft_length_chooser(scheduler: Any) -> DraftLengthChooser | None:
    """The scheduler's chooser, made on first use; None unless `drafting` is `auto` and
    vLLM kept dynamic speculation on (it turns it off with data parallelism, where ranks
    must draft alike)."""
    if _CHOOSER not in vars(scheduler):
        chooser = None
        vllm_config = scheduler.vllm_config
        method_config = specextend_config(vllm_config)
        speculative_config = vllm_config.speculative_config
        if (
            method_config is not None
            and method_config.drafting == "auto"
            and scheduler.dynamic_sd_lookup is not None
        ):
            chooser = DraftLengthChooser(
                speculative_config.num_speculative_tokens,
                vllm_config.scheduler_config.max_num_seqs,
                chooses_length=method_config.tree == "chain",
            )
        setattr(scheduler, _CHOOSER, chooser)
        setattr(scheduler, _TIMES_STEPS, method_config is not None)
        setattr(scheduler, _STEP_STARTS, {})
        setattr(scheduler, _DECODING_STEPS, DecodingSteps())
        max_requests = vllm_config.scheduler_config.max_num_seqs
        setattr(scheduler, _PROMPT_WORK, PromptWork(MissingDraftTokens(max_requests)))
    return getattr(scheduler, _CHOOSER)


def times_steps(scheduler: Any) -> bool:
    """Whether the scheduler times its steps: where the engine runs the method, for its
    metrics and for `drafting: auto`."""
    draft_length_chooser(scheduler)
    return getattr(scheduler, _TIMES_STEPS)


_CHOOSER = "_specextend_draft_length_chooser"
_TIMES_STEPS = "_specextend_times_steps"
_PROMPT_WORK = "_specextend_prompt_work"
# Steps scheduled and not yet finished are one, or a few with a batch queue; more means
# outputs that never came back (the entries are dropped rather than kept forever).
MAX_STEPS_IN_FLIGHT = 8
_STEP_STARTS = "_specextend_step_starts"
# The decoding steps timed since the last SchedulerStats took them.
_DECODING_STEPS = "_specextend_decoding_steps"


class SchedulerOutputCarriesBlockTwins(VllmDataclassField):
    """The cached twins of the blocks a step computes again, from the scheduler to the
    workers (`algorithm.block_twins`)."""

    target = SchedulerOutput
    attribute = "specextend_block_twins"
    field_type = dict[str, BlockTwins] | None


class SchedulerOutputCarriesUnrepaidDrafting(VllmDataclassField):
    """True where the scheduler took a step's drafts back because they would not repay the
    draft's pending prompt work (`algorithm.prompt_work`), for the worker's counts."""

    target = SchedulerOutput
    attribute = "specextend_unrepaid_drafting"
    field_type = bool | None


class SchedulerWeighsPromptWork(VllmPatch):
    """With `drafting: auto`, a step of a batch that would draft first weighs the draft's
    pending work on prompts against what drafting saves over the tokens its requests may
    still decode (or, measuring drafting, a share of the plain steps left), and drafts
    nothing where that would not repay it or cannot be weighed yet; then the scheduler's
    account of the tokens the draft missed takes the step. Before vLLM's own update,
    which (with asynchronous scheduling) gives the requests the next step's draft
    placeholders by the step's number of drafts."""

    target = Scheduler
    attribute = "_update_after_schedule"

    @staticmethod
    def replacement(self: Any, scheduler_output: SchedulerOutput) -> None:
        chooser = draft_length_chooser(self)
        if chooser is not None:
            weigh_prompt_work(self, chooser, getattr(self, _PROMPT_WORK), scheduler_output)
        SchedulerWeighsPromptWork.original(self, scheduler_output)


def weigh_prompt_work(
    scheduler: Any,
    chooser: DraftLengthChooser,
    work: PromptWork,
    scheduler_output: SchedulerOutput,
) -> None:
    work.missing.forget(scheduler_output.finished_req_ids)
    work.missing.forget(scheduler_output.preempted_req_ids or ())
    scheduled_tokens = scheduler_output.num_scheduled_tokens
    batch_size = len(scheduled_tokens)
    slots = work.missing.slots(list(scheduled_tokens))
    tokens = np.fromiter(scheduled_tokens.values(), dtype=np.int64, count=batch_size)
    num_drafts = scheduler_output.num_spec_tokens_to_schedule
    if num_drafts and batch_size >= MIN_BATCH_SIZE:
        pending = work.missing.pending(slots, tokens, 1 + chooser.max_drafts)
        if pending and not drafting_repays(
            pending,
            work.cost.seconds_per_token,
            plain_steps_left(scheduler, work.answers, scheduled_tokens),
            chooser.seconds_saved_per_token(batch_size, num_drafts),
            chooser.plain_step_seconds(batch_size),
        ):
            num_drafts = scheduler_output.num_spec_tokens_to_schedule = 0
            scheduler_output.specextend_unrepaid_drafting = True
    work.missing.step(slots, tokens, drafts=num_drafts > 0)


def plain_steps_left(
    scheduler: Any, answers: AnswerLengths, scheduled_tokens: dict[str, int]
) -> float:
    """The plain steps the batch may still decode: the tokens its requests may (each one's
    `max_tokens` less what it decoded, or fewer where the answers that ended say so), over
    the batch size."""
    requests = scheduler.requests
    decoded, max_tokens = np.array(
        [
            (requests[request_id].num_output_tokens, requests[request_id].max_tokens)
            for request_id in scheduled_tokens
        ],
        dtype=np.int64,
    ).T
    return float(answers.tokens_left(decoded, max_tokens - decoded).sum()) / len(decoded)


# Aborted requests say nothing of how long their answers would have run.
ENDED_ANSWERS = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


class SchedulerLearnsAnswerLengths(VllmPatch):
    """With `drafting: auto`, each answer that ends (stopped, or at its `max_tokens`) adds its
    length to what the weighing of prompt work counts on (`algorithm.answer_length`)."""

    target = Scheduler
    attribute = "_free_request"

    @staticmethod
    def replacement(self: Any, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.status in ENDED_ANSWERS and draft_length_chooser(self) is not None:
            getattr(self, _PROMPT_WORK).answers.add(request.num_output_tokens)
        return SchedulerLearnsAnswerLengths.original(self, request, *args, **kwargs)


class SchedulerPreparesDrafting(VllmPatch):
    """With `drafting: auto` the scheduler reads the number of draft tokens for the next
    step from the chooser's table, as it would read a `num_speculative_tokens_per_batch_size`
    schedule; with the method, it notes when each step was scheduled and finds the cached
    twins of the blocks the step computes again."""

    target = Scheduler
    attribute = "schedule"

    @staticmethod
    def replacement(self: Any, *args: Any, **kwargs: Any) -> SchedulerOutput:
        chooser = draft_length_chooser(self)
        if chooser is not None:
            self.dynamic_sd_lookup = chooser.lookup
        scheduler_output = SchedulerPreparesDrafting.original(self, *args, **kwargs)
        if times_steps(self):
            starts = getattr(self, _STEP_STARTS)
            if len(starts) >= MAX_STEPS_IN_FLIGHT:
                starts.clear()
            starts[id(scheduler_output)] = profiling.drafting_clock()
        if scheduler_output.scheduled_new_reqs and specextend_config(self.vllm_config) is not None:
            scheduler_output.specextend_block_twins = (
                recomputed_block_twins(self, scheduler_output) or None
            )
        return scheduler_output


class SchedulerMeasuresDrafting(VllmPatch):
    """Each decoding step (no request prefilling) joins the decoding steps the next
    SchedulerStats carry to the front end's metrics, and tells `drafting: auto`'s chooser
    how long it took, how many drafts it verified and scheduled, and how many tokens each
    request got; the draft's passes over prompts in any step tell the chooser what a
    prompt token costs the draft."""

    target = Scheduler
    attribute = "update_from_output"

    @staticmethod
    def replacement(
        self: Any, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Any:
        chooser = draft_length_chooser(self)
        if chooser is not None:
            counts = model_runner_output.specextend_counts
            if counts is not None and counts.prompt_pass_tokens:
                getattr(self, _PROMPT_WORK).cost.add(
                    counts.prompt_pass_tokens, counts.prompt_pass_seconds
                )
        timed = times_steps(self)
        if timed:
            started = getattr(self, _STEP_STARTS).pop(id(scheduler_output), None)
            step = decoding_step(scheduler_output, model_runner_output)
            if started is not None and step is not None:
                seconds = profiling.drafting_clock() - started
                if chooser is not None:
                    chooser.record_step(
                        step.batch_size,
                        step.verified_drafts,
                        scheduler_output.num_spec_tokens_to_schedule,
                        seconds,
                        step.accepted_shares,
                    )
                if step.tokens is not None:
                    getattr(self, _DECODING_STEPS).record(
                        step.batch_size,
                        step.verified_drafts,
                        scheduler_output.num_spec_tokens_to_schedule,
                        seconds,
                        step.tokens,
                    )
        outputs = SchedulerMeasuresDrafting.original(self, scheduler_output, model_runner_output)
        if timed:
            hand_over_decoding_steps(self, outputs)
        return outputs


def hand_over_decoding_steps(scheduler: Any, outputs: dict[int, EngineCoreOutputs]) -> None:
    """The decoding steps timed since the last stats join this step's stats, where vLLM
    made some (it logs stats), and are counted afresh from there."""
    steps = getattr(scheduler, _DECODING_STEPS)
    if steps.is_empty():
        return
    for engine_core_outputs in outputs.values():
        if engine_core_outputs.scheduler_stats is not None:
            engine_core_outputs.scheduler_stats.specextend_decoding_steps = steps
            setattr(scheduler, _DECODING_STEPS, DecodingSteps())
            return


@dataclasses.dataclass(frozen=True)
class DecodingStep:
    """A step where every request verified `verified_drafts` drafts and none prefilled:
    `accepted_shares[i]`, the share of requests that accepted i + 1 drafts or more (None
    without drafts, or where the sampled tokens did not come back)."""

    batch_size: int
    verified_drafts: int
    accepted_shares: tuple[float, ...] | None

    @property
    def tokens(self) -> int | None:
        """The tokens the step gave its requests, one each and the drafts each accepted;
        None where drafts were verified and the sampled tokens did not come back."""
        if not self.verified_drafts:
            return self.batch_size
        if self.accepted_shares is None:
            return None
        return round(self.batch_size * (1 + sum(self.accepted_shares)))


def decoding_step(
    scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
) -> DecodingStep | None:
    """The step's measurements, or None where requests verified different numbers of
    drafts or some prefilled.

    Each request schedules its drafts and at least one more token, so the step is a
    decoding step of j drafts each exactly when the longest draft list holds j, the lists
    hold B j drafts in all and the step schedules B (1 + j) tokens (B: the batch size);
    the runner samples one row per scheduled request."""
    batch_size = len(scheduler_output.num_scheduled_tokens)
    if not batch_size or scheduler_output.scheduled_new_reqs:
        return None
    drafts = scheduler_output.scheduled_spec_decode_tokens
    draft_counts = np.fromiter(map(len, drafts.values()), dtype=np.int64, count=len(drafts))
    verified_drafts = int(draft_counts.max(initial=0))
    if int(draft_counts.sum()) != batch_size * verified_drafts or (
        scheduler_output.total_num_scheduled_tokens != batch_size * (1 + verified_drafts)
    ):
        return None
    sampled = model_runner_output.sampled_token_ids
    if not verified_drafts or len(sampled) != batch_size:
        return DecodingStep(batch_size, verified_drafts, None)
    sampled_counts = np.fromiter(map(len, sampled), dtype=np.int64, count=batch_size)
    shares = accepted_shares(sampled_counts - 1, verified_drafts)
    return DecodingStep(batch_size, verified_drafts, shares)
