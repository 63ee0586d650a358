"""Read-only access to vLLM's objects: the method's config inside vLLM's, attention layers
and their paged caches, the draft's rotary embedding, the runner's request ids.

With `specextend_vllm.patches`, the only modules that import vLLM's internals."""

from vllm.logger import init_logger

logger = init_logger("vllm.specextend")
