"""`verification_attention: auto` on CPU: each verification step runs on hybrid attention
or on vLLM's, as `algorithm.verification_choice` picks for the batch's context, and times
its layers' attention calls for the choice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from specextend_vllm.algorithm.verification_choice import VerificationChooser, context_bucket
from specextend_vllm.verification.hybrid import HybridVerificationAttention
from specextend_vllm.verification.prefix_attention import VerificationBatch


class MeasuredVerificationStep:
    """What every layer's path shares within a verification step: the way it verifies
    (`native`), and the time its layers' attention calls took so far. The step's time
    reaches the chooser when the next verification step starts."""

    def __init__(
        self,
        chooser: VerificationChooser,
        on_native_verification: Callable[[], None],
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.chooser = chooser
        self.clock = clock
        self.native = False
        self._on_native_verification = on_native_verification
        self._bucket = -1
        self._seconds = 0.0

    def start(self, batch: VerificationBatch) -> None:
        if self._bucket >= 0:
            self.chooser.record_step(self._bucket, self.native, self._seconds)
        self._bucket = context_bucket(int(batch.seq_lens.sum()))
        self.native = self.chooser.verifies_natively(self._bucket)
        self._seconds = 0.0
        if self.native:
            self._on_native_verification()

    def add(self, seconds: float) -> None:
        self._seconds += seconds


class MeasuredVerificationAttention:
    """A target layer's attention on verification batches under `auto`: the step's way,
    timed; the first layer starts the step."""

    def __init__(
        self, hybrid: HybridVerificationAttention, step: MeasuredVerificationStep, starts_step: bool
    ):
        self.hybrid = hybrid
        self.step = step
        self.starts_step = starts_step

    def handles(self, batch: Any) -> bool:
        return self.hybrid.handles(batch)

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
        step = self.step
        if self.starts_step:
            step.start(batch)
        started = step.clock()
        if step.native:
            backend()
        else:
            self.hybrid(query, key, value, raw_kv_cache, batch, output, backend)
        step.add(step.clock() - started)
        return output
