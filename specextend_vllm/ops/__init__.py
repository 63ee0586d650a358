"""The compiled kernels of ``specextend_vllm._C`` as ``torch.ops.specextend`` ops: one module
per op, holding its Python wrapper, its pure-torch reference and its fake kernel."""

from __future__ import annotations

import torch  # noqa: F401  (loads the libraries that _C links against)

try:
    from specextend_vllm import _C  # noqa: F401  (registers torch.ops.specextend)
except ImportError as error:
    raise ImportError(
        "specextend_vllm._C (the compiled kernels) could not be loaded; "
        "reinstall the package with `pip install -e .`"
    ) from error

from specextend_vllm.ops.chunk_scores import chunk_scores, chunk_scores_reference
from specextend_vllm.ops.int8_linear import int8_linear, int8_linear_reference
from specextend_vllm.ops.merge_attention_states import (
    merge_attention_states,
    merge_attention_states_reference,
)
from specextend_vllm.ops.paged_prefix_attention import (
    paged_prefix_attention,
    paged_prefix_attention_reference,
)
from specextend_vllm.ops.tree_attention import tree_attention, tree_attention_reference

__all__ = [
    "chunk_scores",
    "chunk_scores_reference",
    "int8_linear",
    "int8_linear_reference",
    "merge_attention_states",
    "merge_attention_states_reference",
    "paged_prefix_attention",
    "paged_prefix_attention_reference",
    "tree_attention",
    "tree_attention_reference",
]
