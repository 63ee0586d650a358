"""Times the int8 draft's linear layers for a few tokens: the plugin's `ops.int8_linear`
against vLLM's CPU int8 GEMM (oneDNN, prepacked, with its per-token quantization), on the
shapes of the Qwen2.5-Coder 0.5B draft's 24 layers (qkv 1152 x 896, o 896 x 896, gate_up
9728 x 896, down 896 x 4864; random int8 weights, a distinct copy per layer so that, as in
a forward pass, the weights come from memory and not from cache). Milliseconds per pass
over the 24 layers, median of 9, for 1 to 16 tokens (the plugin takes up to 5); and the LM
head's 32K kept rows (`draft_vocab`) and the whole vocabulary's (151,936 rows) for 1 token.
Prints a table and writes benchmarks/results/int8_linear_cpu.json (or `--output`'s name).

    python -m benchmarks.kernels.bench_int8_linear [--output int8_linear_cpu_amd]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from vllm import _custom_ops as vllm_ops

from benchmarks.kernels.common import cpu_model, median_ms
from specextend_vllm import ops

LAYER_SHAPES = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}
NUM_LAYERS = 24
LM_HEAD_ROWS = {"LM head, 32K kept rows": 32768, "LM head, whole vocabulary": 151936}
HIDDEN_SIZE = 896
TOKENS = (1, 2, 4, 5, 6, 7, 8, 16)
REPEATS = 9
RESULTS = Path(__file__).resolve().parents[1] / "results"


def int8_layer(out_features: int, in_features: int) -> dict[str, Any]:
    weight = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
    scales = torch.rand(out_features) * 0.01
    onednn = vllm_ops.create_onednn_scaled_mm(weight.t(), scales[:, None], torch.float32, True, False, 32)
    return {"weight": weight, "scales": scales, "onednn": onednn}


def onednn_linear(layer: dict[str, Any], input: torch.Tensor) -> torch.Tensor:
    quantized, token_scales, _ = vllm_ops.onednn_scaled_int8_quant(input, None, None, True)
    output = input.new_empty(input.shape[0], layer["onednn"].n)
    vllm_ops.onednn_scaled_mm(layer["onednn"], quantized, output, token_scales, None, None, None)
    return output


def plugin_linear(layer: dict[str, Any], input: torch.Tensor) -> torch.Tensor:
    return ops.int8_linear(input, layer["weight"], layer["scales"], None)


def pass_ms(layers: list[dict[str, Any]], linear: Any, num_tokens: int) -> float:
    inputs = [torch.randn(num_tokens, layer["weight"].shape[1]) for layer in layers]
    return median_ms(lambda: [linear(layer, input) for layer, input in zip(layers, inputs)], REPEATS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="int8_linear_cpu", help="a name under benchmarks/results")
    output = RESULTS / f"{parser.parse_args().output}.json"
    layers = [int8_layer(*shape) for _ in range(NUM_LAYERS) for shape in LAYER_SHAPES.values()]
    rows = []
    for num_tokens in TOKENS:
        rows.append({
            "what": f"{NUM_LAYERS} layers",
            "tokens": num_tokens,
            "vllm_onednn_ms": pass_ms(layers, onednn_linear, num_tokens),
            "plugin_int8_linear_ms": pass_ms(layers, plugin_linear, num_tokens),
        })
    for name, num_rows in LM_HEAD_ROWS.items():
        lm_head = [int8_layer(num_rows, HIDDEN_SIZE)]
        rows.append({
            "what": name,
            "tokens": 1,
            "vllm_onednn_ms": pass_ms(lm_head, onednn_linear, 1),
            "plugin_int8_linear_ms": pass_ms(lm_head, plugin_linear, 1),
        })
    print("| what | tokens | vLLM oneDNN ms | plugin int8_linear ms |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['what']} | {row['tokens']} | {row['vllm_onednn_ms']:.2f} | {row['plugin_int8_linear_ms']:.2f} |")
    record = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {output}")


if __name__ == "__main__":
    main()
