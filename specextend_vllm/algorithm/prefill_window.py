"""The draft's passes over a prompt, attending through a window.

A prompt's draft KV is written by the draft's passes over the prompt's tokens: the first
pass of its prefill steps, or catch-up passes. Over a long prompt these passes cost
quadratically in the draft's attention, yet the draft later reads the prompt only through
the chunks retrieval keeps and the newest tokens. With `draft_prefill_window: W`, such a
pass splits each request's tokens into pieces at the multiples of PIECE_BLOCKS KV blocks
(positions counted from the prompt's start, not from the pass's first token); each piece
attends to the prompt's first KV block (an attention sink: StreamingLLM) and to the whole
blocks holding at least the W tokens before its multiple, plus itself causally. What a
token attends to then depends on its position only, not on how the prompt was split into
steps or how much of it came from the prefix cache: a prompt whose last block vLLM
recomputes from the cache gets the draft KV of its first prefill. Only the draft's KV,
and so its proposals, differ from a whole-prompt pass: the target verifies.

Each piece becomes a row of its own in the pass's attention metadata, reading the source
row's block table through `selection.reduced_block_indices` (the sink blocks kept, then
the tail from the window's first block) and a sequence `cut` tokens shorter.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from specextend_vllm.algorithm.selection import reduced_block_indices

PIECE_BLOCKS = 4
SINK_BLOCKS = 1


@dataclasses.dataclass(frozen=True)
class WindowedRows:
    """The pass's rows after the split ([V] each): `rows`, the source row of each;
    `query_start_loc` [V + 1]; `cut`, how many tokens shorter each row's sequence is than
    its source row's; `tail_start_block`, the logical block each row's window starts at
    (SINK_BLOCKS for rows read whole)."""

    rows: np.ndarray
    query_start_loc: np.ndarray
    cut: np.ndarray
    tail_start_block: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    def block_indices(self, width: int, device: torch.device) -> torch.Tensor:
        """[V, width] the logical blocks of each row's source row that it reads: the sink
        blocks, then from its window's first block on.

        >>> WindowedRows(np.array([0, 0]), np.array([0, 4, 9]), np.array([5, 4]),
        ...              np.array([1, 3])).block_indices(6, torch.device("cpu"))
        tensor([[0, 1, 2, 3, 4, 5],
                [0, 3, 4, 5, 5, 5]])
        """
        num_rows = self.num_rows
        return reduced_block_indices(
            torch.arange(SINK_BLOCKS, device=device).expand(num_rows, -1),
            torch.full((num_rows,), SINK_BLOCKS, device=device),
            torch.from_numpy(self.tail_start_block).to(device),
            width,
        )


def windowed_rows(
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    windowed: np.ndarray,
    window: int,
    block_size: int,
) -> WindowedRows | None:
    """Splits the rows marked `windowed` ([R] bool) whose tokens reach past the sink, the
    window and one piece; None when none does. query_start_loc [R + 1] and seq_lens [R]
    are the pass's, a row's tokens being the last of its sequence.

    One row of 1,600 tokens, positions 0 to 1,599, 128-token blocks, a window of 256:
    pieces of 4 blocks at 0, 512, 1,024 and 1,536. The second reads the sink block, then
    from block 2 (positions 256 on): its sequence ends at 1,024 with block 1 left out,
    1,024 - 128 = 1,600 - 704. The fourth reads from block 10 (positions 1,280 on):

    >>> rows = windowed_rows(np.array([0, 1600]), np.array([1600]), np.array([True]), 256, 128)
    >>> rows.rows.tolist(), rows.query_start_loc.tolist()
    ([0, 0, 0, 0], [0, 512, 1024, 1536, 1600])
    >>> rows.cut.tolist(), rows.tail_start_block.tolist()
    ([1088, 704, 704, 1152], [1, 2, 6, 10])

    The same prompt with its first 1,408 tokens from the prefix cache: its 192 tokens are
    the rest of the piece at 1,024 and the piece at 1,536, read as in the whole prefill:

    >>> rows = windowed_rows(np.array([0, 192]), np.array([1600]), np.array([True]), 256, 128)
    >>> rows.query_start_loc.tolist(), rows.cut.tolist(), rows.tail_start_block.tolist()
    ([0, 128, 192], [704, 1152], [6, 10])
    """
    piece_tokens = PIECE_BLOCKS * block_size
    query_lens = np.diff(query_start_loc)
    reaches = windowed & (seq_lens > SINK_BLOCKS * block_size + window + piece_tokens)
    if not reaches.any():
        return None
    first_positions = seq_lens - query_lens
    first_pieces = first_positions // piece_tokens
    num_pieces = np.where(reaches, (seq_lens - 1) // piece_tokens - first_pieces + 1, 1)
    rows = np.repeat(np.arange(query_lens.shape[0]), num_pieces)
    piece_index = np.arange(rows.shape[0]) - np.repeat(np.cumsum(num_pieces) - num_pieces, num_pieces)
    piece_starts = (first_pieces[rows] + piece_index) * piece_tokens
    split = reaches[rows]
    start_positions = np.maximum(piece_starts, first_positions[rows])
    end_positions = np.where(split, np.minimum(piece_starts + piece_tokens, seq_lens[rows]), seq_lens[rows])
    starts = query_start_loc[rows] + start_positions - first_positions[rows]
    ends = query_start_loc[rows] + end_positions - first_positions[rows]
    tail_start_block = np.where(
        split, np.maximum(SINK_BLOCKS, (piece_starts - window) // block_size), SINK_BLOCKS
    )
    cut = (query_start_loc[rows + 1] - ends) + (tail_start_block - SINK_BLOCKS) * block_size
    return WindowedRows(
        rows=rows,
        query_start_loc=np.r_[starts, query_start_loc[-1]],
        cut=cut,
        tail_start_block=tail_start_block,
    )
