"""The draft's KV of blocks vLLM computes again, copied from their cached twins.

vLLM's prefix cache holds whole blocks only and a prompt's last token must be computed
for its logits, so a prompt the cache holds whole has its last block computed again, into
a new block. The draft wrote its KV of those tokens when it first computed them: the
cached block with the same tokens (its twin) holds it. The step copies that KV into the
new block, and the draft's pass leaves those tokens out but the last, whose hidden state
gives the request's first draft.
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


@dataclasses.dataclass(frozen=True)
class TwinCopies:
    """rows [R]: the step's requests whose every computed block is copied from a twin;
    sources, destinations [C]: the kernel blocks copied, in order."""

    rows: np.ndarray
    sources: np.ndarray
    destinations: np.ndarray

    def kept_tokens(self, query_start_loc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pass's tokens without the copied rows' tokens before their last one: the
        kept tokens' indices, and the rows' query_start_loc [R + 1] over them.

        >>> copies = TwinCopies(np.array([False, True, False]), np.array([]), np.array([]))
        >>> copies.kept_tokens(np.array([0, 3, 7, 8]))
        (array([0, 1, 2, 6, 7]), array([0, 3, 4, 5]))
        """
        query_lens = np.diff(query_start_loc)
        kept_lens = np.where(self.rows, 1, query_lens)
        kept_start_loc = np.concatenate([[0], np.cumsum(kept_lens)])
        first_kept = query_start_loc[1:] - kept_lens
        offsets = np.repeat(first_kept - kept_start_loc[:-1], kept_lens)
        kept = offsets + np.arange(kept_start_loc[-1])
        return kept, kept_start_loc


def twin_copies(
    request_ids: list[str],
    twins: Mapping[str, BlockTwins],
    step: StepTokens,
    block_size: int,
    kernel_blocks_per_block: int,
) -> TwinCopies | None:
    """The copies where some request of the step computes whole blocks that all have
    twins, and no twin is written by the step; None otherwise. step.block_table holds
    kernel blocks, block_size tokens per block of the scheduler's, kernel_blocks_per_block
    kernel blocks in each.

    >>> step = StepTokens(np.array([8, 4, 0]), np.array([4, 4, 3]),
    ...                   np.array([[0, 1, 6], [0, 7, 9], [8, 0, 0]]))
    >>> a = BlockTwins(computed=(6,), cached=(2,))
    >>> copies = twin_copies(["a", "b", "c"], {"a": a, "b": BlockTwins((7,), (3,))}, step, 4, 1)
    >>> copies.rows, copies.sources, copies.destinations
    (array([ True,  True, False]), array([2, 3]), array([6, 7]))
    >>> twin_copies(["a", "b", "c"], {"a": a, "b": BlockTwins((7,), (8,))}, step, 4, 1) is None
    True
    """
    rows = np.fromiter(map(twins.__contains__, request_ids), dtype=bool, count=len(request_ids))
    rows &= (step.first_positions % block_size == 0) & (step.query_lens % block_size == 0)
    if not rows.any():
        return None
    entries = [twins[request_ids[row]] for row in np.nonzero(rows)[0]]
    sources = _kernel_blocks([entry.cached for entry in entries], kernel_blocks_per_block)
    destinations = _kernel_blocks([entry.computed for entry in entries], kernel_blocks_per_block)
    kernel_block_size = block_size // kernel_blocks_per_block
    written, written_rows = step.block_spans(step.first_positions, kernel_block_size)
    written_per_row = np.bincount(written_rows, minlength=rows.size)[rows]
    computed_per_row = kernel_blocks_per_block * np.array([len(e.computed) for e in entries])
    if (
        not np.array_equal(written[rows[written_rows]], destinations)
        or not np.array_equal(written_per_row, computed_per_row)
        or np.isin(sources, written).any()
    ):
        return None
    return TwinCopies(rows, sources, destinations)


def _kernel_blocks(blocks: list[tuple[int, ...]], kernel_blocks_per_block: int) -> np.ndarray:
    """The kernel blocks of the scheduler's blocks, in order.

    >>> _kernel_blocks([(3,), (0, 5)], 2)
    array([ 6,  7,  0,  1, 10, 11])
    """
    first_kernel_blocks = np.concatenate(blocks)[:, None] * kernel_blocks_per_block
    return (first_kernel_blocks + np.arange(kernel_blocks_per_block)).ravel()
