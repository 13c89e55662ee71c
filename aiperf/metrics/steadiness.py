"""How steady a run's rate was: the spread of its OPS across equal windows of the steady part.

One run cannot show how far its score would move on a second run, but it can show how much
its own rate moved while it ran. The scored interval (master time 0 to the last counted
epoch, as in :func:`aiperf.metrics.score.compute_score`) is cut into ``WINDOWS`` equal
windows; each epoch's operations are spread evenly over the time it spent in steps
(``t - train_s - eval_s`` to ``t``), so a window's rate does not depend on where an epoch
happened to end. The first window holds the start-up (Ray, workers, first compilation)
and is reported on its own; the others are the steady part. A ledger alone determines
every figure, so ``aiperf verify`` recomputes them with the rest of the summary.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TypedDict, cast

from aiperf.ledger.schema import EpochRecord, Record, of_type

WINDOWS = 10  # equal windows over the scored interval; the first is the start-up
MIN_STEADY_EPOCHS = 8  # a run with fewer counted epochs gets no figure


@dataclass(frozen=True)
class Steadiness:
    """The steady part's OPS: mean, spread across windows, and what the start-up window reached."""

    window_s: float
    windows: int  # steady windows (all but the first)
    startup_ops_per_s: float  # the first window's rate
    steady_ops_per_s: float  # mean rate over the steady windows
    window_min_ops_per_s: float
    window_max_ops_per_s: float
    window_cv: float  # coefficient of variation of the steady windows' rates
    half_width: float  # 95 % half-width of the steady mean, relative (Student t over the windows)

    def to_dict(self) -> SteadinessDict:
        """The fields as the summary holds them (the TypedDict names them; checked against real summaries)."""
        return cast("SteadinessDict", asdict(self))


class SteadinessDict(TypedDict):
    """A :class:`Steadiness` as the summary's ``steadiness`` section holds it (its fields, in their order)."""

    window_s: float
    windows: int
    startup_ops_per_s: float
    steady_ops_per_s: float
    window_min_ops_per_s: float
    window_max_ops_per_s: float
    window_cv: float
    half_width: float


def _busy_interval(epoch: EpochRecord) -> tuple[float, float]:
    """When the epoch's steps ran: ``train_s + eval_s`` before its record (its end, if not recorded)."""
    end = float(epoch.t)
    busy = float(epoch.train_s or 0.0) + float(epoch.eval_s or 0.0)
    return max(0.0, end - busy), end


def window_rates(records: Iterable[Record], windows: int = WINDOWS) -> tuple[float, list[float]]:
    """(window length, OPS of each of ``windows`` equal windows of the scored interval)."""
    epochs = of_type(list(records), EpochRecord)
    end = max((float(r.t) for r in epochs), default=0.0)
    return spread_rates(((*_busy_interval(e), float(e.ops or 0.0)) for e in epochs), end, windows)


def spread_rates(
    intervals: Iterable[tuple[float, float, float]], end: float, windows: int = WINDOWS
) -> tuple[float, list[float]]:
    """:func:`window_rates` from each epoch's ``(busy from, busy to, ops)`` and the last epoch's ``t``
    (what a streaming reader keeps of the epochs, aiperf.results.summary)."""
    if end <= 0 or windows < 1:
        return 0.0, []
    width = end / windows
    ops = [0.0] * windows
    for lo, hi, amount in intervals:
        if hi <= lo:  # no step time recorded: the whole amount at the epoch's end
            ops[min(windows - 1, int(hi / width))] += amount
            continue
        first, last = int(lo / width), min(windows - 1, int(hi / width))
        for k in range(first, last + 1):
            overlap = min(hi, (k + 1) * width) - max(lo, k * width)
            if overlap > 0:
                ops[k] += amount * overlap / (hi - lo)
    return width, [v / width for v in ops]


# Two-sided 95 % Student t quantiles by degrees of freedom (the steady windows less one).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def steadiness(records: Iterable[Record], windows: int = WINDOWS) -> Steadiness | None:
    """The run's own spread (see the module docstring); None when the steady part is too short to tell."""
    records = list(records)
    return steadiness_of(*window_rates(records, windows), len(of_type(records, EpochRecord)))


def steadiness_of(width: float, rates: list[float], epochs: int) -> Steadiness | None:
    """:func:`steadiness` from the windows' rates (:func:`spread_rates`) and the number of counted epochs."""
    if len(rates) < 3 or epochs < MIN_STEADY_EPOCHS:
        return None
    steady = rates[1:]
    mean = statistics.fmean(steady)
    if mean <= 0:
        return None
    sd = statistics.stdev(steady)
    t95 = _T95.get(len(steady) - 1, 1.96)
    return Steadiness(
        window_s=width,
        windows=len(steady),
        startup_ops_per_s=rates[0],
        steady_ops_per_s=mean,
        window_min_ops_per_s=min(steady),
        window_max_ops_per_s=max(steady),
        window_cv=sd / mean,
        half_width=t95 * sd / mean / math.sqrt(len(steady)),
    )
