"""The draft's windowed passes over prompts: which tokens each token attends to, read as the
attention backend reads the split rows (a row's tokens are the last of its sequence, its
keys the blocks its table lists)."""

from __future__ import annotations

import numpy as np
import torch

from specextend_vllm.algorithm.prefill_window import PIECE_BLOCKS, SINK_BLOCKS, windowed_rows

BLOCK_SIZE = 16
WINDOW = 40


def visible_positions(query_start_loc: np.ndarray, seq_lens: np.ndarray, windowed: np.ndarray) -> dict[tuple[int, int], set[int]]:
    """(source row, position) -> the positions of the keys that token attends to, after the
    split, with logical key l of a row read from its table's block l // BLOCK_SIZE."""
    split = windowed_rows(query_start_loc, seq_lens, windowed, WINDOW, BLOCK_SIZE)
    assert split is not None
    indices = split.block_indices(int(seq_lens.max()) // BLOCK_SIZE + 1, torch.device("cpu")).numpy()
    seen: dict[tuple[int, int], set[int]] = {}
    for row in range(split.num_rows):
        source = split.rows[row]
        first, last = split.query_start_loc[row], split.query_start_loc[row + 1]
        seq_len = seq_lens[source] - split.cut[row]
        source_end = query_start_loc[source + 1]
        for token in range(first, last):
            position = seq_lens[source] - (source_end - token)
            logical = seq_len - (last - token)
            keys = np.arange(logical + 1)
            seen[(source, position)] = set(
                (indices[row, keys // BLOCK_SIZE] * BLOCK_SIZE + keys % BLOCK_SIZE).tolist()
            )
    return seen


def test_each_prompt_token_attends_to_the_sink_its_window_and_nothing_later() -> None:
    """A prompt prefilled from position 0, one whose second chunk starts at 150, and a
    request verifying 3 tokens (not windowed)."""
    seq_lens = np.array([300, 350, 200])
    query_lens = np.array([300, 200, 3])
    query_start_loc = np.r_[0, np.cumsum(query_lens)]
    seen = visible_positions(query_start_loc, seq_lens, query_lens > 5)
    assert len(seen) == query_lens.sum()
    sink = set(range(SINK_BLOCKS * BLOCK_SIZE))
    longest = SINK_BLOCKS * BLOCK_SIZE + WINDOW + BLOCK_SIZE + 2 * PIECE_BLOCKS * BLOCK_SIZE
    for (row, position), keys in seen.items():
        assert max(keys) == position, (row, position)
        if row == 2:
            assert keys == set(range(position + 1))
            continue
        assert sink & set(range(position + 1)) <= keys
        assert set(range(max(0, position - WINDOW), position + 1)) <= keys
        assert len(keys) <= longest
    assert len(seen[(0, 299)]) < 300 and len(seen[(1, 349)]) < 350


def test_short_prompts_and_short_queries_are_left_whole() -> None:
    assert windowed_rows(np.array([0, 100, 103]), np.array([100, 500]), np.array([True, False]), WINDOW, BLOCK_SIZE) is None


def test_what_a_token_attends_to_depends_on_its_position_only() -> None:
    """A prompt of 350 tokens prefilled whole, and the same prompt's tokens from each of
    several positions on (a later chunk of its prefill, or the part a prefix-cache hit
    leaves to compute, such as its last block): every token attends to the same keys.
    Injected: pieces counted from each pass's first token (as before), where a prompt's
    recomputed last block read fewer keys than in its first prefill; caught."""
    seq_lens = np.array([350])
    whole = visible_positions(np.array([0, 350]), seq_lens, np.array([True]))
    for first_position in (96, 150, 200, 256, 320, 336):
        query_len = 350 - first_position
        if query_len <= SINK_BLOCKS * BLOCK_SIZE:
            continue
        part = visible_positions(np.array([0, query_len]), seq_lens, np.array([True]))
        assert part == {key: whole[key] for key in part}, first_position
