"""`verification_attention: auto` on CPU: each verification step runs on hybrid attention
or on vLLM's, as `algorithm.verification_choice` picks for the batch's context, and times
its layers' attention calls for the choice. Plain decoding steps (one token per request)
choose the same way between the plugin's prefix kernel and vLLM's decode attention, with
a chooser of their own: at 8K and 16K on 2 cores the kernel's attention for one token
took 0.74-0.84x vLLM's per step (RESULTS: Plain decoding steps on the prefix kernel)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from specextend_vllm.algorithm.verification_choice import VerificationChooser, context_bucket
from specextend_vllm.verification.hybrid import HybridVerificationAttention
from specextend_vllm.verification.prefix_attention import VerificationBatch


class MeasuredVerificationStep:
    """What every layer's path shares within a step of one kind (verifying, or plain
    decoding): the way it computes (`native`: vLLM's attention), and the time its layers'
    attention calls took so far. The step's time reaches the chooser when the next step
    of the kind starts; `on_native` or `on_kernel` is called once per step."""

    def __init__(
        self,
        chooser: VerificationChooser,
        on_native: Callable[[], None] | None = None,
        on_kernel: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.chooser = chooser
        self.clock = clock
        self.native = False
        self._on_native = on_native
        self._on_kernel = on_kernel
        self._bucket = -1
        self._seconds = 0.0

    def start(self, batch: VerificationBatch) -> None:
        if self._bucket >= 0:
            self.chooser.record_step(self._bucket, self.native, self._seconds)
        self._bucket = context_bucket(int(batch.seq_lens.sum()))
        self.native = self.chooser.verifies_natively(self._bucket)
        self._seconds = 0.0
        callback = self._on_native if self.native else self._on_kernel
        if callback is not None:
            callback()

    def add(self, seconds: float) -> None:
        self._seconds += seconds


def decodes(batch: Any) -> bool:
    """Whether a batch is a plain decoding step: one new token per request."""
    return getattr(batch, "max_query_len", 0) == 1


class MeasuredVerificationAttention:
    """A target layer's attention on verification batches and plain decoding batches under
    `auto`: the step's way, timed; the first layer starts the step."""

    def __init__(
        self,
        hybrid: HybridVerificationAttention,
        verification_step: MeasuredVerificationStep,
        decoding_step: MeasuredVerificationStep,
        starts_step: bool,
    ):
        self.hybrid = hybrid
        self.verification_step = verification_step
        self.decoding_step = decoding_step
        self.starts_step = starts_step

    def handles(self, batch: Any) -> bool:
        return self.hybrid.handles(batch) or decodes(batch)

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        raw_kv_cache: torch.Tensor,
        batch: VerificationBatch,
        output: torch.Tensor,
        backend: Callable[[], Any],
    ) -> torch.Tensor:
        verifies = not decodes(batch)
        step = self.verification_step if verifies else self.decoding_step
        if self.starts_step:
            step.start(batch)
        started = step.clock()
        if step.native:
            backend()
        elif verifies:
            self.hybrid(query, key, value, raw_kv_cache, batch, output, backend)
        else:
            self.hybrid.attend(query, key, value, raw_kv_cache, batch, output, None)
        step.add(step.clock() - started)
        return output
