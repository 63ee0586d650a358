"""Two-sample tests of token distributions, shared by the sampling tests."""

from __future__ import annotations

from collections import Counter

from scipy.stats import chi2_contingency

# Enough samples per run for a shift of five points in one token's probability to be
# rejected (tests/unit/test_distributions.py); the first output token comes from the
# prefill, the later ones from verification, so only those are tested.
NUM_SAMPLES = 6000
MAX_TOKENS = 6
TESTED_POSITIONS = range(1, MAX_TOKENS)
P_VALUE_THRESHOLD = 0.001 / len(TESTED_POSITIONS)


def two_sample_p_value(first: list[int], second: list[int], min_share: float = 0.01) -> float:
    """Chi-square test of homogeneity of two samples of tokens. Tokens holding less than
    `min_share` of both samples together are pooled into one category: a long tail of
    rare tokens would add degrees of freedom and hide a shift between likely ones."""
    counts_first, counts_second = Counter(first), Counter(second)
    min_count = min_share * (len(first) + len(second))
    frequent = sorted(t for t in counts_first | counts_second if counts_first[t] + counts_second[t] >= min_count)
    table = [[counts[t] for t in frequent] for counts in (counts_first, counts_second)]
    for row, counts, sample in zip(table, (counts_first, counts_second), (first, second)):
        row.append(len(sample) - sum(counts[t] for t in frequent))
    if table[0][-1] + table[1][-1] == 0:
        for row in table:
            row.pop()
    return chi2_contingency(table).pvalue


def min_p_value(first: list[list[int]], second: list[list[int]], positions: range) -> float:
    """The smallest, over output positions, of the two-sample p-values."""
    return min(
        two_sample_p_value([s[position] for s in first], [s[position] for s in second])
        for position in positions
    )
