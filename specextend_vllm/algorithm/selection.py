"""Which chunks a request keeps, and the reduced block tables the draft attends through.

Every function works on whole batches, one row per request. Chunk and block indices here
are logical (positions in a request's block table).
"""

from __future__ import annotations

from typing import Literal

import torch

# `cmr`: the chunks the target attends to most; `streaming`: the first chunk and the most
# recent ones (StreamingLLM); `full`: the whole cache.
RetrievalPolicy = Literal["cmr", "streaming", "full"]
# How `cmr` ranks chunks: `attention`: by the target's attention to each; `continuation`: by
# the larger of its own and its predecessor's, so a chunk the target attends to keeps the
# text that follows it (what a draft copies from an earlier passage is its continuation).
ChunkRanking = Literal["attention", "continuation"]


def select_top_chunks(
    chunk_scores: torch.Tensor, num_candidates: torch.Tensor, num_kept: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keeps the `num_kept` best-scored of the first `num_candidates` chunks, in order.

    >>> select_top_chunks(torch.tensor([[.1, .5, .2, .9, .3]]), torch.tensor([4]), 2)
    (tensor([[1, 3]]), tensor([2]))

    Rows with fewer candidates than `num_kept` keep them all; unused columns hold the
    largest chunk index and are past the count.
    """
    num_chunks = chunk_scores.shape[1]
    chunk_ids = torch.arange(num_chunks, device=chunk_scores.device)
    is_candidate = chunk_ids[None, :] < num_candidates[:, None]
    masked = chunk_scores.masked_fill(~is_candidate, float("-inf"))
    width = min(num_kept, num_chunks)
    top = masked.topk(width, dim=1).indices
    counts = num_candidates.clamp(max=width)
    is_kept = torch.arange(width, device=top.device)[None, :] < counts[:, None]
    kept = torch.where(is_kept, top, num_chunks).sort(dim=1).values
    return kept, counts


def continuation_scores(chunk_scores: torch.Tensor) -> torch.Tensor:
    """[R, C] chunk scores -> [R, C]: each chunk's score or its predecessor's, the larger.

    The target attends to chunk 1 most: chunks 1 and 2 now rank first, where 1 and 3 did.

    >>> continuation_scores(torch.tensor([[.1, .9, .2, .5, .3]]))
    tensor([[0.1000, 0.9000, 0.9000, 0.5000, 0.5000]])
    """
    predecessors = torch.cat([chunk_scores[:, :1], chunk_scores[:, :-1]], dim=1)
    return torch.maximum(chunk_scores, predecessors)


def select_streaming_chunks(
    num_candidates: torch.Tensor, num_kept: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """StreamingLLM's cache: the first chunk and the most recent candidates.

    >>> kept, counts = select_streaming_chunks(torch.tensor([10, 2]), 3)
    >>> kept[0].tolist(), kept[1, :2].tolist(), counts.tolist()
    ([0, 8, 9], [0, 1], [3, 2])
    """
    slots = torch.arange(num_kept, device=num_candidates.device)[None, :]
    counts = num_candidates.clamp(max=num_kept)
    recent = num_candidates[:, None] - num_kept + slots
    kept = torch.where(slots == 0, 0, torch.where(counts[:, None] < num_kept, slots, recent))
    return kept, counts


def select_chunks(
    policy: RetrievalPolicy,
    ranking: ChunkRanking,
    chunk_scores: torch.Tensor | None,
    num_candidates: torch.Tensor,
    num_kept: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if policy == "cmr":
        assert chunk_scores is not None
        if ranking == "continuation":
            chunk_scores = continuation_scores(chunk_scores)
        return select_top_chunks(chunk_scores, num_candidates, num_kept)
    if policy == "streaming":
        return select_streaming_chunks(num_candidates, num_kept)
    raise ValueError(f"policy {policy!r} selects no chunks")


def kept_attention_share(
    chunk_scores: torch.Tensor,
    kept_chunks: torch.Tensor,
    num_kept_chunks: torch.Tensor,
    num_candidates: torch.Tensor,
) -> torch.Tensor:
    """The kept chunks' share of the attention mass over the candidate chunks.

    Chunks 1 and 3 of the first four: (.5 + .9) / (.1 + .5 + .2 + .9).

    >>> scores = torch.tensor([[.1, .5, .2, .9, .3]])
    >>> kept_attention_share(scores, torch.tensor([[1, 3]]), torch.tensor([2]), torch.tensor([4]))
    tensor([0.8235])

    Candidates are whole chunks, so mean scores weigh as masses do.
    """
    num_chunks = chunk_scores.shape[1]
    chunk_ids = torch.arange(num_chunks, device=chunk_scores.device)
    scores = torch.where(chunk_ids[None, :] < num_candidates[:, None], chunk_scores, 0.0)
    is_kept = (
        torch.arange(kept_chunks.shape[1], device=kept_chunks.device)[None, :]
        < num_kept_chunks[:, None]
    )
    kept_scores = scores.gather(1, kept_chunks.clamp(max=num_chunks - 1))
    kept_mass = torch.where(is_kept, kept_scores, 0.0).sum(dim=1)
    return kept_mass / scores.sum(dim=1).clamp(min=torch.finfo(scores.dtype).tiny)


def chunks_to_blocks(kept_chunks: torch.Tensor, blocks_per_chunk: int) -> torch.Tensor:
    """Expands chunk indices to the block indices they cover.

    >>> chunks_to_blocks(torch.tensor([[1, 3]]), blocks_per_chunk=2)
    tensor([[2, 3, 6, 7]])
    """
    offsets = torch.arange(blocks_per_chunk, device=kept_chunks.device)
    return (kept_chunks[:, :, None] * blocks_per_chunk + offsets).flatten(1)


def reduced_block_indices(
    kept_blocks: torch.Tensor,
    num_kept_blocks: torch.Tensor,
    tail_start_block: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """Logical block indices of a reduced block table: kept blocks, then the tail.

    >>> reduced_block_indices(torch.tensor([[2, 5]]), torch.tensor([2]), torch.tensor([9]), 16)
    tensor([[ 2,  5,  9, 10, 11, 12, 13, 14, 15, 15, 15, 15, 15, 15, 15, 15]])

    A row with no kept blocks and tail 0 is the identity.
    Indices past the request's blocks are harmless: the reduced sequence length
    stops before them.
    """
    columns = torch.arange(width, device=kept_blocks.device)[None, :]
    kept_part = kept_blocks.gather(
        1, columns.clamp(max=kept_blocks.shape[1] - 1).expand(kept_blocks.shape[0], -1)
    )
    tail_part = tail_start_block[:, None] + columns - num_kept_blocks[:, None]
    indices = torch.where(columns < num_kept_blocks[:, None], kept_part, tail_part)
    return indices.clamp(max=width - 1)
