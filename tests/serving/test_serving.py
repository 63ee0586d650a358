"""`specextend` behind `vllm serve`: concurrent mixed requests with clients leaving and
preemption, bad requests, and memory and per-request state after many requests."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from tests.serving.clients import Request, run_all
from tests.serving.conftest import DRAFT_TRAINED_LENGTH, WORDS
from tests.serving.servers import VllmServer

pytestmark = pytest.mark.serving

# Below the activation length (128), past it, and past the draft's trained length (256).
PROMPT_LENGTHS = [20, 60, 150, 300, 500, 700, 900, 100]
NUM_REQUESTS = 64


def word_prompt(length: int, seed: int) -> str:
    generator = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[i] for i in torch.randint(2, 500, (length,), generator=generator).tolist())


def mixed_requests() -> list[Request]:
    """Completions and chat, streamed and not; every 8th streamed client leaves after two
    chunks, every 16th non-streamed one gives up after half a second."""
    requests = []
    for index in range(NUM_REQUESTS):
        api, stream = [("completions", False), ("completions", True), ("chat", False), ("chat", True)][index % 4]
        request = Request(word_prompt(PROMPT_LENGTHS[index % len(PROMPT_LENGTHS)], index), api, stream)
        if stream and index % 8 == 5:
            request.leave_after_chunks = 2
        if not stream and index % 16 == 2:
            request.abort_after_s = 0.5
        requests.append(request)
    return requests


def metric_value(server: VllmServer, name: str) -> float:
    """The sum of the samples named exactly `name`, over their labels (not those of
    `name`_created and the like, which a prefix would match)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if re.match(rf"{re.escape(name)}[{{ ]", line)
    )


def test_concurrent_mixed_requests_are_lossless_and_the_server_keeps_serving(
    servers: dict[str, VllmServer], serving_models: dict
) -> None:
    model = str(serving_models["target"])
    requests = mixed_requests()
    assert max(PROMPT_LENGTHS) > DRAFT_TRAINED_LENGTH
    results = run_all(servers["specextend"].url, model, requests, concurrency=NUM_REQUESTS)
    errors = [r.error for r in results if r.status != 200]
    assert not errors, (errors, servers["specextend"].log_tail())

    completed = [(q, r) for q, r in zip(requests, results) if r.text is not None]
    left = len(requests) - len(completed)
    assert len(completed) >= NUM_REQUESTS - 12 and left > 0
    plain_requests = [Request(q.prompt, q.api, q.stream) for q, _ in completed]
    expected = run_all(servers["plain"].url, model, plain_requests, concurrency=16)
    assert [r.text for _, r in completed] == [e.text for e in expected]

    assert metric_value(servers["specextend"], "vllm:num_preemptions_total") > 0
    assert metric_value(servers["specextend"], "vllm:spec_decode_num_accepted_tokens_total") > 0
    assert metric_value(servers["specextend"], "vllm:specextend_retrievals_total") > 0
    assert metric_value(servers["specextend"], "vllm:specextend_hybrid_verifications_total") > 0
    assert metric_value(servers["specextend"], "vllm:specextend_skipped_draft_steps_total") > 0
    assert metric_value(servers["specextend"], "vllm:specextend_catch_up_tokens_total") > 0
    assert metric_value(servers["specextend"], "vllm:specextend_decoding_steps_total") > 0
    assert metric_value(servers["plain"], "vllm:specextend_retrievals_total") == 0
    assert servers["specextend"].is_healthy()
    [again] = run_all(servers["specextend"].url, model, plain_requests[:1], concurrency=1)
    assert again.text == expected[0].text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"prompt": word_prompt(2000, 1), "max_tokens": 4}, 400),
        ({"prompt": "w5 w6", "max_tokens": -1}, 400),
        ({"prompt": "w5 w6", "max_tokens": 4, "temperature": -2}, 400),
        ({"prompt": "w5 w6", "max_tokens": 4, "model": "not-served"}, 404),
    ],
)
def test_bad_requests_get_a_4xx_and_the_server_stays_healthy(
    servers: dict[str, VllmServer], serving_models: dict, body: dict, status: int
) -> None:
    server = servers["specextend"]
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": str(serving_models["target"]), **body},
        timeout=60,
    )
    assert response.status_code == status, response.text
    assert server.is_healthy()


def test_memory_and_request_state_stay_flat_over_many_requests(
    servers: dict[str, VllmServer], serving_models: dict
) -> None:
    """Over 1,000 short requests after 1,000 others the server's memory stays within 10%,
    and no finished request keeps per-request state. vLLM's own server grows here too, in
    steps of 10-50 MB (2-6% over such 1,000 requests, with or without the plugin), so this
    catches a leak of about 150 KB a request or more; a tensor kept per request, of any
    size, is `test_lifecycle`'s to catch."""
    server, model = servers["specextend"], str(serving_models["target"])
    short = [Request(word_prompt(140 + i % 40, 1000 + i), max_tokens=4) for i in range(2000)]
    assert all(r.status == 200 for r in run_all(server.url, model, short[:1000], concurrency=16))
    after_1000 = server.processes_rss_bytes()
    assert all(r.status == 200 for r in run_all(server.url, model, short[1000:], concurrency=16))
    after_2000 = server.processes_rss_bytes()
    assert after_2000 <= 1.10 * after_1000, (after_1000, after_2000)
    [stats] = server.worker_call("specextend_retrieval_stats")
    assert stats["retrievals"] > 0 and stats["tracked_requests"] == 0
