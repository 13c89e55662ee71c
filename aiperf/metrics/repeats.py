"""Several runs of one config combined into one figure with its spread (``aiperf run --repeat``).

A list shows one number per system; a committee needs to know how far that number moves.
The combination follows MLCommons' result summarizer where it has a rule (the olympic mean:
drop the best and the worst run and average the rest, from five runs) and states the spread
beside it: the coefficient of variation (sample standard deviation over the mean), min and max.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

OLYMPIC_MIN_RUNS = 5  # MLCommons drops the fastest and slowest of five or more runs


@dataclass(frozen=True)
class Spread:
    """One figure over several runs."""

    runs: int
    median: float
    mean: float
    olympic_mean: float | None  # None below OLYMPIC_MIN_RUNS runs
    cv: float | None  # None for one run, or a zero mean
    min: float
    max: float

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def spread(values: Sequence[float]) -> Spread:
    """The spread of ``values`` (at least one)."""
    if not values:
        raise ValueError("spread of no values")
    values = [float(v) for v in values]
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else None
    olympic = None
    if len(values) >= OLYMPIC_MIN_RUNS:
        olympic = statistics.fmean(sorted(values)[1:-1])
    return Spread(len(values), statistics.median(values), mean, olympic, cv, min(values), max(values))


def format_spread(name: str, s: Spread, show: Callable[[float], str]) -> str:
    """``OPS  median 140 GOPS, CV 2.1 %, min 136 GOPS, max 143 GOPS`` (olympic mean when there is one)."""
    cv = "-" if s.cv is None else f"{100 * s.cv:.1f} %"
    olympic = "" if s.olympic_mean is None else f", olympic mean {show(s.olympic_mean)}"
    return f"  {name:<14} median {show(s.median)}{olympic}, CV {cv}, min {show(s.min)}, max {show(s.max)}"
