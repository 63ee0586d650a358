"""The method's numbers: counts of its work, produced in the worker (`SpecExtendCounts`) and
kept with its recent selections by `RetrievalMetrics`, and the decoding steps the scheduler
timed (`DecodingSteps`). `retrieval_stats(llm)` reads the worker's totals; each step's new
numbers travel to vLLM's front end (`patches.metrics`), whose exporters (`metrics_exporters`)
turn them into Prometheus counters and log lines."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch

from specextend_vllm.algorithm.draft_length import batch_size_bucket


@dataclasses.dataclass
class Selection:
    """One request's chunk selection: the context it was scored over, the chunks it
    chose from (those before the newest tokens) and the kept ones."""

    request_id: str
    context_len: int
    num_candidates: int
    kept_chunks: list[int]


@dataclasses.dataclass
class SpecExtendCounts:
    """The method's work over a span of steps: one step's new work, on its way to the
    front end, or all of it since the engine started. Draft steps count requests: one
    proposal for a batch of 3 requests is 3 draft steps."""

    retrievals: int = 0
    """Chunk selections, one per request that selects."""
    reduced_draft_steps: int = 0
    """Draft steps on a reduced cache (kept chunks and the newest tokens)."""
    compact_draft_steps: int = 0
    """Those of the reduced draft steps on compact positions (working copies)."""
    full_draft_steps: int = 0
    """Draft steps on the full cache (below the activation length, or no selection yet)."""
    kept_tokens: int = 0
    """Tokens the draft attends to, summed over the reduced draft steps."""
    context_tokens: int = 0
    """Context tokens of the requests, summed over the reduced draft steps."""
    scorer_calls: int = 0
    scorer_seconds: float = 0.0
    """Wall clock of the scorer calls, seconds."""
    hybrid_verifications: int = 0
    """Target forward passes that verified drafts through hybrid tree attention."""
    native_verifications: int = 0
    """Target forward passes that `verification_attention: auto` chose to verify on vLLM's
    attention."""
    kernel_decode_steps: int = 0
    """Plain decoding steps (no drafts) whose target attention `verification_attention: auto`
    ran on the plugin's prefix kernel, measured faster there than vLLM's."""
    reduced_verified_drafts: int = 0
    """Draft tokens drafted on a reduced cache that the target verified."""
    reduced_accepted_drafts: int = 0
    """Those of them the target accepted."""
    full_verified_drafts: int = 0
    """Draft tokens drafted on the full cache (of requests the method tracks, under a
    retrieval policy other than `full`) that the target verified."""
    full_accepted_drafts: int = 0
    """Those of them the target accepted."""
    skipped_draft_steps: int = 0
    """Request steps that drafted nothing and did not run the draft."""
    catch_up_passes: int = 0
    """Draft passes writing the KV of tokens those steps skipped, before the draft ran again."""
    catch_up_tokens: int = 0
    """Tokens those passes wrote."""
    copied_prompt_tokens: int = 0
    """Prompt tokens of blocks vLLM computed again (a prompt its prefix cache held whole)
    that the draft's pass left out, their draft KV copied from the cached blocks holding
    the same tokens."""
    windowed_prompt_tokens: int = 0
    """Tokens of the draft's passes over prompts (and catch-up passes) that attended to
    the sink block and `draft_prefill_window`, not to everything before them."""
    prompt_pass_tokens: int = 0
    """Tokens of the draft's passes of PROMPT_PASS_MIN_TOKENS or more (its prefills and
    catch-up passes)."""
    prompt_pass_seconds: float = 0.0
    """Wall clock of those passes, seconds."""
    unrepaid_drafting_steps: int = 0
    """Request steps run without drafts where `drafting: auto` would have drafted: in a
    batch, the tokens its requests may still decode would not repay the draft's pending
    work on their prompts (`algorithm.prompt_work`)."""

    def add(self, other: SpecExtendCounts) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def is_empty(self) -> bool:
        return not any(getattr(self, field.name) for field in dataclasses.fields(self))

    def summary(self) -> dict[str, Any]:
        """The counts with means per reduced draft step in place of the token sums."""
        per_step = max(self.reduced_draft_steps, 1)
        return {
            "retrievals": self.retrievals,
            "reduced_draft_steps": self.reduced_draft_steps,
            "full_draft_steps": self.full_draft_steps,
            "compact_draft_steps": self.compact_draft_steps,
            "mean_kept_tokens": self.kept_tokens / per_step,
            "mean_context_tokens": self.context_tokens / per_step,
            "scorer_calls": self.scorer_calls,
            "scorer_seconds": self.scorer_seconds,
            "hybrid_verifications": self.hybrid_verifications,
            "native_verifications": self.native_verifications,
            "kernel_decode_steps": self.kernel_decode_steps,
            "reduced_verified_drafts": self.reduced_verified_drafts,
            "reduced_accepted_drafts": self.reduced_accepted_drafts,
            "full_verified_drafts": self.full_verified_drafts,
            "full_accepted_drafts": self.full_accepted_drafts,
            "skipped_draft_steps": self.skipped_draft_steps,
            "catch_up_passes": self.catch_up_passes,
            "catch_up_tokens": self.catch_up_tokens,
            "copied_prompt_tokens": self.copied_prompt_tokens,
            "windowed_prompt_tokens": self.windowed_prompt_tokens,
            "prompt_pass_tokens": self.prompt_pass_tokens,
            "prompt_pass_seconds": self.prompt_pass_seconds,
            "unrepaid_drafting_steps": self.unrepaid_drafting_steps,
        }


@dataclasses.dataclass
class DecodingStepTally:
    """Decoding steps of one bucket of batch sizes whose requests each verified `num_drafts`
    drafts and drafted `next_drafts` for the next step: equal where the step kept its
    number of drafts, different where it switched (the draft passes of a switch to
    drafting fall on the plain step before it)."""

    bucket: int
    num_drafts: int
    next_drafts: int
    steps: int = 0
    seconds: float = 0.0
    """Wall clock from the step's scheduling to its output, the next drafts' proposal
    included: the time `drafting: auto` weighs."""
    tokens: int = 0
    """Tokens the step gave its requests: for each, one and the drafts it accepted."""

    @property
    def batch_sizes(self) -> str:
        return batch_sizes_label(self.bucket)

    @property
    def drafts(self) -> str:
        return drafts_label(self.num_drafts, self.next_drafts)


@dataclasses.dataclass
class DecodingSteps:
    """The decoding steps (no request prefilling, every request verifying as many drafts)
    the scheduler timed, by bucket of batch sizes (`algorithm.draft_length.batch_size_bucket`),
    drafts verified per request and drafts proposed for the next step: what `drafting: auto`
    weighs (the steps that kept their number of drafts), so that its choices can be read
    against their outcome. Counted where the scheduler runs; the worker's totals
    (`retrieval_stats`) do not hold them.

    >>> steps = DecodingSteps()
    >>> steps.record(batch_size=4, num_drafts=2, next_drafts=2, seconds=0.5, tokens=9)
    >>> steps.record(batch_size=5, num_drafts=2, next_drafts=2, seconds=0.7, tokens=11)
    >>> steps.record(batch_size=1, num_drafts=0, next_drafts=4, seconds=0.2, tokens=1)
    >>> [(tally.batch_sizes, tally.drafts, tally.steps, tally.tokens) for tally in steps.rows()]
    [('1', '0->4', 1, 1), ('4-7', '2', 2, 20)]
    """

    tallies: list[DecodingStepTally] = dataclasses.field(default_factory=list)

    def record(
        self, batch_size: int, num_drafts: int, next_drafts: int, seconds: float, tokens: int
    ) -> None:
        bucket = batch_size_bucket(batch_size)
        self._add(DecodingStepTally(bucket, num_drafts, next_drafts, 1, seconds, tokens))

    def add(self, other: DecodingSteps) -> None:
        for theirs in other.tallies:
            self._add(theirs)

    def is_empty(self) -> bool:
        return not self.tallies

    def rows(self) -> list[DecodingStepTally]:
        """The tallies by bucket, drafts verified and drafts proposed."""
        return sorted(
            self.tallies, key=lambda tally: (tally.bucket, tally.num_drafts, tally.next_drafts)
        )

    def _add(self, theirs: DecodingStepTally) -> None:
        """Adds to the tally of the same keys, or to a new one (a few per bucket)."""
        keys = (theirs.bucket, theirs.num_drafts, theirs.next_drafts)
        tally = next(
            (t for t in self.tallies if (t.bucket, t.num_drafts, t.next_drafts) == keys), None
        )
        if tally is None:
            tally = DecodingStepTally(*keys)
            self.tallies.append(tally)
        tally.steps += theirs.steps
        tally.seconds += theirs.seconds
        tally.tokens += theirs.tokens


def drafts_label(num_drafts: int, next_drafts: int) -> str:
    """Steps that kept 3 drafts, and a switch from none to 4:

    >>> drafts_label(3, 3), drafts_label(0, 4)
    ('3', '0->4')
    """
    if num_drafts == next_drafts:
        return str(num_drafts)
    return f"{num_drafts}->{next_drafts}"


def batch_sizes_label(bucket: int) -> str:
    """The batch sizes of a bucket, as in `batch_size_bucket`.

    >>> [batch_sizes_label(bucket) for bucket in (0, 1, 2, 5)]
    ['1', '2-3', '4-7', '32-63']
    """
    first = 1 << bucket
    return str(first) if bucket == 0 else f"{first}-{2 * first - 1}"


class RetrievalMetrics:
    """One proposer's counts, on the host, and its recent selections.

    The counts known on the host (retrievals, scorer calls, verifications) are added as
    they happen. A draft step's counts are computed on the device and read at once: on GPU
    one wait per draft step, after the proposer's own waits of that step (its `nonzero`),
    for the few kernels queued since (the reduced block tables; on a step that selects,
    the working copies, which the draft's forward would wait for anyway).
    """

    def __init__(self, history: int = 256):
        self._reported = SpecExtendCounts()
        self._new = SpecExtendCounts()
        self._selections: collections.deque[tuple[list[str], torch.Tensor, ...]] = (
            collections.deque(maxlen=history)
        )

    def record_draft_step(
        self,
        active: torch.Tensor,
        compact: torch.Tensor,
        context_lens: torch.Tensor,
        seq_len_offset: torch.Tensor,
        verified_drafts: torch.Tensor,
        accepted_drafts: torch.Tensor,
        verified_reduced: torch.Tensor,
    ) -> None:
        """active, compact: [num_reqs] bool, which requests draft on a reduced cache and which
        of those on compact positions; context_lens, seq_len_offset: [num_reqs] tokens;
        verified_drafts, accepted_drafts: [num_reqs] this step's verification of the
        previous drafts, drafted on a reduced cache where verified_reduced [num_reqs] bool."""
        active_long = active.long()
        reduced_verified = verified_reduced.long()
        accepted = torch.where(verified_drafts > 0, accepted_drafts, 0)
        counts = torch.stack(
            [
                active_long.sum(),
                (1 - active_long).sum(),
                ((context_lens - seq_len_offset) * active_long).sum(),
                (context_lens * active_long).sum(),
                (compact & active).long().sum(),
                (verified_drafts * reduced_verified).sum(),
                (accepted * reduced_verified).sum(),
                (verified_drafts * (1 - reduced_verified)).sum(),
                (accepted * (1 - reduced_verified)).sum(),
            ]
        ).tolist()
        new = self._new
        new.reduced_draft_steps += counts[0]
        new.full_draft_steps += counts[1]
        new.kept_tokens += counts[2]
        new.context_tokens += counts[3]
        new.compact_draft_steps += counts[4]
        new.reduced_verified_drafts += counts[5]
        new.reduced_accepted_drafts += counts[6]
        new.full_verified_drafts += counts[7]
        new.full_accepted_drafts += counts[8]

    def record_skipped_draft_step(self, num_reqs: int) -> None:
        self._new.skipped_draft_steps += num_reqs

    def record_windowed_prompt_tokens(self, num_tokens: int) -> None:
        self._new.windowed_prompt_tokens += num_tokens

    def record_catch_up(self, num_tokens: int) -> None:
        self._new.catch_up_passes += 1
        self._new.catch_up_tokens += num_tokens

    def record_prompt_pass(self, num_tokens: int, seconds: float) -> None:
        self._new.prompt_pass_tokens += num_tokens
        self._new.prompt_pass_seconds += seconds

    def record_unrepaid_drafting_step(self, num_reqs: int) -> None:
        self._new.unrepaid_drafting_steps += num_reqs

    def record_copied_prompt_tokens(self, num_tokens: int) -> None:
        self._new.copied_prompt_tokens += num_tokens

    def record_hybrid_verification(self) -> None:
        self._new.hybrid_verifications += 1

    def record_native_verification(self) -> None:
        self._new.native_verifications += 1

    def record_kernel_decode_step(self) -> None:
        self._new.kernel_decode_steps += 1

    def record_scoring(self, seconds: float) -> None:
        self._new.scorer_calls += 1
        self._new.scorer_seconds += seconds

    def record_selection(
        self,
        request_ids: list[str],
        rows: torch.Tensor,
        context_lens: torch.Tensor,
        num_candidates: torch.Tensor,
        kept_chunks: torch.Tensor,
        num_kept_chunks: torch.Tensor,
    ) -> None:
        self._new.retrievals += rows.numel()
        self._selections.append(
            (request_ids, rows, context_lens, num_candidates, kept_chunks, num_kept_chunks)
        )

    def take_new_counts(self) -> SpecExtendCounts | None:
        """The counts since the last call, or None if there are none."""
        new = self._new
        if new.is_empty():
            return None
        self._reported.add(new)
        self._new = SpecExtendCounts()
        return new

    def totals(self) -> SpecExtendCounts:
        """The counts since the proposer started."""
        totals = dataclasses.replace(self._reported)
        totals.add(self._new)
        return totals

    def selections(self) -> list[Selection]:
        """The recent selections, oldest first."""
        return [
            Selection(request_ids[row], int(context_len), int(candidates), kept[:count].tolist())
            for request_ids, rows, context_lens, num_candidates, kept_chunks, counts in self._selections
            for row, context_len, candidates, kept, count in zip(
                rows.tolist(), context_lens, num_candidates, kept_chunks, counts.tolist()
            )
        ]

    def summary(self) -> dict[str, Any]:
        return self.totals().summary()
