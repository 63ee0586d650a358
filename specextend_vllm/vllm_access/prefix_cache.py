"""vLLM's prefix cache as the scheduler holds it: the cached twins of the blocks a step
computes again (`algorithm.block_twins`)."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput

from specextend_vllm.algorithm.block_twins import BlockTwins
from specextend_vllm.vllm_access.config import manager_block_size


def recomputed_block_twins(
    scheduler: Any, scheduler_output: SchedulerOutput
) -> dict[str, BlockTwins]:
    """Per new request of the step that computes whole blocks only, each with a block of
    the same tokens in the prefix cache (a prompt cached whole has its last block computed
    again): those blocks and their cached twins."""
    manager = scheduler.kv_cache_manager
    block_size = manager_block_size(scheduler.kv_cache_config)
    if (
        not manager.enable_caching
        or len(scheduler.kv_cache_config.kv_cache_groups) != 1
        or scheduler.hash_block_size != block_size
    ):
        return {}
    twins = {}
    for new_request in scheduler_output.scheduled_new_reqs:
        request_id = new_request.req_id
        first = new_request.num_computed_tokens
        end = first + scheduler_output.num_scheduled_tokens[request_id]
        block_hashes = scheduler.requests[request_id].block_hashes
        if first % block_size or end % block_size or end // block_size > len(block_hashes):
            continue
        computed = tuple(new_request.block_ids[0][first // block_size : end // block_size])
        cached = []
        for block_hash, block_id in zip(block_hashes[first // block_size :], computed):
            twin = manager.block_pool.get_cached_block(block_hash, [0])
            if twin is None or twin[0].block_id == block_id:
                break
            cached.append(twin[0].block_id)
        if len(cached) == len(computed):
            twins[request_id] = BlockTwins(computed, tuple(cached))
    return twins
