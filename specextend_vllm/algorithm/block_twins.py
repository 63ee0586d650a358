"""The draft's KV of blocks vLLM computes again, copied from their cached twins.

vLLM's prefix cache holds whole blocks only and a prompt's last token must be computed
for its logits, so a prompt the cache holds whole has its last block computed again, into
a new block. The draft wrote its KV of those tokens when it first computed them: the
cached block with the same tokens (its twin) holds it. A step whose every request computes
only such blocks does not run the draft and copies the twins' draft KV instead; those
requests draft from their next step on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from specextend_vllm.algorithm.draft_lag import StepTokens


@dataclasses.dataclass(frozen=True)
class BlockTwins:
    """One request's blocks (the scheduler's) that its step computes, and cached blocks
    holding the same tokens, in the same order."""

    computed: tuple[int, ...]
    cached: tuple[int, ...]


def twin_copies(
    request_ids: list[str],
    twins: Mapping[str, BlockTwins],
    step: StepTokens,
    block_size: int,
    kernel_blocks_per_block: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(sources, destinations), the kernel blocks whose draft KV is copied, where each
    request of the step computes whole blocks that all have twins, and no twin is written
    by the step; None otherwise. step.block_table holds kernel blocks, block_size tokens
    per block of the scheduler's, kernel_blocks_per_block kernel blocks in each.

    >>> step = StepTokens(np.array([8, 4]), np.array([4, 4]), np.array([[0, 1, 6], [0, 7, 9]]))
    >>> a = BlockTwins(computed=(6,), cached=(2,))
    >>> twin_copies(["a", "b"], {"a": a, "b": BlockTwins((7,), (3,))}, step, 4, 1)
    (array([2, 3]), array([6, 7]))
    >>> twin_copies(["a", "b"], {"a": a, "b": BlockTwins((7,), (6,))}, step, 4, 1) is None
    True
    >>> twin_copies(["a", "b"], {"a": a}, step, 4, 1) is None
    True
    """
    entries = [twins.get(request_id) for request_id in request_ids]
    if any(entry is None for entry in entries):
        return None
    whole_blocks = (step.first_positions % block_size == 0) & (step.query_lens % block_size == 0)
    if not whole_blocks.all():
        return None
    sources = _kernel_blocks([entry.cached for entry in entries], kernel_blocks_per_block)
    destinations = _kernel_blocks([entry.computed for entry in entries], kernel_blocks_per_block)
    written, _ = step.block_spans(step.first_positions, block_size // kernel_blocks_per_block)
    if not np.array_equal(written, destinations) or np.isin(sources, written).any():
        return None
    return sources, destinations


def _kernel_blocks(blocks: list[tuple[int, ...]], kernel_blocks_per_block: int) -> np.ndarray:
    """The kernel blocks of the scheduler's blocks, in order.

    >>> _kernel_blocks([(3,), (0, 5)], 2)
    array([ 6,  7,  0,  1, 10, 11])
    """
    first_kernel_blocks = np.concatenate(blocks)[:, None] * kernel_blocks_per_block
    return (first_kernel_blocks + np.arange(kernel_blocks_per_block)).ravel()
