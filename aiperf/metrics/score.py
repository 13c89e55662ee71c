"""The benchmark's score, computed from the run ledger alone (counting rules in docs/ledger.md).

Only completed epochs count: each ``epoch`` record carries the operations of that epoch,
so work in progress when the run stopped, and the lost partial epoch of a re-queued
trial, are simply absent. The rate divides by the run's elapsed time on the master's clock
to its recorded end (its final ``run_stop``), downtime between a crash and its resume
included, so a crash or a stall can only lower the score; a ledger without a recorded end
(a run in progress, a ledger cut short) is scored to its last completed epoch. The regulated
score multiplies the rate by ``|ln(1 - best accuracy)|`` as AIPerf did, so a run cannot
score by computing fast and learning nothing.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TypedDict, cast

import numpy as np

from aiperf.ledger.schema import (
    EpochRecord,
    Record,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    run_records,
)

MAX_ACCURACY = 1.0 - 1e-9  # keeps the quality factor finite for a perfect score
TIMELINE_POINTS = 100
_PREFIXES = ("", "k", "M", "G", "T", "P", "E", "Z", "Y", "R", "Q")


@dataclass(frozen=True)
class Score:
    """The figures a run reports; ``ops_per_s`` is counted operations over the scored wall time."""

    total_ops: float
    train_ops: float
    eval_ops: float
    aiperf_ops: float
    wall_s: float
    ops_per_s: float
    best_val_acc: float | None
    quality: float
    regulated: float
    aiperf_regulated: float
    epochs: int
    trials_completed: int
    trials_started: int

    def to_dict(self) -> ScoreDict:
        """The fields as the summary holds them (the TypedDict names them; checked against real summaries)."""
        return cast("ScoreDict", asdict(self))


class ScoreDict(TypedDict):
    """A :class:`Score` as the summary holds it (its fields, in their order)."""

    total_ops: float
    train_ops: float
    eval_ops: float
    aiperf_ops: float
    wall_s: float
    ops_per_s: float
    best_val_acc: float | None
    quality: float
    regulated: float
    aiperf_regulated: float
    epochs: int
    trials_completed: int
    trials_started: int


class TimelinePoint(TypedDict):
    """The score had the run stopped at master time ``t`` (:func:`score_timeline`)."""

    t: float
    total_ops: float
    ops_per_s: float
    best_val_acc: float | None
    regulated: float


def quality_factor(accuracy: float | None) -> float:
    """``|ln(1 - accuracy)|`` with the accuracy clamped to [0, 1 - 1e-9]; 0 without an accuracy."""
    if accuracy is None:
        return 0.0
    return abs(math.log(1.0 - min(max(float(accuracy), 0.0), MAX_ACCURACY)))


def _rate(ops: float, wall_s: float) -> float:
    return ops / wall_s if wall_s > 0 else 0.0


def _number(value: float | None) -> float:
    """An optional count of an epoch record as a float; an absent one counts nothing."""
    return 0.0 if value is None else float(value)


def compute_score(records: Iterable[Record]) -> Score:
    """The score of a ledger (its records in file order; audit records after its end are not the run's)."""
    tally = ScoreTally()
    records = run_records(list(records))
    for record in records:
        tally.add(record)
    return tally.score(records[-1] if records and isinstance(records[-1], RunStopRecord) else None)


class ScoreTally:
    """:func:`compute_score` kept up to date record by record, without holding the records.

    A reader that streams a ledger (the MLPerf-style log, written while a run of millions of
    epochs goes on) adds each record as it comes; the sums are taken in file order, so the
    score is the very number :func:`compute_score` gives for the same records. A reader that
    counts trials itself passes ``count_trials=False`` (the score then counts none; the tally
    holds no trial ids).
    """

    def __init__(self, count_trials: bool = True) -> None:
        self.count_trials = count_trials
        self.total: float = 0
        self.train: float = 0
        self.eval: float = 0
        self.aiperf: float = 0
        self.last_epoch_t = 0.0
        self.best: float | None = None
        self.epochs = 0
        self.started: set[str] = set()
        self.completed: set[str] = set()

    def add(self, record: Record) -> None:
        if isinstance(record, EpochRecord):
            self.total += _number(record.ops)
            self.train += _number(record.train_ops)
            self.eval += _number(record.eval_ops)
            self.aiperf += _number(record.aiperf_ops)
            self.last_epoch_t = max(self.last_epoch_t, float(record.t))
            # val_acc is required by the record's shape; a record built without validation may still lack one.
            if record.val_acc is not None:
                value = float(record.val_acc)
                self.best = value if self.best is None else max(self.best, value)
            self.epochs += 1
        elif not self.count_trials:
            return
        elif isinstance(record, TrialStartRecord):
            self.started.add(record.trial)
        elif isinstance(record, TrialEndRecord) and record.status == TrialStatus.COMPLETED:
            self.completed.add(record.trial)

    def score(self, end: RunStopRecord | None = None) -> Score:
        """The score so far; ``end``: the run's final ``run_stop``, whose time is the recorded end."""
        wall = self.last_epoch_t
        if end is not None:
            wall = max(wall, float(end.t))
        quality = quality_factor(self.best)
        return Score(
            total_ops=self.total,
            train_ops=self.train,
            eval_ops=self.eval,
            aiperf_ops=self.aiperf,
            wall_s=wall,
            ops_per_s=_rate(self.total, wall),
            best_val_acc=self.best,
            quality=quality,
            regulated=_rate(self.total, wall) * quality,
            aiperf_regulated=_rate(self.aiperf, wall) * quality,
            epochs=self.epochs,
            trials_completed=len(self.completed),
            trials_started=len(self.started),
        )


def score_timeline(records: Iterable[Record], interval_s: float | None = None) -> list[TimelinePoint]:
    """The score as it would have been had the run stopped at regular times (default ~100 points).

    Each point ``t`` counts the epochs completed by ``t`` and divides by ``t``, as
    :func:`compute_score` does for a run whose recorded end is ``t``; the last point, at the
    ledger's last record, is the run's score.
    """
    timeline = TimelineTally()
    for record in records:
        timeline.add(record)
    return timeline.points(interval_s)


class TimelineTally:
    """:func:`score_timeline` kept record by record, as three numbers per epoch and no records.

    A reader that streams a ledger (``results.load``) adds each record as it comes and holds
    24 bytes per epoch; :func:`score_timeline` is this over a list, so both give one curve.
    """

    def __init__(self) -> None:
        self.end = 0.0  # the latest record's time
        self._t, self._ops, self._acc = array("d"), array("d"), array("d")  # per epoch; NaN: no val_acc

    def add(self, record: Record) -> None:
        self.end = max(self.end, float(record.t))
        if isinstance(record, EpochRecord):
            self._t.append(float(record.t))
            self._ops.append(_number(record.ops))
            self._acc.append(math.nan if record.val_acc is None else float(record.val_acc))

    def points(self, interval_s: float | None = None) -> list[TimelinePoint]:
        """The curve at every ``interval_s`` up to the latest record (default: ``TIMELINE_POINTS`` points)."""
        end = self.end
        if end <= 0:
            return []
        if interval_s is None:
            interval_s = end / TIMELINE_POINTS
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        order = np.argsort(_floats(self._t), kind="stable")  # epochs at the same time stay in file order
        epoch_t = _floats(self._t)[order]
        cumulative = np.cumsum(_floats(self._ops)[order])  # summed one by one in time order
        best = np.fmax.accumulate(_floats(self._acc)[order])  # NaN until the first val_acc
        count = math.ceil(end / interval_s - 1e-9)
        points: list[TimelinePoint] = []
        for k in range(1, count + 1):
            t = min(k * interval_s, end)
            done = int(np.searchsorted(epoch_t, t, side="right"))
            total = float(cumulative[done - 1]) if done else 0.0
            acc = float(best[done - 1]) if done and not math.isnan(best[done - 1]) else None
            rate = _rate(total, t)
            points.append(
                {
                    "t": t,
                    "total_ops": total,
                    "ops_per_s": rate,
                    "best_val_acc": acc,
                    "regulated": rate * quality_factor(acc),
                }
            )
        return points


def _floats(values: array) -> np.ndarray:
    return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)


def format_percent(fraction: float | None) -> str:
    """A share as a percentage: one decimal from 1 % up, three significant digits below (0.0587 % is not 0.0 %)."""
    if fraction is None:
        return "-"
    value = 100 * fraction
    return f"{value:.1f} %" if abs(value) >= 1 else f"{value:.3g} %"


def format_ops(value: float, unit: str = "OPS") -> str:
    """``value`` with an SI prefix and three significant digits: ``12.3 GOPS``, ``1.05 TOPS``."""
    if not math.isfinite(value):
        return f"{value} {unit}"
    if value == 0:
        return f"0 {unit}"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    index = min(max(math.floor(math.log10(magnitude) / 3), 0), len(_PREFIXES) - 1)
    mantissa = float(f"{magnitude / 1000**index:.3g}")
    if mantissa >= 1000 and index < len(_PREFIXES) - 1:  # 999.96 G rounds up to 1 T
        index += 1
        mantissa = float(f"{magnitude / 1000**index:.3g}")
    return f"{sign}{mantissa:.3g} {_PREFIXES[index]}{unit}"
