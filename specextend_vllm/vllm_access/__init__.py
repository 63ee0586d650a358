"""Access to vLLM's objects: the method's config inside vLLM's, attention layers and their
paged caches, the draft's rotary embedding and LM head, the runner's request ids; and the
seams the proposer installs, once the models are loaded, on objects it holds (a layer's
attention, the draft's rotary table). Unlike `patches`, nothing here is installed at
plugin load or registered.

With `specextend_vllm.patches`, the only modules that import vLLM's internals."""

from vllm.logger import init_logger

logger = init_logger("vllm.specextend")
