"""Whether drafting repays the draft's work on prompts, in a batch of requests.

Before a request drafts, its prompt passes through the draft: with its prefill, or in a
catch-up pass where steps ran without the draft meanwhile (`algorithm.draft_lag`). That
work is paid once, and drafting pays it back only over the tokens the request still
decodes. Under load, a short answer to a long prompt does not: fresh 2K prompts answered
in 64 tokens at concurrency 4 and 8 came out at 0.86-0.90x no speculation, their decoding
about even and the draft's prefill making each first token 1.11-1.28x later.

So in a batch of B >= 2 requests, a step that `drafting: auto` would draft in first weighs
- the cost: the tokens whose draft KV is missing (those of the batch's steps that ran
  without the draft, and the prompt tokens this step prefills), times the draft's
  measured seconds per token of its passes over prompts;
- where the batch size keeps drafting, the saving: the time drafting saves over the
  tokens the batch's requests may still decode (`algorithm.answer_length`), (their sum /
  B) x (a plain step - a drafting step / the tokens it gives), from the chooser's measured
  step times and acceptance; where it measures drafting instead (first, or checking it
  again while it keeps plain steps), a share of the plain steps left, or a few plain steps
  where that is more: a measurement must not cost a catch-up of whole prompts that short
  answers never repay, and long answers must get to measure;
and runs without drafts where the cost is larger, or where it cannot be weighed yet (no
pass over prompts timed, no plain step measured: the draft then prices prompt tokens in
a pass of its own, and the step measures a plain step). A request alone drafts as the
chooser says: its prefill delays only its own first token (`draft_prefill: deferred`
moves that too), and the draft KV of its prompt also serves later requests that share the
prompt through the prefix cache (a conversation's next turn, the same document asked
again), which no count of one request's tokens foresees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from specextend_vllm.algorithm.answer_length import AnswerLengths
from specextend_vllm.algorithm.request_slots import RequestSlots

# Batches from this size weigh the draft's pending prompt work.
MIN_BATCH_SIZE = 2
# A batch that measures drafting (not measured yet, or checking it again while it keeps
# plain steps) catches up on at most this many plain steps' worth of missed tokens: 12 fresh
# 2K prompts at concurrency 4 otherwise caught up 12,529 tokens in such steps, and came out
# at 0.88x no speculation with their first tokens sooner than without speculation.
MEASURING_CATCH_UP_STEPS = 4
# ... or on at most this share of the plain steps its requests may still decode, where
# that is more: with the few plain steps alone, a batch of fresh long prompts would never
# measure drafting, however long its answers; with half, 12 fresh 2K prompts answered in
# 64 tokens at concurrency 4 caught up 14,508 prompt tokens measuring, 0.89x no speculation.
MEASURING_SHARE_OF_STEPS_LEFT = 0.1
# Weight of the passes reported before the latest, in the seconds per token.
PROMPT_PASS_DECAY = 0.8


class PromptPassCost:
    """The draft's seconds per token of its passes over prompts (prefills and catch-up
    passes): recent passes' seconds over their tokens, older reports weighing
    PROMPT_PASS_DECAY less per report.

    >>> cost = PromptPassCost()
    >>> cost.seconds_per_token is None
    True
    >>> cost.add(tokens=1000, seconds=2.0)
    >>> cost.add(tokens=1000, seconds=1.0)
    >>> round(cost.seconds_per_token, 4)  # (0.8 * 2 + 1) / (0.8 * 1000 + 1000)
    0.0014
    """

    def __init__(self) -> None:
        self._seconds = 0.0
        self._tokens = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self._seconds = PROMPT_PASS_DECAY * self._seconds + seconds
        self._tokens = PROMPT_PASS_DECAY * self._tokens + tokens

    @property
    def seconds_per_token(self) -> float | None:
        return self._seconds / self._tokens if self._tokens else None


class MissingDraftTokens:
    """Per request, the tokens of its steps that ran without the draft, whose draft KV a
    catch-up pass writes before it drafts again: the scheduler's account of what the
    worker's `DraftLag` holds (cached prompt blocks the draft never wrote are not seen
    here; they only make the estimate low). Held per request slot
    (`algorithm.request_slots`), so that a step reads and writes them as arrays.

    >>> missing = MissingDraftTokens(max_requests=4)
    >>> missing.step(missing.slots(["a", "b"]), np.array([300, 1]), drafts=False)
    >>> missing.step(missing.slots(["a", "b"]), np.array([1, 1]), drafts=False)
    >>> abc = missing.slots(["a", "b", "c"])
    >>> missing.pending(abc, np.array([1, 1, 500]), max_decoding_tokens=5)  # 301 + 2 + 500
    803
    >>> missing.step(missing.slots(["a", "c"]), np.array([1, 500]), drafts=True)
    >>> missing.pending(missing.slots(["a", "b"]), np.array([1, 1]), max_decoding_tokens=5)
    2
    >>> missing.forget(["b"])
    >>> missing.pending(missing.slots(["b"]), np.array([1]), max_decoding_tokens=5)
    0
    """

    def __init__(self, max_requests: int) -> None:
        self._slots = RequestSlots(max_requests)
        self._tokens = np.zeros(max_requests, dtype=np.int64)

    def slots(self, request_ids: list[str]) -> list[int]:
        """The slot of each of a step's requests (a new request's holds no tokens)."""
        slots, _ = self._slots.assign(request_ids)
        return slots

    def pending(
        self, slots: list[int], scheduled_tokens: np.ndarray, max_decoding_tokens: int
    ) -> int:
        """The tokens the draft must write before this step's requests draft: those it
        missed, and this step's tokens of requests scheduling more than a decoding step
        does (max_decoding_tokens: 1 + the most drafts), prompts. slots, scheduled_tokens
        [B]: each request's slot and tokens in this step."""
        prompts = scheduled_tokens[scheduled_tokens > max_decoding_tokens]
        return int(self._tokens[slots].sum() + prompts.sum())

    def step(self, slots: list[int], scheduled_tokens: np.ndarray, drafts: bool) -> None:
        """A step ran: with drafts, the draft wrote every scheduled request's tokens;
        without, it missed this step's too."""
        if drafts:
            self._tokens[slots] = 0
        else:
            self._tokens[slots] += scheduled_tokens

    def forget(self, request_ids: Iterable[str]) -> None:
        """Finished requests, and preempted ones (they compute their tokens again)."""
        request_ids = list(request_ids)
        self._tokens[self._slots.existing(request_ids)] = 0
        self._slots.free(request_ids)


