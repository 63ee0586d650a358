"""The pure helpers the benchmarks read their figures with."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.engine import (
    RequestFigures,
    acceptance_per_position,
    mean_acceptance_length,
    source_commit,
    time_breakdown,
)
from benchmarks.draft_length_simulation import COST_PROFILES, Machine, correct_drafts, decode
from benchmarks.forward_parts import PartClock, decode_figures, prefill_figures
from benchmarks.genres import named_texts, python_sources
from benchmarks.prompts import draft_origin_of_tokens, needle_value
from benchmarks.serving import (
    add_ratios,
    against_plain_steps,
    decoding_steps,
    decoding_steps_added,
    over_rounds,
    plot,
)
from benchmarks.speed_summary import cells_at_defaults, cells_in_one_engine, summarize


def test_origin_of_each_output_token() -> None:
    origins = draft_origin_of_tokens([2, 4], [4, 4], 9)
    assert origins == ["prefill", "accepted", "accepted", "corrected"] + ["accepted"] * 4 + ["bonus"]
    assert draft_origin_of_tokens([2, 4], [4, 4], 5) == origins[:5]


def test_code_texts_are_any_module_of_the_standard_library_in_the_order_named() -> None:
    texts = named_texts(["code/dataclasses", "code/argparse"])
    assert list(texts) == ["code/dataclasses", "code/argparse"]
    assert "def dataclass(" in texts["code/dataclasses"]
    assert texts["code/argparse"] == python_sources()["code/argparse"]


def test_benchmarks_prompt_with_the_texts_named_or_those_of_each_genre() -> None:
    """`--texts` in the order named; with genres, each genre's texts after the first
    `--skip-texts`; `draft_length_modes` labels a genre's text with its genre and takes
    `--texts` before its default genres."""
    from argparse import Namespace

    from benchmarks.draft_length_modes import prompt_labels
    from benchmarks.genres import prompt_texts

    names = ["code/typing", "code/dataclasses"]
    named = prompt_texts(names, None, skip_texts=2, per_genre=1)
    assert named == [(None, name, text) for name, text in named_texts(names).items()]
    by_genre = prompt_texts(names, ["code"], skip_texts=1, per_genre=2)
    sources = list(python_sources().items())[1:3]
    assert by_genre == [("code", name, text) for name, text in sources]

    labelled = prompt_labels(Namespace(texts=names, genres=["code"], skip_texts=2))
    assert labelled == named_texts(names)
    [(label, text)] = prompt_labels(Namespace(texts=None, genres=["code"], skip_texts=1)).items()
    assert (label, text) == (f"code: {sources[0][0]}", sources[0][1])


def test_the_simulated_decode_replays_the_saved_drafts_at_any_number_of_drafts() -> None:
    """The saved run drafted 4 a step and accepted 2, 0, 3: the draft was right on output
    tokens 0-1 and 4-6 and wrong on 2, 3 and 7. Drafting 2 a step replays the same 8
    tokens in 4 steps: 2 accepted from token 0, none from 3, 2 from 4, none from 7."""
    stream = correct_drafts([2, 0, 3], num_drafts=4)
    assert stream == [True, True, False, False, True, True, True, False]
    steps: list[tuple[int, int, list[float]]] = []
    costs = COST_PROFILES["verify_cheap"]
    tokens, seconds = decode(
        [stream],
        lambda: 2,
        lambda verified, next_drafts, s, shares: steps.append((verified, next_drafts, shares)),
        costs,
        Machine([0.0], [1.0]),
        seed=0,
    )
    assert tokens == len(stream)
    assert [shares for _, _, shares in steps] == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    assert all(verified == next_drafts == 2 for verified, next_drafts, _ in steps)
    assert 4 * costs.seconds(2, 2) * 0.8 < seconds < 4 * costs.seconds(2, 2) * 1.3 * 1.2


def test_the_replay_charges_the_catch_up_on_a_return_to_drafting_only() -> None:
    costs = COST_PROFILES["fp32_draft"]
    assert costs.seconds(0, 2) == costs.seconds(0, 0) + costs.catch_up
    assert costs.seconds(2, 0) == costs.seconds(2, 2) > costs.seconds(0, 0) == 1.0


def test_acceptance_per_position_and_mean_length() -> None:
    requests = [RequestFigures([], 0.0, 0.0, [4, 1], [4, 4]), RequestFigures([], 0.0, 0.0, [0, 2], [4, 4])]
    assert acceptance_per_position(requests, 4) == [0.75, 0.5, 0.25, 0.25]
    assert mean_acceptance_length(requests) == 1 + 7 / 4
    assert mean_acceptance_length([RequestFigures([1], 0.0, 0.0, [], [])]) is None


def test_time_breakdown_leaves_out_prefill_steps() -> None:
    records = [
        {"num_target_tokens": 900, "target_forward_s": 9.0, "propose_s": 5.0, "draft_passes_s": [4.0, 0.3]},
        {"num_target_tokens": 5, "target_forward_s": 0.2, "propose_s": 0.3, "draft_passes_s": [0.1, 0.05, 0.05]},
        {"num_target_tokens": 3, "target_forward_s": 0.2, "propose_s": 0.3, "draft_passes_s": [0.1, 0.05, 0.05]},
    ]
    breakdown = time_breakdown(records, max_decode_tokens=5, decode_wall_s=1.2)
    assert breakdown["steps"] == 2
    assert breakdown["step_s"] == 0.6 and breakdown["target_forward_s"] == 0.2
    assert breakdown["first_draft_pass_s"] == 0.1 and breakdown["later_draft_pass_s"] == 0.05
    assert abs(breakdown["other_s"] - 0.1) < 1e-12


def test_part_clock_times_each_call_by_the_tokens_in_its_pass() -> None:
    clock = PartClock()
    linear = torch.nn.Linear(4, 2)
    clock.attach(linear, "target", "qkv")
    linear(torch.zeros(3, 4))
    linear(input=torch.zeros(3, 4))
    linear(torch.zeros(1, 4))
    rows = {(model, part, tokens): calls for model, part, tokens, _, calls in clock.read()}
    assert rows == {("target", "qkv", 3): 2, ("target", "qkv", 1): 1}
    assert clock.read() == []


def test_forward_parts_per_forward_and_over_prompts() -> None:
    rows = [
        ("target", "layers", 1, 0.28, 56),
        ("target", "qkv", 1, 0.02, 56),
        ("target", "lm_head", 1, 0.04, 2),
        ("target", "layers", 5, 0.5, 28),
        ("target", "layers", 3000, 10.0, 28),
        ("target", "lm_head", 3000, 1.0, 1),
        ("draft", "layers", 3000, 1.5, 24),
    ]
    plain = decode_figures(rows, "target", 1, num_layers=28)
    assert plain["layers"] == 140.0 and plain["qkv"] == 10.0 and plain["lm_head"] == 20.0
    assert plain["attention"] == 0.0
    assert decode_figures(rows, "target", 9, num_layers=28) == {}
    assert prefill_figures(rows, "target")["layers"] == 10.0
    assert "lm_head" not in prefill_figures(rows, "target")
    assert prefill_figures(rows, "draft")["layers"] == 1.5


def test_needle_value_is_seeded_digits() -> None:
    value = needle_value(3)
    assert value == needle_value(3) != needle_value(4)
    assert [len(group) for group in value.split("-")] == [4] * 5 and value.replace("-", "").isdigit()


def test_retrieval_accuracy_settings_are_all_reconfigurable() -> None:
    """Each setting reconfigures one running engine: none may name a key fixed at load."""
    from benchmarks.retrieval_accuracy import SETTINGS, setting_defaults
    from specextend_vllm.config import KEYS_FIXED_AT_LOAD, SpecExtendConfig

    for keys in SETTINGS.values():
        setting = {**setting_defaults(), **keys}
        assert not set(setting) & set(KEYS_FIXED_AT_LOAD)
        SpecExtendConfig(**setting)


def test_speed_cells_carry_the_machine_speed_their_runs_were_taken_at() -> None:
    """A cell's machine figures (arithmetic and memory speed) are the medians of its runs'
    (runs saved before a figure existed have none), so a cell taken while the machine ran
    slower shows it."""
    from benchmarks.engine import machine_gflops, machine_memory_gbps
    from benchmarks.long_inputs import speed_cells

    def run(method: str, gflops: float | None, gbps: float | None) -> dict[str, object]:
        figures = {
            "method": method, "length": 1024, "genre": "essays", "text": "essays/set_1",
            "tokens": [1, 2, 3], "ttft_s": 1.0, "decode_s": 0.5, "engine_ttft_s": 1.0,
            "accepted_per_step": [], "drafted_per_step": [], "time_per_step": {},
        }
        machine = {"machine_gflops": gflops, "machine_memory_gbps": gbps}
        return {**figures, **{key: value for key, value in machine.items() if value is not None}}

    runs = [run("no_speculation", 100.0, 9.0), run("no_speculation", 60.0, 4.0)]
    runs += [run("no_speculation", 90.0, 5.0), run("draft_model", None, None)]
    cells = {cell["method"]: cell for cell in speed_cells(runs)}
    assert (cells["no_speculation"]["machine_gflops"], cells["no_speculation"]["machine_memory_gbps"]) == (90.0, 5.0)
    assert cells["draft_model"]["machine_gflops"] is cells["draft_model"]["machine_memory_gbps"] is None
    assert machine_gflops(seconds=0.01, slices=2) > 0
    assert machine_memory_gbps(seconds=0.01, slices=2) > 0


def test_a_fixed_draft_length_holds_the_choosers_table_and_gives_it_back() -> None:
    """`benchmarks.draft_length_modes` runs fixed numbers of drafts in the engine whose
    chooser it pauses: its table is held, its measurements stop, and both come back."""
    from benchmarks.draft_length_modes import fixed_draft_length
    from specextend_vllm.algorithm.draft_length import DraftLengthChooser

    chooser = DraftLengthChooser(num_speculative_tokens=4, max_batch_size=4)
    with fixed_draft_length(chooser, 2):
        assert chooser.lookup == [2] * 5
        chooser.record_step(1, 4, 4, 0.5, [1.0] * 4)
        assert chooser.buckets[0].step_s[4].samples == 0
    assert chooser.lookup == [4] * 5
    chooser.record_step(1, 4, 4, 0.5, [1.0] * 4)
    assert chooser.buckets[0].step_s[4].samples == 1
    with fixed_draft_length(chooser, None):
        assert chooser.lookup == [4] * 5


def test_recorded_steps_see_what_the_chooser_is_told_paused_or_not() -> None:
    """Each decode of `benchmarks.draft_length_modes` keeps the steps the chooser was told
    of, in a mode that pauses it too, and leaves the chooser as it found it."""
    from benchmarks.draft_length_modes import fixed_draft_length, recorded_steps
    from specextend_vllm.algorithm.draft_length import DraftLengthChooser

    chooser = DraftLengthChooser(num_speculative_tokens=4, max_batch_size=4)
    with fixed_draft_length(chooser, 2), recorded_steps(chooser) as steps:
        chooser.record_step(1, 2, 2, 0.5, [1.0] * 2)
    assert steps == [(2, 2, 500.0)] and chooser.buckets[0].step_s[2].samples == 0
    with recorded_steps(chooser) as steps:
        chooser.record_step(1, 4, 0, 0.25, [1.0] * 4)
    assert steps == [(4, 0, 250.0)] and "record_step" not in vars(chooser)
    assert chooser.draft_acceptance_rates()[0] == 1.0


def test_held_choices_pin_the_choosers_and_give_them_back() -> None:
    """`draft_model_like` holds plain and verifying steps on vLLM's attention and the draft
    on the full cache, whatever the choosers measured, their measurements paused; then the
    choosers answer and measure as before."""
    from types import SimpleNamespace

    from benchmarks.draft_length_modes import HELD_CHOICES, hold_choices
    from specextend_vllm.algorithm.retrieval_choice import RetrievalChooser
    from specextend_vllm.algorithm.verification_choice import VerificationChooser

    verification = SimpleNamespace(
        decoding_chooser=VerificationChooser(), verifying_chooser=VerificationChooser()
    )
    planner = SimpleNamespace(chooser=RetrievalChooser(activation_length=1024, max_drafts=4))
    drafter = SimpleNamespace(verification=verification, planner=planner)
    worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=drafter))
    choosers = [verification.decoding_chooser, verification.verifying_chooser, planner.chooser]
    before = [type(chooser).__dict__.keys() & vars(chooser).keys() for chooser in choosers]

    hold_choices(worker, HELD_CHOICES["draft_model_like"], hold=True)
    assert verification.decoding_chooser.verifies_natively(0)
    assert verification.verifying_chooser.verifies_natively(3)
    assert not planner.chooser.reduces(2, 4)
    verification.verifying_chooser.record_step(0, False, 0.001)
    assert not verification.verifying_chooser.buckets[0].first.samples
    hold_choices(worker, HELD_CHOICES["draft_model_like"], hold=False)
    assert [type(chooser).__dict__.keys() & vars(chooser).keys() for chooser in choosers] == before
    verification.verifying_chooser.record_step(0, False, 0.001)
    assert verification.verifying_chooser.buckets[0].first.samples == 1


def test_a_verification_mode_reconfigures_the_engine_and_back() -> None:
    """`benchmarks.draft_length_modes`' `fixed4_hybrid` and `fixed4_vllm_verification`
    reconfigure the engine's `verification_attention` for their decode, then back to
    `auto`, also when the decode fails; the other modes leave it as it is."""
    from benchmarks.draft_length_modes import VERIFICATION_MODES, verification_attention

    class Engine:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict]] = []

        def collective_rpc(self, method: str, args: tuple = ()) -> list:
            self.calls.append((method, *args))
            return []

    llm = Engine()
    with verification_attention(llm, VERIFICATION_MODES.get("fixed4")):
        assert llm.calls == []
    with pytest.raises(RuntimeError):
        with verification_attention(llm, VERIFICATION_MODES["fixed4_vllm_verification"]):
            assert llm.calls == [("specextend_reconfigure", {"verification_attention": "native"})]
            raise RuntimeError("the decode failed")
    assert llm.calls[-1] == ("specextend_reconfigure", {"verification_attention": "auto"})


def test_the_choosers_state_is_what_it_holds_for_a_request_alone() -> None:
    """`benchmarks.draft_length_modes` saves the chooser's state after each decode: the
    kept length and the measured lengths' step times of a request alone (not those of
    batches of 4), and each draft's acceptance."""
    from benchmarks.draft_length_modes import chooser_state
    from specextend_vllm.algorithm.draft_length import DraftLengthChooser

    chooser = DraftLengthChooser(num_speculative_tokens=2, max_batch_size=4)
    for _ in range(8):
        chooser.record_step(1, 2, 2, 0.5, [1.0, 0.5])
        chooser.record_step(4, 2, 2, 0.9)
    state = chooser_state(chooser)
    assert state["kept_length"] == 2
    assert state["step_ms"] == {2: 500.0} and state["measured_steps"] == {2: 8}
    assert state["draft_acceptance"] == [1.0, 0.5]


