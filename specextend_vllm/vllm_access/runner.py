"""The V1 model runner's proposer base class, the batch it drafts for, and the forward
context a draft pass runs in; the attention metadata of the passes the method reshapes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer

__all__ = [
    "DraftModelProposer",
    "extension_attention_metadata",
    "keep_tokens",
    "request_ids",
    "set_forward_context",
    "split_attention_rows",
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


def keep_tokens(
    metadata: CommonAttentionMetadata, kept_tokens: np.ndarray, query_start_loc: np.ndarray
) -> CommonAttentionMetadata:
    """The same rows, as long, with only the pass's tokens kept_tokens [T'] (the last ones
    of each row), query_start_loc [R + 1] the rows' starts among them."""
    device = metadata.query_start_loc.device
    query_start_loc_cpu = torch.from_numpy(query_start_loc).to(metadata.query_start_loc_cpu.dtype)
    kept = torch.from_numpy(kept_tokens).to(device)
    return dataclasses.replace(
        metadata,
        query_start_loc=query_start_loc_cpu.to(device),
        query_start_loc_cpu=query_start_loc_cpu,
        num_actual_tokens=int(kept_tokens.shape[0]),
        max_query_len=int(np.diff(query_start_loc).max()),
        slot_mapping=metadata.slot_mapping[kept],
        positions=None if metadata.positions is None else metadata.positions[..., kept],
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )


# Per-request fields of other attention features (encoder, context parallelism,
# multimodal prefix LM, R-SWA, Mamba): a pass carrying one is not split into rows.
_UNSPLIT_REQUEST_FIELDS = (
    "encoder_seq_lens",
    "encoder_seq_lens_cpu",
    "dcp_local_seq_lens",
    "dcp_local_seq_lens_cpu_upper_bound",
    "mm_req_doc_ranges",
    "rswa_prefix_lens",
    "replayssm_decode_base_cpu",
)


def split_attention_rows(
    metadata: CommonAttentionMetadata,
    rows: np.ndarray,
    query_start_loc: np.ndarray,
    cut: np.ndarray,
    block_table: torch.Tensor,
) -> CommonAttentionMetadata | None:
    """The same tokens as V rows: row i holds tokens query_start_loc[i] to
    query_start_loc[i + 1] of source row rows[i] [V], its sequence cut[i] [V] tokens
    shorter, read through block_table [V, W]; None where the metadata carries per-request
    fields of other attention features (the pass then attends as it was)."""
    if metadata.seq_lens.shape[0] != metadata.num_reqs or any(
        getattr(metadata, name) is not None for name in _UNSPLIT_REQUEST_FIELDS
    ):
        return None
    device = metadata.seq_lens.device
    device_rows = torch.from_numpy(rows).to(device)
    cut_cpu = torch.from_numpy(cut)
    query_start_loc_cpu = torch.from_numpy(query_start_loc).to(metadata.query_start_loc_cpu.dtype)

    def per_row(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, np.ndarray):
            return value[rows]
        return value[torch.from_numpy(rows).to(value.device)]

    upper_bound = metadata.seq_lens_cpu_upper_bound
    return dataclasses.replace(
        metadata,
        query_start_loc=query_start_loc_cpu.to(device),
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens=metadata.seq_lens[device_rows] - cut_cpu.to(device, metadata.seq_lens.dtype),
        num_reqs=int(rows.shape[0]),
        max_query_len=int(np.diff(query_start_loc).max()),
        block_table_tensor=block_table,
        causal=per_row(metadata.causal) if isinstance(metadata.causal, torch.Tensor) else metadata.causal,
        is_prefilling=per_row(metadata.is_prefilling),
        req_idx=per_row(metadata.req_idx),
        seq_lens_cpu_upper_bound=None
        if upper_bound is None
        else upper_bound[torch.from_numpy(rows)] - cut_cpu.to(upper_bound.dtype),
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )
