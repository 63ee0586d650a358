"""When a choice between two ways of running a step, once made, tries the other again."""

from __future__ import annotations

import dataclasses

# After a choice is made, the other one is measured again for a few steps after a first
# period of steps, then after twice as many each time the choice holds, up to a longest
# period: a wrong first choice costs few steps, a right one is rarely left. A choice that
# wins by more than CLEAR_WIN waits the longest period from the start. The default periods
# (those of `drafting: auto` measuring drafting again):
FIRST_EXPLORATION_PERIOD = 8
EXPLORATION_PERIOD = 64
CLEAR_WIN = 1.5
# The other choice must measure this much faster to replace the current one.
SWITCH_MARGIN = 1.05


@dataclasses.dataclass
class MovingAverage:
    smoothing: float
    value: float = 0.0
    samples: int = 0

    def add(self, measurement: float) -> None:
        """The mean of the samples so far, until there are 1 / smoothing of them; then an
        exponential moving average (the first samples weigh no more than the later ones).

        >>> average = MovingAverage(smoothing=0.25)
        >>> for measurement in (1.0, 4.0, 4.0, 1.0):
        ...     average.add(measurement)
        >>> average.value
        2.5
        """
        self.samples += 1
        weight = max(1 / self.samples, self.smoothing)
        self.value += weight * (measurement - self.value)


def keeps_preference(prefers_first: bool, first_rate: float, second_rate: float) -> bool:
    """The preference after comparing the two rates (tokens per second): the other choice
    must win by SWITCH_MARGIN.

    >>> keeps_preference(True, 1.0, 1.04), keeps_preference(True, 1.0, 1.06)
    (True, False)
    """
    if prefers_first:
        return second_rate <= SWITCH_MARGIN * first_rate
    return first_rate > SWITCH_MARGIN * second_rate


@dataclasses.dataclass
class Exploration:
    """Counts the steps of a settled choice until it measures the other one again.

    A choice made (by a win of 1.2x) explores after 8 steps, for 2 steps:

    >>> exploration = Exploration()
    >>> exploration.count_step(preference_changed=True, win=1.2, steps_to_explore=2)
    >>> explored = []
    >>> for _ in range(12):
    ...     exploration.count_step(preference_changed=False, win=1.2, steps_to_explore=2)
    ...     explored.append(exploration.exploring)
    >>> explored.index(True), explored.count(True), exploration.period
    (7, 2, 16)
    """

    first_period: int = FIRST_EXPLORATION_PERIOD
    max_period: int = EXPLORATION_PERIOD
    exploring_for: int = 0
    steps_since: int = 0
    period: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.period = self.first_period

    @property
    def exploring(self) -> bool:
        return self.exploring_for > 0

    def count_step(self, preference_changed: bool, win: float, steps_to_explore: int) -> None:
        """One measured step; `win`: how many times faster the preferred choice measures."""
        if preference_changed:
            self.exploring_for = 0
            self.steps_since = 0
            self.period = self.max_period if win > CLEAR_WIN else self.first_period
        elif self.exploring_for:
            self.exploring_for -= 1
            if not self.exploring_for:
                self.period = min(2 * self.period, self.max_period)
        else:
            self.steps_since += 1
            if self.steps_since >= self.period:
                self.exploring_for = steps_to_explore
                self.steps_since = 0
