"""The draft's logits with and without `draft_vocab` and `draft_lm_head: int8`, on the
int8 Qwen 0.5B draft.

    python -m benchmarks.kernels.bench_draft_vocab_logits

Loads the draft in a vLLM engine and times, on its worker, milliseconds per call (mean of
20 after 3 warm-up calls) for 1 and 5 rows of hidden states: vLLM's `compute_logits` over
the whole vocabulary (151,936 rows), the 32K kept rows on the GEMM vLLM prepacks for an
unquantized layer (what `draft_vocab` runs, with and without scattering into the whole
vocabulary), torch's matmul over the same kept rows, and the whole vocabulary's and the
kept rows in int8 (`draft_lm_head: int8`, vLLM's CPU int8 GEMM). Saved to
benchmarks/results/draft_vocab_logits.json.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from benchmarks import engine

os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the timing runs on the worker

REPEATS = 20
WARMUP = 3


def time_logits(worker: Any, vocab_file: str) -> dict[str, float]:
    import torch

    from specextend_vllm.algorithm.draft_vocab import scatter_kept_logits
    from specextend_vllm.vllm_access import layers

    model = worker.model_runner.model
    kept_ids = torch.tensor(json.loads(open(vocab_file).read()))
    vocab_size = model.lm_head.org_vocab_size
    all_ids = torch.arange(vocab_size)
    kept_logits = layers.lm_head_logits(model, kept_ids, int8=False)
    int8_logits = layers.lm_head_logits(model, all_ids, int8=True)
    int8_kept_logits = layers.lm_head_logits(model, kept_ids, int8=True)
    kept_rows = layers.lm_head_rows(model, kept_ids)
    timings = {}
    for num_rows in (1, 5):
        hidden_states = torch.randn(num_rows, kept_rows.shape[1])
        calls = {
            "full vocabulary (vLLM compute_logits)": lambda: model.compute_logits(hidden_states),
            "kept rows, prepacked GEMM, scattered": lambda: scatter_kept_logits(
                kept_logits(hidden_states), kept_ids, vocab_size
            ),
            "kept rows, prepacked GEMM": lambda: kept_logits(hidden_states),
            "kept rows, torch matmul": lambda: hidden_states @ kept_rows.T,
            "full vocabulary, int8": lambda: int8_logits(hidden_states),
            "kept rows, int8, scattered": lambda: scatter_kept_logits(
                int8_kept_logits(hidden_states), kept_ids, vocab_size
            ),
        }
        for name, call in calls.items():
            for _ in range(WARMUP):
                call()
            start = time.perf_counter()
            for _ in range(REPEATS):
                call()
            timings[f"{name}, {num_rows} row(s)"] = 1000 * (time.perf_counter() - start) / REPEATS
    return timings


def main() -> None:
    from benchmarks.assets import draft_vocab, int8_draft

    draft, vocab_file = int8_draft(), draft_vocab()
    llm = engine.make_llm(draft, None, max_model_len=1024)
    try:
        [timings] = llm.collective_rpc(time_logits, args=(str(vocab_file),))
    finally:
        engine.close(llm)
    for name, ms in timings.items():
        print(f"{name}: {ms:.2f} ms")
    record = {"machine": engine.machine(), "draft": str(draft), "draft_vocab": str(vocab_file), "ms": timings}
    path = engine.RESULTS / "draft_vocab_logits.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
