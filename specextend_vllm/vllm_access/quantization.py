"""The draft's quantization config as vLLM builds it for a draft model.

vLLM builds the draft under the prefix ``draft_model`` (its layers are named
``draft_model.model.layers.0.mlp.down_proj``), while a compressed-tensors checkpoint names
the layers it left unquantized as the model knows them (``model.layers.0.mlp.down_proj``).
Matched against the prefixed names, that ignore list matches nothing: vLLM then builds
those layers as quantized and loads their full-precision weights into int8 parameters
with no scales, a draft that runs and proposes noise.
"""

from __future__ import annotations

from typing import Any

from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)

# The prefix `DraftModelProposer._get_model` builds the draft under.
DRAFT_MODEL_PREFIX = "draft_model"
REGEX_PREFIX = "re:"


def ignore_list_under_prefix(ignore: list[str], prefix: str) -> list[str]:
    """``ignore`` with every exact layer name also given under ``prefix`` (regular
    expressions, ``re:...``, are matched with ``re.match`` and kept as written).

    >>> ignore_list_under_prefix(["lm_head", "model.layers.0.mlp.down_proj", "re:.*gate$"], "draft_model")
    ['lm_head', 'model.layers.0.mlp.down_proj', 're:.*gate$', 'draft_model.lm_head', 'draft_model.model.layers.0.mlp.down_proj']
    """
    prefixed = [f"{prefix}.{name}" for name in ignore if not name.startswith(REGEX_PREFIX)]
    return ignore + [name for name in prefixed if name not in ignore]


def match_ignored_layers_under_prefix(quant_config: Any, prefix: str) -> None:
    """Lets a compressed-tensors draft's unquantized layers stay unquantized under vLLM's
    draft prefix (in place; other quantization configs are left as they are)."""
    if isinstance(quant_config, CompressedTensorsConfig):
        quant_config.ignore = ignore_list_under_prefix(list(quant_config.ignore), prefix)
