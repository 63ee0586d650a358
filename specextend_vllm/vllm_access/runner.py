"""The V1 model runner's proposer base class, the batch it drafts for, and the forward
context a draft pass runs in."""

from __future__ import annotations

from typing import Any

from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.draft_model import DraftModelProposer

__all__ = ["DraftModelProposer", "request_ids", "set_forward_context"]


def request_ids(runner: Any, num_reqs: int) -> list[str]:
    """The ids of the batch's requests, in the order of its rows."""
    return runner.input_batch.req_ids[:num_reqs]
