"""Long prompts as the reference builds them, and needle-in-a-haystack prompts."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

SUMMARY_HEAD = "Summarize the following text.\n\n"
SUMMARY_TAIL = "\n\nSummary:"
NEEDLE_QUESTION = (
    "\n\nWhat is the special magic number mentioned in the text above? "
    "Answer: The special magic number is"
)


def summary_prompt(tokenizer: Any, text: str, num_tokens: int) -> list[int]:
    """An instruction around `text` cut so that the whole prompt has `num_tokens` tokens."""
    head = tokenizer(SUMMARY_HEAD)["input_ids"]
    tail = tokenizer(SUMMARY_TAIL)["input_ids"]
    body = tokenizer(text)["input_ids"][: num_tokens - len(head) - len(tail)]
    if len(body) < num_tokens - len(head) - len(tail):
        raise ValueError(f"the text has fewer than {num_tokens} tokens")
    return head + body + tail


@dataclasses.dataclass
class NeedlePrompt:
    token_ids: list[int]
    value: str
    depth: float
    needle_position: int


def needle_value(seed: int) -> str:
    """Five groups of four random digits: each digit is one token for Qwen's tokenizer,
    so a draft that cannot see the needle has no way to propose them."""
    rng = random.Random(seed)
    return "-".join("".join(rng.choice("0123456789") for _ in range(4)) for _ in range(5))


def needle_prompt(tokenizer: Any, haystack: str, num_tokens: int, depth: float, seed: int) -> NeedlePrompt:
    """`haystack` cut to fit `num_tokens`, with the needle sentence placed at `depth`
    (0 = start, 1 = end) on a line boundary, and a question about it at the end."""
    value = needle_value(seed)
    needle = tokenizer(f"\nThe special magic number is {value}.\n")["input_ids"]
    question = tokenizer(NEEDLE_QUESTION)["input_ids"]
    body = tokenizer(haystack)["input_ids"][: num_tokens - len(needle) - len(question)]
    position = int(len(body) * depth)
    for candidate in range(position, min(position + 256, len(body))):
        if candidate == 0 or tokenizer.decode([body[candidate - 1]]).endswith("\n"):
            position = candidate
            break
    token_ids = body[:position] + needle + body[position:] + question
    return NeedlePrompt(token_ids, value, depth, position)


def needle_token_span(tokenizer: Any, output_tokens: list[int], value: str) -> range | None:
    """The output tokens that spell `value`, or None when the output does not contain it."""
    pieces = [tokenizer.decode([token]) for token in output_tokens]
    text = "".join(pieces)
    start = text.find(value)
    if start < 0:
        return None
    end = start + len(value)
    offsets = [0]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    first = max(i for i in range(len(pieces)) if offsets[i] <= start)
    last = min(i for i in range(len(pieces)) if offsets[i + 1] >= end)
    return range(first, last + 1)


def draft_origin_of_tokens(accepted_per_step: list[int], drafted_per_step: list[int], num_tokens: int) -> list[str]:
    """Where each output token came from: `prefill` (the first token), `accepted` (a
    draft token the target accepted), `corrected` (the target replaced a rejected draft
    token) or `bonus` (every draft token was accepted; the target added one more).

    Example: steps accepting [2, 4] of [4, 4] drafted, 9 tokens:
    [prefill, accepted, accepted, corrected, accepted, accepted, accepted, accepted, bonus].
    """
    origins = ["prefill"]
    for accepted, drafted in zip(accepted_per_step, drafted_per_step):
        origins += ["accepted"] * accepted
        origins.append("bonus" if accepted == drafted else "corrected")
    return origins[:num_tokens]
