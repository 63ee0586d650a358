"""`vllm serve` processes for the serving tests: started on 127.0.0.1 by the tests, each
wait and each request loop bounded in time, stopped at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from benchmarks.server_health import wait_until_healthy

VLLM_CLI = Path(sys.executable).with_name("vllm")
START_TIMEOUT_S = 300
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, to read the workers' state
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(model: Path, port: int, *args: str) -> list[str]:
    return [str(VLLM_CLI), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *args]


class VllmServer:
    """One `vllm serve` process and a client bound to it."""

    def __init__(self, model: Path, args: list[str], log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            serve_command(model, self.port, *args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **SERVER_ENV},
            start_new_session=True,
        )

    def wait_until_ready(self) -> None:
        wait_until_healthy(self.process, self.url, START_TIMEOUT_S, log_tail=self.log_tail)

    def is_healthy(self) -> bool:
        return self.process.poll() is None and httpx.get(f"{self.url}/health", timeout=10).status_code == 200

    def worker_call(self, method: str) -> list[Any]:
        response = httpx.post(f"{self.url}/collective_rpc", json={"method": method}, timeout=30)
        response.raise_for_status()
        return response.json()["results"]

    def processes_rss_bytes(self) -> int:
        import psutil

        root = psutil.Process(self.process.pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text()[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self._log.close()


def server_args(speculative_config: dict[str, Any] | None, *extra: str) -> list[str]:
    args = [
        "--dtype", "float32",
        "--enforce-eager",
        "--max-model-len", "1024",
        "--block-size", "32",
        "--max-num-seqs", "16",
        "--max-num-batched-tokens", "256",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--seed", "0",
        *extra,
    ]
    if speculative_config is not None:
        args += ["--speculative-config", json.dumps(speculative_config)]
    return args