def test_the_gpu_step_models_hybrid_attention_equals_one_masked_attention() -> None:
    """The GPU step-cost stand-in attends as hybrid verification does (cache part, masked
    new tokens, merged by log-sum-exps); on CPU both parts run as fp32 math."""
    from benchmarks.gpu_step_cost import HYBRID_ATTENTION_TOLERANCE, hybrid_attention_error

    error = hybrid_attention_error(torch.device("cpu"), context=256, new_tokens=9)
    assert error < HYBRID_ATTENTION_TOLERANCE / 4


def test_the_speed_summary_counts_only_specextend_at_its_defaults_and_the_aims_per_length() -> None:
    def run(**args: object) -> dict:
        cell = {"length": 8192, "text": "essays/set_1", "vs_faster_alternative": 0.95}
        return {
            "args": {"at_defaults": True, "specextend_keys": {}, "draft_precision": "int8", **args},
            "machine": {"cpu": "AMD EPYC"},
            "cells": [
                {**cell, "method": "specextend", "vs_no_speculation": 1.3, "vs_draft_model": 0.95},
                {**cell, "method": "specextend_fixed", "vs_no_speculation": 1.5, "vs_draft_model": 1.2},
                {**cell, "method": "draft_model", "vs_no_speculation": 1.4, "vs_draft_model": 1.0},
            ],
        }

    assert cells_at_defaults("a", run(specextend_keys={"token_budget": 512}), "int8") == []
    assert cells_at_defaults("a", run(draft_precision="fp32"), "int8") == []
    assert cells_at_defaults("a", run(at_defaults=False), "int8") == []
    cells = cells_at_defaults("a", run(), "int8") + cells_at_defaults("b", run(), "int8")
    assert [cell.vs_draft_model for cell in cells] == [0.95, 0.95]
    row, = summarize(cells)
    assert (row["runs"], row["cells"], row["meet_faster_aim"], row["meet_draft_model_aim"]) == (2, 2, 0, 0)
    shorter = [dataclasses.replace(cell, length=4096, vs_faster=0.97) for cell in cells]
    assert [(r["length"], r["meet_faster_aim"], r["meet_draft_model_aim"]) for r in summarize(shorter)] == [
        (4096, 2, None)
    ]


