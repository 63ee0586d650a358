"""Per-request chunk selections, kept on the device in fixed slots."""

from __future__ import annotations

import torch


class RetrievalState:
    """Per-request selections, in fixed slots created and freed with the requests.

    kept_chunks[s, :num_kept_chunks[s]]: the chunks the request in slot s keeps, sorted;
    tail_start[s]: the first position of its newest tokens, attended in full;
    steps_since_selection[s]: draft steps since the slot's selection (-1: none yet);
    compact[s]: whether the selection drafts on compact positions (a working copy);
    selected_share[s]: the kept chunks' share of the target's attention when selected;
    drafted_reduced[s]: whether the request's last drafts were drafted on a reduced cache.
    """

    def __init__(self, max_requests: int, max_kept_chunks: int, device: torch.device):
        self.kept_chunks = torch.zeros(
            max_requests, max(max_kept_chunks, 1), dtype=torch.int64, device=device
        )
        self.num_kept_chunks = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.tail_start = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.steps_since_selection = torch.full(
            (max_requests,), -1, dtype=torch.int64, device=device
        )
        self.compact = torch.zeros(max_requests, dtype=torch.bool, device=device)
        self.selected_share = torch.zeros(max_requests, dtype=torch.float32, device=device)
        self.drafted_reduced = torch.zeros(max_requests, dtype=torch.bool, device=device)
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
                self.drafted_reduced[slot] = False
        return torch.tensor([slot_by_request[r] for r in request_ids], dtype=torch.int64).to(
            self.kept_chunks.device, non_blocking=True
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
        kept_chunks: torch.Tensor,
        num_kept_chunks: torch.Tensor,
        tail_start: torch.Tensor,
        compact: torch.Tensor,
        selected_share: torch.Tensor,
    ) -> None:
        self.kept_chunks[slots, : kept_chunks.shape[1]] = kept_chunks
        self.num_kept_chunks[slots] = num_kept_chunks
        self.tail_start[slots] = tail_start
        self.compact[slots] = compact
        self.selected_share[slots] = selected_share
        self.steps_since_selection[slots] = 0
