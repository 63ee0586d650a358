"""Choosing between two ways of running a step from measured steps of each
(`TwoWayChoice`, for `verification_attention: auto`; its parts for `retrieval: auto`), and
when a choice, once made, tries the other again (`Exploration`, also for `drafting: auto`).

Exploring the worse way costs time: an exploration of E steps, each giving T_e tokens in
S_e seconds where the kept way gives T_k tokens in S_k, loses E * (S_e / S_k - T_e / T_k)
kept steps (with w the kept way's measured win in tokens per second, S_e / S_k is
w * T_e / T_k), plus what its switches there and back cost more than a step of each way
(for `drafting: auto`, the draft's catch-up after plain steps). Once a choice has been
checked again, explorations come at most once in the number of steps that keeps that loss
within EXPLORATION_BUDGET of them, and at least once in LONGEST_BUDGETED_PERIOD steps,
whatever the doubling schedule says."""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from typing import Protocol

# After a choice is made, the other one is measured again for a few steps after a first
# period of steps, then after twice as many each time the choice holds, up to a longest
# period: a wrong first choice costs few steps, a right one is rarely left. A choice that
# wins by more than CLEAR_WIN waits the longest period from the start. The default periods
# (those of `drafting: auto` measuring drafting again):
FIRST_EXPLORATION_PERIOD = 8
EXPLORATION_PERIOD = 64
CLEAR_WIN = 1.5
# The other choice must measure this much faster to replace the current one.
SWITCH_MARGIN = 1.02
# A choice made by a win below NARROW_WIN is checked again after at most
# NARROW_WIN_PERIOD steps, whatever its first period: the few steps that made it may come
# from a slower or faster stretch than the steps after them (with 4 requests on 2 cores,
# a bucket's first plain steps measured 1.35x slower than the later ones and made one
# draft a step win narrowly where it lost 1.3x), and a narrow check costs little.
NARROW_WIN = 1.1
NARROW_WIN_PERIOD = 8
# The share of a settled choice's steps its explorations may lose, and the longest period
# this may stretch the schedule to (a changed workload is found within it).
EXPLORATION_BUDGET = 0.03
LONGEST_BUDGETED_PERIOD = 256
# A step measured as taking no time (a clock coarser than the step) counts as taking this
# long, so that every way's tokens per second stay finite.
SHORTEST_STEP_SECONDS = 1e-9
# Two ways' tokens per step count as different only by what their difference exceeds
# this many of its standard errors (`tokens_beyond_noise`).
TOKENS_NOISE_STANDARD_ERRORS = 1.0


@dataclasses.dataclass
class MovingAverage:
    smoothing: float
    value: float = 0.0
    samples: int = 0
    variance: float = 0.0

    def add(self, measurement: float) -> None:
        """The mean of the samples so far, until there are 1 / smoothing of them; then an
        exponential moving average (the first samples weigh no more than the later ones).
        `variance` follows the samples' spread around it the same way.

        >>> average = MovingAverage(smoothing=0.25)
        >>> for measurement in (1.0, 4.0, 4.0, 1.0):
        ...     average.add(measurement)
        >>> average.value, average.variance
        (2.5, 2.25)
        """
        self.samples += 1
        weight = max(1 / self.samples, self.smoothing)
        deviation = measurement - self.value
        self.value += weight * deviation
        self.variance = (1 - weight) * (self.variance + weight * deviation**2)

    @property
    def standard_error(self) -> float:
        """How far `value` may be from the samples' true mean: their spread over the
        square root of the samples it averages (an exponential average of weight s
        averages about (2 - s) / s of them).

        >>> average = MovingAverage(smoothing=0.25)
        >>> for measurement in (1.0, 4.0, 4.0, 1.0):
        ...     average.add(measurement)
        >>> average.standard_error
        0.75
        """
        if not self.samples:
            return math.inf
        averaged = min(self.samples, (2 - self.smoothing) / self.smoothing)
        return math.sqrt(self.variance / averaged)


def keeps_preference(prefers_first: bool, first_rate: float, second_rate: float) -> bool:
    """The preference after comparing the two rates (tokens per second): the other choice
    must win by SWITCH_MARGIN.

    >>> keeps_preference(True, 1.0, 1.01), keeps_preference(True, 1.0, 1.03)
    (True, False)
    """
    if prefers_first:
        return second_rate <= SWITCH_MARGIN * first_rate
    return first_rate > SWITCH_MARGIN * second_rate


