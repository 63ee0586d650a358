"""Waiting for a `vllm serve` process to answer /health: shared by the serving benchmark
and the serving tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def wait_until_healthy(
    process: subprocess.Popen[bytes],
    url: str,
    timeout_s: float,
    poll_s: float = 1.0,
    log_tail: Callable[[], str] = lambda: "see its log",
) -> None:
    """Returns once `url`/health answers 200; raises if the process exits first, or
    after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited: {log_tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"vllm serve not ready after {timeout_s} s: {log_tail()}")
