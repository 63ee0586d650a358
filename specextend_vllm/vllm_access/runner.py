"""The V1 model runner's proposer base class, the batch it drafts for, and the forward
context a draft pass runs in."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer

__all__ = [
    "DraftModelProposer",
    "extension_attention_metadata",
    "request_ids",
    "set_forward_context",
    "token_ids",
]


def request_ids(runner: Any, num_reqs: int) -> list[str]:
    """The ids of the batch's requests, in the order of its rows."""
    return runner.input_batch.req_ids[:num_reqs]


def token_ids(runner: Any, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The tokens at `positions` of the requests in batch `rows` (the runner's history)."""
    return runner.input_batch.token_ids_cpu[rows, positions]


def extension_attention_metadata(
    block_table: torch.Tensor,
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> CommonAttentionMetadata:
    """A batch extending each request's cached tokens by query_lens [L] new ones, causally,
    to seq_lens [L] tokens in all (the shape of a prompt's later chunk); block_table: [L, W]."""
    query_lens = query_lens.to(torch.int32)
    query_start_loc = torch.zeros(query_lens.shape[0] + 1, dtype=torch.int32, device=query_lens.device)
    torch.cumsum(query_lens, 0, out=query_start_loc[1:])
    seq_lens = seq_lens.to(torch.int32)
    seq_lens_cpu = seq_lens.cpu()
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.cpu(),
        seq_lens=seq_lens,
        num_reqs=query_lens.shape[0],
        num_actual_tokens=slot_mapping.shape[0],
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens_cpu.max()),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=seq_lens_cpu,
    )
