"""What the scheduler tells `drafting: auto` about a step: a decoding step's batch size,
drafts verified and the share of requests accepting each draft, and no measurement at all
for a step whose requests verified different numbers of drafts or prefilled."""

from __future__ import annotations

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput

from specextend_vllm.patches.scheduler import DecodingStep, decoding_step


def scheduled(
    num_scheduled: dict[str, int], drafts: dict[str, list[int]], new_requests: int = 0
) -> SchedulerOutput:
    output = SchedulerOutput.make_empty()
    output.num_scheduled_tokens = num_scheduled
    output.total_num_scheduled_tokens = sum(num_scheduled.values())
    output.scheduled_spec_decode_tokens = drafts
    output.scheduled_new_reqs = [object()] * new_requests
    return output


def runner_output(sampled: list[list[int]]) -> ModelRunnerOutput:
    request_ids = [f"r{i}" for i in range(len(sampled))]
    return ModelRunnerOutput(
        req_ids=request_ids,
        req_id_to_index={request_id: i for i, request_id in enumerate(request_ids)},
        sampled_token_ids=sampled,
    )


def test_a_step_of_two_drafts_each_gives_the_share_accepting_each_draft() -> None:
    drafts = {f"r{i}": [7, 8] for i in range(4)}
    step = decoding_step(
        scheduled({"r0": 3, "r1": 3, "r2": 3, "r3": 3}, drafts),
        runner_output([[1], [1, 2, 3], [1, 2], [1, 2, 3]]),
    )
    assert step == DecodingStep(batch_size=4, verified_drafts=2, accepted_shares=(0.75, 0.5))


def test_a_plain_step_is_measured_without_acceptance() -> None:
    step = decoding_step(scheduled({"r0": 1, "r1": 1}, {}), runner_output([[1], [2]]))
    assert step == DecodingStep(batch_size=2, verified_drafts=0, accepted_shares=None)


def test_requests_verifying_different_numbers_of_drafts_give_no_measurement() -> None:
    """One request drafted 1 where the others drafted 2 (the longest list holds 2, the
    lists 5 drafts, not 3 x 2), scheduling 2 tokens or, as a chunk of 3 tokens would, 3;
    or one has no draft list at all."""
    sampled = runner_output([[1], [1], [1]])
    fewer = {"r0": [7, 8], "r1": [7, 8], "r2": [7]}
    assert decoding_step(scheduled({"r0": 3, "r1": 3, "r2": 2}, fewer), sampled) is None
    assert decoding_step(scheduled({"r0": 3, "r1": 3, "r2": 3}, fewer), sampled) is None
    missing = {"r0": [7, 8], "r1": [7, 8]}
    assert decoding_step(scheduled({"r0": 3, "r1": 3, "r2": 1}, missing), sampled) is None


def test_a_step_with_a_prompt_chunk_gives_no_measurement() -> None:
    """A request continuing its prompt in chunks schedules more tokens than drafts + 1,
    with drafts or without; a new request's first step is a prefill too."""
    sampled = runner_output([[1], [1]])
    with_drafts = {"r0": [7, 8], "r1": [7, 8]}
    assert decoding_step(scheduled({"r0": 3, "r1": 3 + 64}, with_drafts), sampled) is None
    assert decoding_step(scheduled({"r0": 1, "r1": 64}, {}), sampled) is None
    assert decoding_step(scheduled({"r0": 1, "r1": 1}, {}, new_requests=1), sampled) is None
    assert decoding_step(scheduled({}, {}), runner_output([])) is None


def test_tokens_that_did_not_come_back_leave_acceptance_unmeasured() -> None:
    """A runner output without a row per request (none sampled yet) measures the step's
    drafts but not their acceptance; a request whose tokens were discarded accepted none."""
    drafts = {"r0": [7], "r1": [7]}
    step = decoding_step(scheduled({"r0": 2, "r1": 2}, drafts), runner_output([]))
    assert step == DecodingStep(batch_size=2, verified_drafts=1, accepted_shares=None)
    step = decoding_step(scheduled({"r0": 2, "r1": 2}, drafts), runner_output([[], [1, 2]]))
    assert step == DecodingStep(batch_size=2, verified_drafts=1, accepted_shares=(0.5,))
