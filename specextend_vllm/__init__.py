"""SpecExtend speculative decoding for vLLM: `speculative_config={"method": "specextend", ...}`."""

from __future__ import annotations

import os
from typing import Any

SUPPORTED_VLLM_VERSIONS = ("0.32.", "0.33.")
DISABLE_ENV_VARIABLE = "SPECEXTEND_DISABLE"


def plugin_disabled() -> bool:
    return os.environ.get(DISABLE_ENV_VARIABLE, "0") not in ("", "0")


def _check_vllm_version() -> None:
    import vllm

    if not vllm.__version__.startswith(SUPPORTED_VLLM_VERSIONS):
        raise RuntimeError(
            f"specextend-vllm supports vLLM {', '.join(v + 'x' for v in SUPPORTED_VLLM_VERSIONS)}; "
            f"this is vLLM {vllm.__version__}. Install a supported vLLM "
            "(pip install 'specextend-vllm[cpu]' or 'specextend-vllm[gpu]'), uninstall the "
            f"plugin, or set {DISABLE_ENV_VARIABLE}=1."
        )


def register() -> None:
    """Entry point of the `vllm.general_plugins` group: runs in every vLLM process.
    `SPECEXTEND_DISABLE=1` leaves vLLM unpatched (method `specextend` is then unknown)."""
    if plugin_disabled():
        return
    _check_vllm_version()
    from specextend_vllm.patches import registry

    registry.apply_all()


def retrieval_stats(llm: Any) -> list[dict[str, Any]]:
    """The method's counters and recent chunk selections, one dict per worker."""
    return llm.collective_rpc("specextend_retrieval_stats")


def reconfigure(llm: Any, **changes: Any) -> list[dict[str, Any]]:
    """Changes the method's keys on a running engine, for example
    `reconfigure(llm, policy="streaming")`; returns the new config of each worker. Keys
    that need working copies (compact positions, chunks smaller than a KV block) need an
    engine that started with them."""
    return llm.collective_rpc("specextend_reconfigure", args=(changes,))


def step_timings(llm: Any) -> list[list[dict[str, Any]]]:
    """Per worker, the steps timed since the last call (needs SPECEXTEND_STEP_TIMINGS=1
    in the environment before vLLM starts)."""
    return llm.collective_rpc("specextend_step_timings")