def budgeted_period(
    steps_to_explore: int, win: float, explored_tokens_ratio: float, switch_steps: float = 0.0
) -> int:
    """The fewest steps between explorations of `steps_to_explore` steps of a way that
    measures `win` times slower in tokens per second than the kept one, its steps giving
    `explored_tokens_ratio` times the kept one's tokens, and whose switches there and back
    cost `switch_steps` kept steps more, for the explorations to lose at most
    EXPLORATION_BUDGET of those steps; at most LONGEST_BUDGETED_PERIOD.

    Drafting at 1.66 tokens/s, 2.68 tokens a step, against 1.92 plain (a 1.16x win for not
    drafting): 8 drafting steps lose 3.4 plain steps, so drafting is tried again after
    115 plain steps. Were drafting the one winning 1.16x, 4 plain steps explored would lose
    0.24 drafting steps: 8 steps between explorations would do, or 15 where the draft's
    catch-up on the way back costs 0.2 drafting steps more.

    >>> budgeted_period(8, 1.16, 2.68), budgeted_period(4, 1.16, 1 / 2.68)
    (115, 8)
    >>> budgeted_period(4, 1.16, 1 / 2.68, switch_steps=0.2)
    15
    """
    lost_steps = steps_to_explore * explored_tokens_ratio * max(win - 1.0, 0.0) + switch_steps
    return min(math.ceil(lost_steps / EXPLORATION_BUDGET), LONGEST_BUDGETED_PERIOD)


@dataclasses.dataclass
class Exploration:
    """Counts the steps of a settled choice until it measures the other one again.

    A choice made (by a win of 1.2x) explores after 8 steps, for 2 steps, then after 16
    (twice the period), or after 27 if the other way's steps give twice the tokens (two
    steps then lose 0.8 kept steps, 3% of 27). A first choice made narrowly (1.05x) where
    the first period is 32 is checked after 8 steps:

    >>> exploration = Exploration()
    >>> exploration.count_step(preference_changed=True, win=1.2, steps_to_explore=2)
    >>> explored = []
    >>> for _ in range(12):
    ...     exploration.count_step(preference_changed=False, win=1.2, steps_to_explore=2)
    ...     explored.append(exploration.exploring)
    >>> explored.index(True), explored.count(True), exploration.period
    (7, 2, 16)
    >>> exploration = Exploration()
    >>> exploration.count_step(True, 1.2, 2)
    >>> for _ in range(12):
    ...     exploration.count_step(False, 1.2, 2, explored_tokens_ratio=2.0)
    >>> exploration.period
    27
    >>> exploration = Exploration(first_period=32)
    >>> for _ in range(9):
    ...     exploration.count_step(False, 1.05, 2)
    >>> exploration.exploring
    True

    A first choice that the first measurement confirms by a clear win (2x) waits the longest
    period, as one made by a change would:

    >>> exploration = Exploration()
    >>> exploration.count_step(preference_changed=False, win=2.0, steps_to_explore=2)
    >>> exploration.period == EXPLORATION_PERIOD
    True
    """

    first_period: int = FIRST_EXPLORATION_PERIOD
    max_period: int = EXPLORATION_PERIOD
    exploring_for: int = 0
    steps_since: int = 0
    period: int = dataclasses.field(init=False)
    counted: bool = False
    # The last counted step's: how many times faster the kept choice measured, the other
    # one's tokens per step over its own, and what switching to it and back costs more, in
    # steps of its own.
    win: float = 1.0
    explored_tokens_ratio: float = 1.0
    switch_steps: float = 0.0

    def __post_init__(self) -> None:
        self.period = self.first_period

    @property
    def exploring(self) -> bool:
        return self.exploring_for > 0

    def count_step(
        self,
        preference_changed: bool,
        win: float,
        steps_to_explore: int,
        explored_tokens_ratio: float = 1.0,
        switch_steps: float = 0.0,
    ) -> None:
        """One measured step; `win`: how many times faster the preferred choice measures;
        `explored_tokens_ratio`: the other choice's tokens per step over the preferred one's;
        `switch_steps`: what switching to the other choice and back costs more, in
        preferred steps; the first step counted is that of the first choice."""
        choice_made = preference_changed or not self.counted
        self.counted = True
        self.win, self.explored_tokens_ratio = win, explored_tokens_ratio
        self.switch_steps = switch_steps
        if choice_made:
            self.exploring_for = 0
            self.steps_since = 0
            self.period = self.max_period if win > CLEAR_WIN else self.first_period
            if win < NARROW_WIN:
                self.period = min(self.period, NARROW_WIN_PERIOD)
        if preference_changed:
            return
        if self.exploring_for:
            self.exploring_for -= 1
            if not self.exploring_for:
                self.period = max(
                    min(2 * self.period, self.max_period),
                    budgeted_period(steps_to_explore, win, explored_tokens_ratio, switch_steps),
                )
        else:
            self.steps_since += 1
            if self.steps_since >= self.period:
                self.exploring_for = steps_to_explore
                self.steps_since = 0

    def explore_early(self, steps_to_explore: int, budgeted_steps: int) -> None:
        """Explores now, for `steps_to_explore` steps, where the kept choice wins by less
        than NARROW_WIN and the steps since the last exploration are as many as the budget
        asks of an exploration of `budgeted_steps` (`budgeted_period`): the workload has
        changed (a new text), and an exploration is worth more at the change than later.
        With `steps_to_explore` above `budgeted_steps` such explorations may lose that
        many times the budget. Elsewhere the schedule stays as it was.

        A choice winning 1.05x, the other way's steps giving the same tokens: 8 steps of it
        lose 0.4 kept steps, the budget's share of 14. After two explorations of 8 steps the
        schedule waits 32 steps; a change 11 steps into them is not explored early, one 21
        steps into them is:

        >>> exploration = Exploration()
        >>> for _ in range(41 + 10):
        ...     exploration.count_step(preference_changed=False, win=1.05, steps_to_explore=8)
        >>> exploration.explore_early(16, budgeted_steps=8); exploration.exploring
        False
        >>> for _ in range(10):
        ...     exploration.count_step(preference_changed=False, win=1.05, steps_to_explore=8)
        >>> exploration.explore_early(16, budgeted_steps=8); exploration.exploring_for
        16
        """
        if self.exploring or not self.counted or self.win >= NARROW_WIN:
            return
        if self.steps_since < budgeted_period(
            budgeted_steps, self.win, self.explored_tokens_ratio, self.switch_steps
        ):
            return
        self.explore_now(steps_to_explore)

    def explore_now(self, steps_to_explore: int) -> None:
        """Explores for `steps_to_explore` steps from the next one, unless exploring now;
        the schedule then goes on from its period.

        >>> exploration = Exploration(first_period=32)
        >>> exploration.count_step(preference_changed=False, win=2.0, steps_to_explore=4)
        >>> exploration.explore_now(4); exploration.exploring_for, exploration.period
        (4, 64)
        """
        if self.exploring:
            return
        self.exploring_for = steps_to_explore
        self.steps_since = 0


