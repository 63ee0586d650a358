"""csrc/common/attention_state.h, built into a small host program by the C++ compiler and by
nvcc (its __host__ __device__ path): merging the softmax states of parts of a row gives the
row's log-sum-exp and each part's softmax mass."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

CSRC = Path(__file__).resolve().parents[2] / "csrc"
PROGRAM = Path(__file__).resolve().parent / "attention_state_main.cpp"
COMPILERS = {
    "c++": ["c++", "-std=c++17", "-O2"],
    "nvcc": ["nvcc", "-std=c++17", "-O2", "-x", "cu"],
}
# Sizes of the consecutive parts of one row of 64 logits; empty parts included.
PARTS = [0, 5, 17, 0, 1, 32, 9]


@pytest.fixture(scope="module", params=list(COMPILERS))
def program(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    command = COMPILERS[request.param]
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not on PATH")
    executable = tmp_path_factory.mktemp("attention_state") / "attention_state"
    result = subprocess.run(
        [*command, f"-I{CSRC}", "-o", str(executable), str(PROGRAM)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return executable


def run_program(program: Path, logits: torch.Tensor, parts: list[int]) -> list[float]:
    result = subprocess.run(
        [str(program), *map(str, parts)],
        input=" ".join(f"{logit:.9g}" for logit in logits.tolist()),
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(line) for line in result.stdout.split()]


@pytest.mark.parametrize("spread", [1.0, 300.0])
def test_merged_parts_give_lse_and_mass(program: Path, spread: float) -> None:
    """spread 300: logits far beyond exp()'s float range, so every merge rescales."""
    logits = torch.randn(sum(PARTS), generator=torch.Generator().manual_seed(0)) * spread
    merged_lse, sequential_lse, *shares = run_program(program, logits, PARTS)

    expected_lse = torch.logsumexp(logits.double(), dim=0).item()
    assert merged_lse == pytest.approx(expected_lse, rel=1e-6)
    assert sequential_lse == pytest.approx(expected_lse, rel=1e-6)
    expected_shares = torch.softmax(logits.double(), dim=0).split(PARTS)
    torch.testing.assert_close(
        torch.tensor(shares, dtype=torch.float64),
        torch.stack([part.sum() for part in expected_shares]),
        rtol=1e-5,
        atol=1e-12,
    )


def test_minus_infinity_carries_no_mass(program: Path) -> None:
    inf = float("inf")
    lse = pytest.approx(2.0 + math.log(2.0))
    assert run_program(program, torch.tensor([-inf, 2.0, -inf, 2.0]), [1, 1, 2]) == [
        lse, lse, 0.0, 0.5, 0.5
    ]
    assert run_program(program, torch.tensor([-inf]), [1])[:2] == [-inf, -inf]
