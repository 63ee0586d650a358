"""`verification_attention: auto` on CPU: per bucket of the batch's context tokens, the
faster of hybrid and vLLM's attention, from the time of every layer's attention call."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

from specextend_vllm.algorithm.verification_choice import (
    SCHEDULE,
    VerificationChooser,
    context_bucket,
)
from specextend_vllm.verification.measured import (
    MeasuredVerificationAttention,
    MeasuredVerificationStep,
)

MEASURING_STEPS = 2 * SCHEDULE.min_samples


def run_steps(chooser: VerificationChooser, bucket: int, steps: int, hybrid_s: float, native_s: float) -> list[bool]:
    ways = []
    for _ in range(steps):
        native = chooser.verifies_natively(bucket)
        chooser.record_step(bucket, native, native_s if native else hybrid_s)
        ways.append(native)
    return ways


def test_measures_both_in_turns_then_keeps_the_faster_per_bucket() -> None:
    chooser = VerificationChooser()
    short, long = context_bucket(3000), context_bucket(12000)
    short_ways = run_steps(chooser, short, 100, hybrid_s=0.08, native_s=0.06)
    long_ways = run_steps(chooser, long, 100, hybrid_s=0.09, native_s=0.13)
    assert short_ways[:MEASURING_STEPS] == [False, False, True, True] * 2
    assert short_ways[MEASURING_STEPS:].count(True) >= 0.9 * (100 - MEASURING_STEPS)
    assert long_ways[MEASURING_STEPS:].count(False) >= 0.9 * (100 - MEASURING_STEPS)


def test_explores_the_other_way_and_follows_a_change() -> None:
    chooser = VerificationChooser()
    bucket = context_bucket(5000)
    before = run_steps(chooser, bucket, 60, hybrid_s=0.08, native_s=0.06)
    after = run_steps(chooser, bucket, 60, hybrid_s=0.08, native_s=0.12)
    assert before[MEASURING_STEPS:].count(False) >= SCHEDULE.exploration_steps
    assert after[-30:].count(False) >= 0.9 * 30


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.ways: list[str] = []

    def attention(self, way: str, seconds: float) -> Callable[..., None]:
        def call(*_: object) -> None:
            self.now += seconds
            self.ways.append(way)

        return call


def test_a_step_runs_every_layer_one_way_and_is_timed_over_all_layers() -> None:
    """Hybrid attention takes 4 ms a layer, vLLM's 1 ms; 3 layers."""
    clock = FakeClock()
    step = MeasuredVerificationStep(VerificationChooser(), lambda: None, clock=lambda: clock.now)
    layers = []
    for index in range(3):
        hybrid = SimpleNamespace(handles=lambda batch: True)
        layer = MeasuredVerificationAttention(hybrid, step, starts_step=index == 0)  # type: ignore[arg-type]
        layer.hybrid = clock.attention("hybrid", 0.004)  # type: ignore[assignment]
        layers.append(layer)
    batch = SimpleNamespace(seq_lens=torch.tensor([1500, 1600]))
    tensor = torch.zeros(1)
    for _ in range(MEASURING_STEPS + 1):
        for layer in layers:
            layer(tensor, tensor, tensor, tensor, batch, tensor, clock.attention("native", 0.001))
    steps = [clock.ways[i : i + 3] for i in range(0, len(clock.ways), 3)]
    assert [way for way, *_ in steps] == ["hybrid"] * 2 + ["native"] * 2 + ["hybrid"] * 2 + ["native"] * 3
    assert all(len(set(layer_ways)) == 1 for layer_ways in steps)
    bucket = step.chooser.buckets[context_bucket(3100)]
    assert bucket.first.samples == bucket.second.samples == SCHEDULE.min_samples
    assert abs(bucket.first.step_s.value - 0.012) < 1e-9 and abs(bucket.second.step_s.value - 0.003) < 1e-9
    assert step.chooser.verifies_natively(context_bucket(3100))
