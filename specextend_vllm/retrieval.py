"""Chunk selection and the reduced block tables the draft attends through.

Pure torch, no vLLM: every function works on whole batches, one row per request.
Chunk and block indices here are logical (positions in a request's block table).
"""

from __future__ import annotations

import torch

from specextend_vllm.config import RetrievalPolicy


def select_top_chunks(
    chunk_scores: torch.Tensor, num_candidates: torch.Tensor, num_kept: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keeps the `num_kept` best-scored of the first `num_candidates` chunks, in order.

    Example: scores [[.1, .5, .2, .9, .3]], num_candidates [4], num_kept 2
    -> kept [[1, 3]], counts [2]. Rows with fewer candidates than `num_kept` keep
    them all; unused columns hold the largest chunk index and are past the count.
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


def select_streaming_chunks(
    num_candidates: torch.Tensor, num_kept: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """StreamingLLM's cache: the first chunk and the most recent candidates.

    Example: num_candidates [10, 2], num_kept 3 -> kept [[0, 8, 9], [0, 1, ...]],
    counts [3, 2].
    """
    slots = torch.arange(num_kept, device=num_candidates.device)[None, :]
    counts = num_candidates.clamp(max=num_kept)
    recent = num_candidates[:, None] - num_kept + slots
    kept = torch.where(slots == 0, 0, torch.where(counts[:, None] < num_kept, slots, recent))
    return kept, counts


def select_chunks(
    policy: RetrievalPolicy,
    chunk_scores: torch.Tensor | None,
    num_candidates: torch.Tensor,
    num_kept: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if policy == "cmr":
        assert chunk_scores is not None
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

    Example: scores [[.1, .5, .2, .9, .3]], kept [[1, 3]], num_kept [2], num_candidates
    [4] -> [(.5 + .9) / (.1 + .5 + .2 + .9)] = [0.8235]. Candidates are whole chunks,
    so mean scores weigh as masses do.
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

    Example: kept_chunks [[1, 3]], blocks_per_chunk 2 -> [[2, 3, 6, 7]].
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

    Example: kept_blocks [[2, 5]], num_kept_blocks [2], tail_start_block [9], width 6
    -> [[2, 5, 9, 10, 11, 12]]. A row with no kept blocks and tail 0 is the identity.
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


class RetrievalState:
    """Per-request selections, in fixed slots created and freed with the requests.

    kept_blocks[s, :num_kept_blocks[s]]: the logical blocks the request in slot s keeps;
    tail_start_block[s]: its first block of newest tokens, attended in full;
    steps_since_selection[s]: draft steps since the slot's selection (-1: none yet);
    compact[s]: whether the selection drafts on compact positions (a working copy);
    selected_share[s]: the kept chunks' share of the target's attention when selected.
    """

    def __init__(self, max_requests: int, max_kept_blocks: int, device: torch.device):
        self.kept_blocks = torch.zeros(
            max_requests, max(max_kept_blocks, 1), dtype=torch.int64, device=device
        )
        self.num_kept_blocks = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.tail_start_block = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.steps_since_selection = torch.full(
            (max_requests,), -1, dtype=torch.int64, device=device
        )
        self.compact = torch.zeros(max_requests, dtype=torch.bool, device=device)
        self.selected_share = torch.zeros(max_requests, dtype=torch.float32, device=device)
        self._slot_by_request: dict[str, int] = {}
        self._free_slots = list(range(max_requests - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._slot_by_request)

    def slots(self, request_ids: list[str]) -> torch.Tensor:
        """Slot of each request, creating empty ones for requests not seen before."""
        slot_by_request = self._slot_by_request
        for request_id in request_ids:
            if request_id not in slot_by_request:
                slot = self._free_slots.pop()
                slot_by_request[request_id] = slot
                self.steps_since_selection[slot] = -1
        return torch.tensor([slot_by_request[r] for r in request_ids], dtype=torch.int64).to(
            self.kept_blocks.device, non_blocking=True
        )

    def reset(self, request_ids: list[str]) -> None:
        """Forgets the selections of requests that start over (resumed after preemption)."""
        slots = [self._slot_by_request[r] for r in request_ids if r in self._slot_by_request]
        if slots:
            self.steps_since_selection[slots] = -1

    def free(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            slot = self._slot_by_request.pop(request_id, None)
            if slot is not None:
                self._free_slots.append(slot)

    def store(
        self,
        slots: torch.Tensor,
        kept_blocks: torch.Tensor,
        num_kept_blocks: torch.Tensor,
        tail_start_block: torch.Tensor,
        compact: torch.Tensor,
        selected_share: torch.Tensor,
    ) -> None:
        self.kept_blocks[slots, : kept_blocks.shape[1]] = kept_blocks
        self.num_kept_blocks[slots] = num_kept_blocks
        self.tail_start_block[slots] = tail_start_block
        self.compact[slots] = compact
        self.selected_share[slots] = selected_share
        self.steps_since_selection[slots] = 0