class RecentMedian:
    """The lower median of the last `window` step times: a step slowed down by a pause
    of the process, or of the machine, moves it by one rank rather than by its size, and
    pauses only slow steps down, so up to half of the window may be paused. A step of 0 s
    counts as SHORTEST_STEP_SECONDS.

    >>> times = RecentMedian(window=4)
    >>> for seconds in (0.010, 0.011, 0.200, 0.012, 0.010, 0.300):
    ...     times.add(seconds)
    >>> times.value, times.samples
    (0.012, 6)
    """

    def __init__(self, window: int):
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.samples = 0

    def add(self, step_seconds: float) -> None:
        self._recent.append(max(step_seconds, SHORTEST_STEP_SECONDS))
        self.samples += 1

    @property
    def value(self) -> float:
        return statistics.median_low(self._recent)


class TokensMeasurement(Protocol):
    """Tokens per step as measured, and how far that may be from the true mean."""

    @property
    def value(self) -> float: ...

    @property
    def standard_error(self) -> float: ...


def tokens_beyond_noise(
    first: TokensMeasurement, second: TokensMeasurement
) -> tuple[float, float]:
    """Two ways' tokens per step, as far apart as their measurements show: the difference
    of the means less TOKENS_NOISE_STANDARD_ERRORS standard errors of it, split around
    their middle. Tokens per step vary from 1 to k + 1 from one step to the next and with
    the text, so a few steps of each way often differ by chance (and texts change between
    requests); then the ways' step times decide, until their explorations have measured
    enough steps to show a real difference.

    2.9 and 2.4 tokens a step, each with a standard error of 0.2: the difference, 0.5,
    less 0.28, is 0.22:

    >>> first, second = MovingAverage(0.02, 2.9, 25, 1.0), MovingAverage(0.02, 2.4, 25, 1.0)
    >>> [round(tokens, 3) for tokens in tokens_beyond_noise(first, second)]
    [2.759, 2.541]
    """
    difference = second.value - first.value
    noise = TOKENS_NOISE_STANDARD_ERRORS * math.hypot(first.standard_error, second.standard_error)
    shown = math.copysign(max(abs(difference) - noise, 0.0), difference)
    middle = (first.value + second.value) / 2
    return middle - shown / 2, middle + shown / 2


