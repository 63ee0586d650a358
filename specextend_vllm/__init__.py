"""SpecExtend speculative decoding for vLLM: `speculative_config={"method": "specextend", ...}`."""

from __future__ import annotations

from typing import Any

SUPPORTED_VLLM_VERSIONS = ("0.32.",)


def _check_vllm_version() -> None:
    import vllm

    if not vllm.__version__.startswith(SUPPORTED_VLLM_VERSIONS):
        raise RuntimeError(
            f"specextend-vllm supports vLLM {', '.join(v + 'x' for v in SUPPORTED_VLLM_VERSIONS)}; "
            f"this is vLLM {vllm.__version__}. Install a supported vLLM "
            "(pip install 'specextend-vllm[cpu]' or 'specextend-vllm[gpu]') or uninstall the plugin."
        )


def register() -> None:
    """Entry point of the `vllm.general_plugins` group: runs in every vLLM process."""
    _check_vllm_version()
    from specextend_vllm import patches

    patches.apply_all()


def retrieval_stats(llm: Any) -> list[dict[str, Any]]:
    """The method's counters and recent chunk selections, one dict per worker."""
    return llm.collective_rpc("specextend_retrieval_stats")