@dataclasses.dataclass
class PromptWork:
    """What the scheduler weighs the draft's work on prompts with: its price, the tokens
    missing, and the lengths of the answers that ended (for the tokens left)."""

    missing: MissingDraftTokens
    cost: PromptPassCost = dataclasses.field(default_factory=PromptPassCost)
    answers: AnswerLengths = dataclasses.field(default_factory=AnswerLengths)


def drafting_repays(
    pending_tokens: int,
    seconds_per_pending_token: float | None,
    plain_steps_left: float,
    seconds_saved_per_step: float | None,
    plain_step_seconds: float | None,
) -> bool:
    """Whether a step of a batch (MIN_BATCH_SIZE requests or more) drafts, given the
    draft's pending prompt work and the plain steps its requests may still decode (the
    tokens they may still decode / the batch size): where the batch keeps drafting
    (`seconds_saved_per_step`: what a drafting step saves per token it gives), if the
    saving over those steps covers the work; where it measures drafting
    (`seconds_saved_per_step` None: a batch size not measured yet, or one that keeps plain
    steps and checks drafting again), if the work costs no more than
    MEASURING_SHARE_OF_STEPS_LEFT of those steps, or MEASURING_CATCH_UP_STEPS steps. Not
    where the work cannot be weighed yet: unpriced (no pass over prompts timed), or no
    plain step measured.

    1,000 prompt tokens at 1 ms (1.0 s) or at 3 ms (3.0 s) against 100 steps left, each
    saving 20 ms (2.0 s):

    >>> drafting_repays(1000, 0.001, 100, 0.02, 0.1), drafting_repays(1000, 0.003, 100, 0.02, 0.1)
    (True, False)

    Measuring with 0.1 s plain steps: 1,000 tokens at 1 ms against 200 steps left (a tenth
    of them, 2.0 s), but not against 10 (4 steps, 0.4 s); 300 tokens against 4 steps:

    >>> drafting_repays(1000, 0.001, 200, None, 0.1), drafting_repays(1000, 0.001, 10, None, 0.1)
    (True, False)
    >>> drafting_repays(300, 0.001, 10, None, 0.1)
    True

    Nothing pending; unpriced; no plain step measured:

    >>> drafting_repays(0, None, 1, -1.0, None)
    True
    >>> drafting_repays(1000, None, 100, 0.02, 0.1), drafting_repays(1000, 0.001, 100, None, None)
    (False, False)
    """
    if not pending_tokens:
        return True
    if seconds_per_pending_token is None or plain_step_seconds is None:
        return False
    cost = pending_tokens * seconds_per_pending_token
    if seconds_saved_per_step is not None:
        return plain_steps_left * seconds_saved_per_step >= cost
    measuring_steps = max(
        MEASURING_CATCH_UP_STEPS, MEASURING_SHARE_OF_STEPS_LEFT * plain_steps_left
    )
    return cost <= measuring_steps * plain_step_seconds
