"""The sampling tests' statistic has the power it is used for: at the sample size and
threshold of the engine's sampling tests, it rejects a sampler that moves five points
of probability and accepts an unbiased one."""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2_contingency

from tests.distributions import (
    NUM_SAMPLES,
    P_VALUE_THRESHOLD,
    TESTED_POSITIONS,
    min_p_value,
    two_sample_p_value,
)

# A spread next-token distribution, as at the sharp tiny target's later positions: a few
# likely tokens and a long tail of rare ones.
PROBABILITIES = np.array([0.25, 0.12, 0.08, 0.06, 0.05] + [0.44 / 200] * 200)
TRIALS = 20


def samples(probabilities: np.ndarray, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    columns = [rng.choice(len(probabilities), size=NUM_SAMPLES, p=probabilities) for _ in TESTED_POSITIONS]
    return np.stack([np.zeros(NUM_SAMPLES, dtype=int), *columns], axis=1).tolist()


def moved(probabilities: np.ndarray, points: float, source: int, destination: int) -> np.ndarray:
    shifted = probabilities.copy()
    shifted[source] -= points
    shifted[destination] += points
    return shifted


def test_a_sampler_moving_five_points_is_rejected() -> None:
    biased = moved(PROBABILITIES, 0.05, source=0, destination=2)
    rejected = sum(
        min_p_value(samples(PROBABILITIES, seed), samples(biased, 1000 + seed), TESTED_POSITIONS)
        < P_VALUE_THRESHOLD
        for seed in range(TRIALS)
    )
    assert rejected >= TRIALS - 1


def test_an_unbiased_sampler_is_accepted() -> None:
    accepted = sum(
        min_p_value(samples(PROBABILITIES, seed), samples(PROBABILITIES, 1000 + seed), TESTED_POSITIONS)
        >= P_VALUE_THRESHOLD
        for seed in range(TRIALS)
    )
    assert accepted == TRIALS


def test_rare_tokens_are_pooled_and_identical_samples_agree() -> None:
    """Ten rare tokens in each sample, none shared: one category of the test's table."""
    first = [1] * 500 + [2] * 300 + list(range(10, 20))
    second = [1] * 480 + [2] * 320 + list(range(20, 30))
    pooled = chi2_contingency([[500, 300, 10], [480, 320, 10]]).pvalue
    assert two_sample_p_value(first, second) == pooled
    assert two_sample_p_value(first, first) == 1.0