def test_the_speed_summary_reads_cells_within_one_engine_by_medians_and_by_rounds() -> None:
    rates = {
        "auto": (5.0, 6.0, 4.0, 5.0),
        "plain": (3.5, 3.5, 3.5, 3.5),
        "plain_vllm_attention": (3.0, 3.0, 3.0, 3.0),
        "draft_model_like": (6.0, 5.0, 5.0, 4.0),
    }

    from benchmarks.draft_length_modes import summary

    def run(modes: list[str], **args: object) -> dict:
        decodes = {
            mode: [{"round": r, "decode_tokens_per_s": rate} for r, rate in enumerate(rates[mode])]
            for mode in modes
        }
        prompt = {"decodes": decodes}
        prompt["summary"] = summary(prompt)
        return {
            "args": {"modes": modes, "length": 8192, **args},
            "machine": {"cpu": "Intel(R) Xeon(R) Processor", "cpu_int8_dot_products": True},
            "results": {"essays: essays/set_2": prompt},
        }

    assert cells_in_one_engine("a", run(["auto", "plain", "draft_model_like"])) == []
    cell, = cells_in_one_engine("a", run(list(rates), draft_precision="fp32"))
    # Medians: auto 5, no speculation's step 3, draft_model's algorithm 5; the rounds'
    # ratios 5/6, 6/5, 4/5, 5/4: their median 1.02, where the medians' ratio is 1.0.
    assert (cell.machine, cell.setup) == ("Intel Xeon", "fp32 draft, windowed draft prefill")
    assert (cell.vs_faster, cell.vs_draft_model) == (1.0, 1.0)
    assert cell.vs_no_speculation == pytest.approx(5 / 3)
    assert cell.vs_faster_by_round == pytest.approx((6 / 5 + 5 / 6) / 2)
    whole_prompt, = cells_in_one_engine("b", run(list(rates), draft_prefill_window="none"))
    assert whole_prompt.setup == "int8 draft, whole-prompt draft prefill"
    again = dataclasses.replace(cell, run="c", vs_faster_by_round=0.96)
    rows = summarize([cell, again, whole_prompt])
    aims = [
        (row["setup"], row["runs"], row["meet_faster_aim_by_round"], row["meet_draft_model_aim"])
        for row in rows
    ]
    assert aims == [
        ("fp32 draft, windowed draft prefill", 2, 1, 0),
        ("int8 draft, whole-prompt draft prefill", 1, 1, 0),
    ]


