"""Quantizes a Hugging Face causal LM to int8 W8A8 for vLLM, data-free, with llmcompressor.

    .venv-quantize/bin/python scripts/quantize_int8.py MODEL_DIR OUT_DIR [--keep LAYER ...]

The scheme is llmcompressor's ``W8A8`` preset: int8 weights with one symmetric scale per
output channel (min/max of the weights, no calibration data), int8 activations with a
scale computed per token at run time. Every ``Linear`` is quantized except the LM head
and the layers named with ``--keep`` (names as in the checkpoint, or ``re:`` patterns):
vLLM 0.32's LM head loads no int8 scales ("no module or parameter named
'lm_head.weight_scale'"). The result is a compressed-tensors checkpoint that vLLM runs with
its int8 kernels (oneDNN on CPU, CUTLASS on GPU). It runs in its own environment
(``scripts/setup_quantize_env.sh``): llmcompressor pins transformers and compressed-tensors
versions other than vLLM's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

SCHEME = "W8A8"
KEPT_IN_MODEL_DTYPE = ["lm_head"]


def quantize(model_dir: Path, out_dir: Path, keep: list[str]) -> None:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    ignore = KEPT_IN_MODEL_DTYPE + keep
    recipe = QuantizationModifier(targets="Linear", scheme=SCHEME, ignore=ignore)
    oneshot(model=model, recipe=recipe)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as staging:
        staged = Path(staging) / out_dir.name
        model.save_pretrained(staged, save_compressed=True)
        try:
            AutoTokenizer.from_pretrained(model_dir).save_pretrained(staged)
        except (OSError, ValueError):
            pass  # a model folder without a tokenizer (the tests' tiny models)
        (staged / "specextend-quantization.json").write_text(
            json.dumps(
                {"source": str(model_dir), "scheme": SCHEME, "ignore": ignore,
                 "llmcompressor": version("llmcompressor")},
                indent=2,
            )
            + "\n"
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staged.rename(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--keep", nargs="*", default=[], help="more layers left unquantized")
    args = parser.parse_args()
    args.out_dir.parent.mkdir(parents=True, exist_ok=True)
    quantize(args.model_dir.resolve(), args.out_dir.resolve(), args.keep)
    print(f"int8 {SCHEME} model saved to {args.out_dir}")


if __name__ == "__main__":
    main()
