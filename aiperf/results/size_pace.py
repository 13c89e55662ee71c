"""The trained networks' sizes against the size schedule, per tenth of the run (docs/search.md, "Size schedule").

The workload fixes the band of training FLOPs per image over the run (:mod:`nas.schedule`), so
that the networks' sizes -- and with them how busy a step keeps a device -- follow the run's
progress, not the machine's speed or the seed's luck. Whether the search kept that pace is read
off the ledger: each counted epoch is placed in the tenth of the time budget its end falls in,
and each tenth's epoch-weighted mean size is set against the band at the tenth's midpoint.
A size is what the schedule measures: forward, backward, and the update spread over the
plan's batch (``TrainFlopsPerImage``), from each trial's ``trial_start.flops``; the band starts
at the seed trial's size.

A tenth's ``ratio`` is its mean over the band's low edge there; the search kept pace when every
tenth from the second on has ``ratio >= PACE_THRESHOLD`` (the first tenth trains the seed's
start-up children, which the band starts at). A run without a schedule (``search.size_growth``
unset), a language run, or one whose seed trial is not in its ledger has no such section.
"""

from __future__ import annotations

import math
from typing import TypedDict

from aiperf.ledger.schema import EpochRecord, RunStartRecord, TrialStartRecord
from nas.schedule import SizeSchedule

TENTHS = 10
PACE_THRESHOLD = 0.9  # a tenth's mean size at least this share of the band's low edge (issue 52)


class TenthPace(TypedDict):
    tenth: int  # 1..10
    epochs: int
    mean_flops: float | None  # epoch-weighted mean training FLOPs per image (None: no epoch ended in it)
    low: float
    high: float
    ratio: float | None  # mean_flops / low


class SizePaceSummary(TypedDict):
    """The summary's ``size_pace`` section."""

    start: float
    end: float
    width: float
    threshold: float
    per_tenth: list[TenthPace]
    lowest_ratio: float | None  # the lowest ratio of tenths 2..10 that trained
    behind: list[int]  # tenths 2..10 below the threshold
    kept_pace: bool


def _size(rec: TrialStartRecord, batch: int | None) -> float | None:
    """The trial's training FLOPs per image as the schedule counts them (at the plan's batch)."""
    f = rec.flops
    if batch and f.forward is not None and f.backward is not None and f.update_per_step is not None:
        return float(f.forward) + float(f.backward) + float(f.update_per_step) / batch
    return float(f.train_per_image) if f.train_per_image is not None else None


class SizePace:
    """Trial sizes and each epoch's tenth, kept one record at a time (see the module docstring)."""

    def __init__(self, start: RunStartRecord) -> None:
        search = start.config.search
        self.batch = start.plan.batch_size
        self.growth, self.width, self.cap = search.size_growth, search.size_band, search.max_flops_per_image
        self.budget = start.config.run.time_budget_s
        self.active = start.family != "language" and bool(self.growth) and bool(self.width) and bool(self.budget)
        self.sizes: dict[str, float] = {}
        self.seed: float | None = None
        self.sums = [0.0] * TENTHS
        self.counts = [0] * TENTHS

    def add_start(self, rec: TrialStartRecord) -> None:
        if not self.active or rec.trial in self.sizes:
            return
        size = _size(rec, self.batch)
        if size is None:
            return
        self.sizes[rec.trial] = size
        if rec.kind == "seed" and self.seed is None:
            self.seed = size

    def add_epoch(self, rec: EpochRecord) -> None:
        size = self.sizes.get(rec.trial)
        if size is None or not self.budget:
            return
        tenth = min(TENTHS - 1, max(0, int(TENTHS * float(rec.t) / float(self.budget))))
        self.sums[tenth] += size
        self.counts[tenth] += 1

    def schedule(self) -> SizeSchedule | None:
        if not self.active or self.seed is None or self.seed <= 0:
            return None
        assert self.growth is not None and self.width is not None
        cap = float(self.cap) if self.cap is not None else math.inf
        return SizeSchedule(self.seed, min(self.seed * float(self.growth), max(self.seed, cap)), float(self.width))

    def summary(self) -> SizePaceSummary | None:
        schedule = self.schedule()
        if schedule is None:
            return None
        per_tenth: list[TenthPace] = []
        for k in range(TENTHS):
            low, high = schedule.band((k + 0.5) / TENTHS)
            mean = self.sums[k] / self.counts[k] if self.counts[k] else None
            per_tenth.append(
                {
                    "tenth": k + 1,
                    "epochs": self.counts[k],
                    "mean_flops": mean,
                    "low": low,
                    "high": high,
                    "ratio": mean / low if mean is not None else None,
                }
            )
        later = [t for t in per_tenth[1:] if t["ratio"] is not None]
        behind = [t["tenth"] for t in later if (t["ratio"] or 0.0) < PACE_THRESHOLD]
        return {
            "start": schedule.start,
            "end": schedule.end,
            "width": schedule.width,
            "threshold": PACE_THRESHOLD,
            "per_tenth": per_tenth,
            "lowest_ratio": min((t["ratio"] or 0.0) for t in later) if later else None,
            "behind": behind,
            "kept_pace": not behind,
        }


def format_size_pace(section: SizePaceSummary | None) -> str | None:
    """One line for the printed summary (None without a schedule)."""
    if section is None:
        return None
    ratios = " ".join("-" if t["ratio"] is None else f"{t['ratio']:.2f}" for t in section["per_tenth"])
    if section["kept_pace"]:
        verdict = "kept pace"
    else:
        verdict = f"fell below {section['threshold']:.1f} x the band's low edge in tenth(s) {section['behind']}"
    return f"{verdict}; mean size / band low edge per tenth: {ratios}"
