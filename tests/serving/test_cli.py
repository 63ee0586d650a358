"""vLLM's CLI with the plugin installed: it starts, and a bad `--speculative-config` makes
`vllm serve` exit at startup with a message naming the key, before any model loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.serving.conftest import specextend_serving_config
from tests.serving.servers import SERVER_ENV, VLLM_CLI, free_port, serve_command

pytestmark = pytest.mark.serving


# `vllm --version` imports vLLM: 30 s on an idle 2-core machine, over 120 s in one clean-clone
# run of the whole suite on a slow one.
VERSION_TIMEOUT_S = 600


def test_the_cli_reports_vllms_version() -> None:
    result = subprocess.run(
        [str(VLLM_CLI), "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().startswith("0.32.")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chunk_sise": 32}, r"unknown key\(s\) \['chunk_sise'\]"),
        ({"token_budget": "1024"}, r"\['token_budget'\] must be an integer"),
        ({"retrieval_interval": 0}, r"\['retrieval_interval'\] must be >= 1"),
        ({"verification_attention": "flash"}, r"\['verification_attention'\] must be one of"),
    ],
)
def test_a_bad_speculative_config_stops_vllm_serve_at_startup(
    serving_models: dict[str, Path], change: dict, message: str
) -> None:
    config = {**specextend_serving_config(serving_models["draft"]), **change}
    command = serve_command(
        serving_models["target"], free_port(), "--speculative-config", json.dumps(config)
    )
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, **SERVER_ENV}
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(message, output), output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_speculative_config_that_is_not_json_stops_vllm_serve(serving_models: dict[str, Path]) -> None:
    command = serve_command(
        serving_models["target"], free_port(), "--speculative-config", "{method: specextend"
    )
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, **SERVER_ENV}
    )
    assert result.returncode != 0
    assert "speculative-config" in result.stdout + result.stderr