@dataclasses.dataclass
class WayMeasurements:
    """One way's step time (the median of its recent steps) and tokens per step (1 +
    accepted drafts, a moving average)."""

    step_window: dataclasses.InitVar[int]
    tokens_smoothing: dataclasses.InitVar[float]
    step_s: RecentMedian = dataclasses.field(init=False)
    tokens_per_step: MovingAverage = dataclasses.field(init=False)

    def __post_init__(self, step_window: int, tokens_smoothing: float) -> None:
        self.step_s = RecentMedian(step_window)
        self.tokens_per_step = MovingAverage(tokens_smoothing)

    @property
    def samples(self) -> int:
        return self.step_s.samples

    def add(self, step_seconds: float, tokens_per_step: float) -> None:
        self.step_s.add(step_seconds)
        self.tokens_per_step.add(tokens_per_step)


def measuring_uses_second(
    first_samples: int, second_samples: int, min_samples: int, measuring_turn: int
) -> bool:
    """Whether the second way runs next while the two are measured: the way short of
    `min_samples` once the other has them, else each in turns of `measuring_turn` steps,
    the first way first.

    >>> [measuring_uses_second(first, 0, 4, 2) for first in range(5)]
    [False, False, True, True, True]
    """
    if first_samples >= min_samples > second_samples:
        return True
    if second_samples >= min_samples > first_samples:
        return False
    return (first_samples + second_samples) // measuring_turn % 2 == 1


def compare_ways(
    exploration: Exploration,
    prefers_second: bool,
    first_rate: float,
    second_rate: float,
    tokens_ratio: float,
    steps_to_explore: int,
) -> bool:
    """The preference after one more measured step, from the two ways' tokens per second
    (`tokens_ratio`: the second way's tokens per step over the first's); counts the step
    towards `exploration`'s next exploration of the way not preferred.

    >>> compare_ways(Exploration(), False, 1.0, 1.5, 1.0, 2)
    True
    """
    preferred = keeps_preference(prefers_second, second_rate, first_rate)
    win = second_rate / first_rate
    exploration.count_step(
        preferred != prefers_second,
        win if preferred else 1 / win,
        steps_to_explore,
        1 / tokens_ratio if preferred else tokens_ratio,
    )
    return preferred


@dataclasses.dataclass(frozen=True)
class TwoWaySchedule:
    """How a `TwoWayChoice` measures: `min_samples` steps of each way, taken in turns of
    `measuring_turn` steps, before comparing them; then explorations of
    `exploration_steps` steps after `first_period`, ... `max_period` steps."""

    min_samples: int
    measuring_turn: int
    exploration_steps: int
    first_period: int
    max_period: int
    step_window: int
    tokens_smoothing: float


class TwoWayChoice:
    """Between two ways of running a step that give the same output, the one giving more
    tokens per second, from measured steps of each.

    The second way takes 0.4 s a step where the first takes 0.5 s (1 token a step): after
    two turns of 2 steps each, the second is preferred and run; the first is explored again
    after 4 steps, for 2; the measuring turns start with the first way:

    >>> def run(choice):
    ...     ways = []
    ...     for _ in range(12):
    ...         second = choice.uses_second()
    ...         choice.record(second, 0.4 if second else 0.5, 1.0)
    ...         ways.append(int(second))
    ...     return ways
    >>> run(TwoWayChoice(TwoWaySchedule(2, 2, 2, 4, 16, 2, 0.5)))
    [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1]
    """

    def __init__(self, schedule: TwoWaySchedule):
        self.schedule = schedule
        self.first = WayMeasurements(schedule.step_window, schedule.tokens_smoothing)
        self.second = WayMeasurements(schedule.step_window, schedule.tokens_smoothing)
        self.prefers_second = False
        self.exploration = Exploration(schedule.first_period, schedule.max_period)

    def measured(self) -> bool:
        return min(self.first.samples, self.second.samples) >= self.schedule.min_samples

    def uses_second(self) -> bool:
        """Each way in turns until both are measured, then the preferred one, or the other
        one while exploring."""
        if not self.measured():
            return measuring_uses_second(
                self.first.samples,
                self.second.samples,
                self.schedule.min_samples,
                self.schedule.measuring_turn,
            )
        return self.prefers_second != self.exploration.exploring

    def record(self, second: bool, step_seconds: float, tokens_per_step: float) -> None:
        """One step run the `second` way (or the first) took `step_seconds` and gave
        `tokens_per_step` tokens per request."""
        (self.second if second else self.first).add(step_seconds, tokens_per_step)
        if not self.measured():
            return
        first_tokens, second_tokens = tokens_beyond_noise(
            self.first.tokens_per_step, self.second.tokens_per_step
        )
        self.prefers_second = compare_ways(
            self.exploration,
            self.prefers_second,
            first_tokens / self.first.step_s.value,
            second_tokens / self.second.step_s.value,
            second_tokens / first_tokens,
            self.schedule.exploration_steps,
        )