def test_saved_runs_name_the_commit_of_the_code_they_ran(tmp_path: Path) -> None:
    assert source_commit(tmp_path) is None
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    (tmp_path / "specextend_vllm").mkdir()
    (tmp_path / "specextend_vllm" / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "a"], check=True)
    commit = source_commit(tmp_path)
    assert commit is not None and len(commit) >= 7
    (tmp_path / "notes.txt").write_text("not the plugin's code\n")
    assert source_commit(tmp_path) == commit
    (tmp_path / "specextend_vllm" / "a.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == f"{commit}+changes"


def test_serving_compares_each_server_with_no_speculation_in_its_own_round(
    tmp_path: Path,
) -> None:
    def run(method: str, round_index: int, throughput: float, ttft_ms: float) -> dict:
        return {
            "method": method, "round": round_index, "concurrency": 4,
            "output_throughput": throughput, "mean_ttft_ms": ttft_ms, "mean_tpot_ms": 100.0,
        }

    rows = [
        run("no_speculation", 0, 10.0, 100.0),
        run("specextend", 0, 9.0, 150.0),
        run("no_speculation", 1, 5.0, 200.0),
        run("specextend", 1, 6.0, 200.0),
        run("no_speculation", 2, 8.0, 100.0),
        run("specextend", 2, 8.8, 110.0),
    ]
    add_ratios(rows)
    assert [row["throughput_vs_no_speculation"] for row in rows[1::2]] == pytest.approx(
        [0.9, 1.2, 1.1]
    )
    specextend = next(cell for cell in over_rounds(rows) if cell["method"] == "specextend")
    assert specextend["rounds"] == 3
    assert specextend["throughput_vs_no_speculation"] == pytest.approx(
        {"median": 1.1, "min": 0.9, "max": 1.2}
    )
    assert specextend["mean_ttft_vs_no_speculation"] == pytest.approx(
        {"median": 1.1, "min": 1.0, "max": 1.5}
    )
    record = tmp_path / "serving.json"
    args = {"length": 2048, "max_tokens": 64}
    record.write_text(json.dumps({"args": args, "machine": {"cpu": "test"}, "table": rows}))
    assert plot(record).exists()


def test_serving_reads_each_runs_decoding_steps_and_sets_them_against_its_plain_steps() -> None:
    """What a run added to a server's decoding-step counters, read from two /metrics texts,
    and per bucket its tokens per second over those of its plain steps (a bucket with no
    plain step has no ratio)."""

    def metrics(plain_steps: float, switches: float, drafting_steps: float) -> str:
        series = {
            ("4-7", "0", "0"): (plain_steps, 0.3 * plain_steps, 4 * plain_steps),
            ("4-7", "0", "1"): (switches, 0.5 * switches, 4 * switches),
            ("4-7", "1", "1"): (drafting_steps, 0.4 * drafting_steps, 6 * drafting_steps),
            ("1", "4", "4"): (drafting_steps, 0.4 * drafting_steps, 3 * drafting_steps),
        }
        names = ("steps_total", "step_seconds_total", "step_tokens_total")
        return "\n".join(
            f'vllm:specextend_decoding_{name}{{batch_sizes="{sizes}",engine="0",'
            f'model_name="m",next_drafts="{proposed}",num_drafts="{verified}"}} {value}'
            for (sizes, verified, proposed), values in series.items()
            for name, value in zip(names, values)
        )

    before, after = decoding_steps(metrics(2, 0, 5)), decoding_steps(metrics(12, 1, 15))
    added = decoding_steps_added(before, after)
    assert added["4-7 x 0->1"] == {"steps": 1, "seconds": 0.5, "tokens": 4}
    assert added["4-7 x 0"] == pytest.approx({"steps": 10, "seconds": 3.0, "tokens": 40})
    assert added["4-7 x 1"] == pytest.approx({"steps": 10, "seconds": 4.0, "tokens": 60})
    # 104 tokens in 7.5 s against 40 in 3 s
    assert against_plain_steps(added) == {"4-7": pytest.approx(1.04)}


def test_the_retrieval_state_is_each_measured_choice_both_ways() -> None:
    """`benchmarks.draft_length_modes` saves `retrieval: auto`'s state after each decode:
    per bucket measured both ways, per number of drafts compared, the preferred way and
    tokens per step (from steps of any number of drafts); the reduced cache's step time
    over the full one's per number of drafts measured both ways; measured steps. A bucket
    measured one way only is left out."""
    from types import SimpleNamespace

    from benchmarks.draft_length_modes import retrieval_state
    from specextend_vllm.algorithm.retrieval_choice import MIN_SAMPLES, RetrievalChooser

    chooser = RetrievalChooser(activation_length=2048, max_drafts=4)
    for _ in range(MIN_SAMPLES):
        chooser.record_step(1, 4, False, 0.6, [1.0, 1.0, 0.0, 0.0])
    for _ in range(MIN_SAMPLES):
        chooser.record_step(1, 4, True, 0.3, [1.0, 0.0, 0.0, 0.0])
    chooser.record_step(2, 3, False, 0.5, [1.0, 1.0, 0.0])
    planner = SimpleNamespace(chooser=chooser)
    worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=SimpleNamespace(planner=planner)))
    assert retrieval_state(worker) == {
        "1": {
            "prefers_reduced": {4: True},
            "reduced_over_full_time": {4: 0.5},
            "full_tokens": {4: 3.0},
            "reduced_tokens": {4: 2.0},
            "full_steps": MIN_SAMPLES,
            "reduced_steps": MIN_SAMPLES,
        }
    }
    planner.chooser = None
    assert retrieval_state(worker) == {}


