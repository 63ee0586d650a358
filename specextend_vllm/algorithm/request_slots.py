"""Fixed rows of per-request state, created and freed with the requests."""

from __future__ import annotations

from collections.abc import KeysView
from typing import cast


class RequestSlots:
    """Gives each request a slot in [0, max_requests) for as long as it lives.

    >>> slots = RequestSlots(4)
    >>> slots.assign(["a", "b"]), slots.assign(["b", "c"])
    (([0, 1], [0, 1]), ([1, 2], [2]))
    >>> slots.free(["a"]); slots.assign(["d"])
    ([0], [0])
    """

    def __init__(self, max_requests: int):
        self._slot_by_request: dict[str, int] = {}
        self._free_slots = list(range(max_requests - 1, -1, -1))

    @property
    def request_ids(self) -> KeysView[str]:
        return self._slot_by_request.keys()

    @property
    def num_free(self) -> int:
        return len(self._free_slots)

    def assign(self, request_ids: list[str]) -> tuple[list[int], list[int]]:
        """(the slot of each request, the slots new to this call). The requests are looked
        up in one pass of `map`; only a call with new requests walks them in Python."""
        slots = list(map(self._slot_by_request.get, request_ids))
        if None not in slots:
            return cast(list[int], slots), []
        new_slots = []
        for row, slot in enumerate(slots):
            if slot is None:
                slots[row] = slot = self._free_slots.pop()
                self._slot_by_request[request_ids[row]] = slot
                new_slots.append(slot)
        return cast(list[int], slots), new_slots

    def existing(self, request_ids: list[str]) -> list[int]:
        """The slots of those requests that hold one."""
        return [self._slot_by_request[r] for r in request_ids if r in self._slot_by_request]

    def free(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            slot = self._slot_by_request.pop(request_id, None)
            if slot is not None:
                self._free_slots.append(slot)
