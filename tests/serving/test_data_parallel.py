"""Data parallelism behind `vllm serve`: two engines (and vLLM's two API servers), each
drafting with `specextend`. Outputs equal the plain server's, both engines retrieve, and
/metrics reports each engine's counters, which add up to vLLM's own spec-decode totals."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serving.clients import Request, run_all
from tests.serving.conftest import specextend_serving_config
from tests.serving.servers import VllmServer, server_args
from tests.harness import NUM_SPECULATIVE_TOKENS
from tests.serving.test_serving import PROMPT_LENGTHS, word_prompt

pytestmark = pytest.mark.serving

NUM_REQUESTS = 16


@pytest.fixture(scope="module")
def data_parallel_server(
    serving_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    server = VllmServer(
        serving_models["target"],
        server_args(
            specextend_serving_config(serving_models["draft"], drafting="auto"),
            "--tokenizer",
            str(serving_models["tokenizer"]),
            "--data-parallel-size",
            "2",
        ),
        tmp_path_factory.mktemp("dp_logs") / "dp.log",
    )
    try:
        server.wait_until_ready()
        yield server
    finally:
        server.stop()


def counters_by_engine(server: VllmServer, name: str) -> dict[str, float]:
    """A counter's value per `engine` label on /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            engine = re.search(r'engine="(\d+)"', line)
            assert engine is not None, line
            values[engine.group(1)] = values.get(engine.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def test_two_engines_serve_losslessly_and_their_counters_add_up(
    data_parallel_server: VllmServer,
    servers: dict[str, VllmServer],
    serving_models: dict[str, Path],
) -> None:
    model = str(serving_models["target"])
    requests = [
        Request(word_prompt(PROMPT_LENGTHS[index % len(PROMPT_LENGTHS)], 100 + index), api, stream)
        for index, (api, stream) in enumerate(
            [("completions", False), ("completions", True), ("chat", False), ("chat", True)] * 4
        )
    ]
    results = run_all(data_parallel_server.url, model, requests, concurrency=NUM_REQUESTS)
    assert all(r.status == 200 for r in results), data_parallel_server.log_tail()
    expected = run_all(servers["plain"].url, model, requests, concurrency=NUM_REQUESTS)
    assert [r.text for r in results] == [e.text for e in expected]

    retrievals = counters_by_engine(data_parallel_server, "vllm:specextend_retrievals_total")
    assert set(retrievals) == {"0", "1"} and min(retrievals.values()) > 0
    verified = {
        engine: reduced + full
        for (engine, reduced), full in zip(
            counters_by_engine(data_parallel_server, "vllm:specextend_reduced_verified_drafts_total").items(),
            counters_by_engine(data_parallel_server, "vllm:specextend_full_verified_drafts_total").values(),
        )
    }
    drafted = counters_by_engine(data_parallel_server, "vllm:spec_decode_num_draft_tokens_total")
    assert set(drafted) == set(verified) and min(drafted.values()) > 0
    # The method counts the drafts its worker verified, vLLM those whose request got tokens
    # back in the scheduler: one run differed by one request's step (3 of 171 drafts).
    for engine, count in drafted.items():
        assert abs(verified[engine] - count) <= 2 * NUM_SPECULATIVE_TOKENS, (verified, drafted)
    assert data_parallel_server.is_healthy()
