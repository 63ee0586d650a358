"""Per-request chunk selections, kept on the device in fixed slots."""

from __future__ import annotations

from collections.abc import KeysView

import torch

from specextend_vllm.algorithm.request_slots import RequestSlots


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
        self._request_slots = RequestSlots(max_requests)
        # Requests the last `slots` call gave a slot for the first time.
        self.num_new_requests = 0

    @property
    def request_ids(self) -> KeysView[str]:
        """The requests holding a slot."""
        return self._request_slots.request_ids

    @property
    def num_free_slots(self) -> int:
        return self._request_slots.num_free

    def slots(self, request_ids: list[str]) -> torch.Tensor:
        """Slot of each request, creating empty ones for requests not seen before."""
        slots, new_slots = self._request_slots.assign(request_ids)
        self.num_new_requests = len(new_slots)
        if new_slots:
            self.steps_since_selection[new_slots] = -1
            self.drafted_reduced[new_slots] = False
        return torch.tensor(slots, dtype=torch.int64).to(
            self.kept_chunks.device, non_blocking=True
        )

    def reset(self, request_ids: list[str]) -> None:
        """Forgets the selections of requests that start over (resumed after preemption)."""
        slots = self._request_slots.existing(request_ids)
        if slots:
            self.forget_selections(torch.tensor(slots, device=self.steps_since_selection.device))

    def forget_selections(self, slots: torch.Tensor) -> None:
        """The requests in `slots` select afresh at their next reduced step."""
        self.steps_since_selection[slots] = -1

    def free(self, request_ids: list[str]) -> None:
        self._request_slots.free(request_ids)

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
