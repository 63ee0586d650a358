"""Scheduler seams."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig

from specextend_vllm.patches.base import VllmPatch
from specextend_vllm.vllm_access import logger
from specextend_vllm.vllm_access.config import working_copy_manager_blocks


class SchedulerLeavesWorkingCopyBlocks(VllmPatch):
    """With working copies (compact positions, or chunks smaller than a block) the
    scheduler allocates from fewer blocks than the workers hold: the last ones keep the
    draft's copies of its kept chunks."""

    target = Scheduler
    attribute = "__init__"

    @staticmethod
    def replacement(
        self: Any,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        reserved = working_copy_manager_blocks(vllm_config, kv_cache_config)
        if reserved:
            logger.info(
                "SpecExtend: %d of %d KV cache blocks hold the draft's working copies",
                reserved,
                kv_cache_config.num_blocks,
            )
            kv_cache_config = dataclasses.replace(
                kv_cache_config, num_blocks=kv_cache_config.num_blocks - reserved
            )
        SchedulerLeavesWorkingCopyBlocks.original(
            self, vllm_config, kv_cache_config, *args, **kwargs
        )
