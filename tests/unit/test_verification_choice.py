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


class FakeHybrid:
    """Hybrid attention's stand-in: verifies batches of 2 or more new tokens a request."""

    def __init__(self, clock: FakeClock, verify_s: float, decode_s: float):
        self.verify = clock.attention("hybrid", verify_s)
        self.attend = clock.attention("kernel decode", decode_s)

    def handles(self, batch: SimpleNamespace) -> bool:
        return batch.max_query_len >= 2

    def __call__(self, *args: object) -> None:
        self.verify(*args)


def measured_layers(clock: FakeClock, num_layers: int, verify_s: float, decode_s: float) -> tuple[
    list[MeasuredVerificationAttention], MeasuredVerificationStep, MeasuredVerificationStep, list[str]
]:
    """num_layers layers sharing a verification step and a decoding step; the callbacks'
    calls are noted."""
    calls: list[str] = []
    verification_step = MeasuredVerificationStep(
        VerificationChooser(), on_native=lambda: calls.append("native verification"),
        clock=lambda: clock.now,
    )
    decoding_step = MeasuredVerificationStep(
        VerificationChooser(), on_kernel=lambda: calls.append("kernel decode"),
        clock=lambda: clock.now,
    )
    layers = []
    for index in range(num_layers):
        hybrid = FakeHybrid(clock, verify_s, decode_s)
        layer = MeasuredVerificationAttention(
            hybrid, verification_step, decoding_step, starts_step=index == 0  # type: ignore[arg-type]
        )
        layers.append(layer)
    return layers, verification_step, decoding_step, calls


def test_a_step_runs_every_layer_one_way_and_is_timed_over_all_layers() -> None:
    """Hybrid attention takes 4 ms a layer, vLLM's 1 ms; 3 layers."""
    clock = FakeClock()
    layers, step, _, calls = measured_layers(clock, 3, verify_s=0.004, decode_s=0.0)
    batch = SimpleNamespace(seq_lens=torch.tensor([1500, 1600]), max_query_len=5)
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
    assert calls == ["native verification"] * 5


def test_plain_decoding_steps_choose_on_their_own_between_the_kernel_and_vllms() -> None:
    """Verification steps and plain decoding steps (one token a request) alternate in the
    same context bucket: hybrid verification takes 4 ms a layer against vLLM's 1 ms, the
    kernel's decoding 1 ms against vLLM's 3 ms. Each kind keeps its own faster way (the
    verification steps verify one draft: two tokens a request, the fewest that verify)."""
    clock = FakeClock()
    layers, verification_step, decoding_step, calls = measured_layers(
        clock, 2, verify_s=0.004, decode_s=0.001
    )
    verifying = SimpleNamespace(seq_lens=torch.tensor([3000]), max_query_len=2)
    decoding = SimpleNamespace(seq_lens=torch.tensor([3000]), max_query_len=1)
    tensor = torch.zeros(1)
    steps = 3 * MEASURING_STEPS
    for _ in range(steps):
        for batch, native_s in ((verifying, 0.001), (decoding, 0.003)):
            for layer in layers:
                layer(tensor, tensor, tensor, tensor, batch, tensor, clock.attention("native", native_s))
    ways = [clock.ways[i] for i in range(0, len(clock.ways), 2)]
    verification_ways, decoding_ways = ways[0::2], ways[1::2]
    # After measuring, each kind explores the other way for a few steps only.
    settled = steps - MEASURING_STEPS - 2 * SCHEDULE.exploration_steps
    assert verification_ways[MEASURING_STEPS:].count("native") >= settled
    assert decoding_ways[MEASURING_STEPS:].count("kernel decode") >= settled
    verified = verification_step.chooser.buckets[context_bucket(3000)]
    decoded = decoding_step.chooser.buckets[context_bucket(3000)]
    assert verified.first.step_s.value > verified.second.step_s.value  # hybrid 8 ms, vLLM 2 ms
    assert decoded.first.step_s.value < decoded.second.step_s.value  # kernel 2 ms, vLLM 6 ms
    assert calls.count("kernel decode") == decoding_ways.count("kernel decode")
    assert calls.count("native verification") == verification_ways.count("native")


def test_steps_measured_as_taking_no_time_keep_the_choice_finite() -> None:
    """A clock coarser than the attention calls reads 0 s on one way: that way is kept."""
    chooser = VerificationChooser()
    ways = run_steps(chooser, context_bucket(5000), 60, hybrid_s=0.0, native_s=0.06)
    assert ways[MEASURING_STEPS:].count(False) >= 0.9 * (60 - MEASURING_STEPS)