def test_the_retrieval_simulation_scores_steps_against_the_better_cache() -> None:
    """`benchmarks.retrieval_choice_simulation`: where the two caches draft alike and take
    the same time, every step counts as on the better one (1.0); where the reduced cache
    takes half the time or twice the time, the chooser spends most steps on the faster one
    and the score does not depend on which it is. Seen: 0.91 both ways, 0.92 of the steps on
    the faster cache in 99 steps (0.75 and 0.68 with each number of drafts measuring both
    ways, the chooser before a bucket measured and explored as one)."""
    from benchmarks.retrieval_choice_simulation import Text, replay
    from specextend_vllm.algorithm.retrieval_choice import RetrievalChooser

    def run(time_ratio: float) -> dict[str, float]:
        text = Text("text", 0.7, 0.7, time_ratio)
        chooser = RetrievalChooser(activation_length=2048, max_drafts=4)
        return replay(chooser, (text,), seed=0, decodes=3, steps=33)[0]

    same, faster, slower = run(1.0), run(0.5), run(2.0)
    assert same["of_better_cache"] == pytest.approx(1.0)
    assert faster["reduced_share"] > 0.5 > slower["reduced_share"]
    assert 0.85 <= faster["of_better_cache"] < 1.0
    assert faster["of_better_cache"] == pytest.approx(slower["of_better_cache"], abs=0.05)
