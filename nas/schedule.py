"""The size schedule: the band of training FLOPs per image the search may propose at each point of a run.

Larger networks keep a device busier per step, so a search that happens to grow its networks
sooner scores higher on the same machine (measured: benchmarks/RESULTS.md, "A score that
repeats"). The schedule takes that luck out of the score: the workload fixes where the sizes
go over the run, and the search chooses everything else (which morphs, depth against width,
branches, hyperparameters) within the band. It is a FLOPs-constrained search, as in NAS under
a compute budget, with a budget that rises on a fixed timetable.

The band's centre grows geometrically with the run's progress ``p`` (master time over the
time budget), from the seed's FLOPs per image at ``p = 0`` to ``end`` at ``p = 1``; the band is
``centre / sqrt(width)`` to ``centre * sqrt(width)``, clipped to ``[start, end]``. Above the band
nothing is proposed; below it only when nothing in the band can be reached yet (the largest
reachable candidate is taken, so a lagging search catches up).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nas.errors import NasError

Progress = Callable[[], float]


@dataclass(frozen=True)
class SizeSchedule:
    """FLOPs-per-image band as a function of run progress (see the module docstring)."""

    start: float  # the seed's training FLOPs per image
    end: float  # the centre at the end of the run
    width: float  # band's high over its low (>= 1)

    def __post_init__(self) -> None:
        for name in ("start", "end", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise NasError(f"size schedule: {name} must be a finite number, got {value!r}")
        if self.start <= 0 or self.end < self.start:
            raise NasError(f"size schedule: need 0 < start <= end, got start={self.start:.4g}, end={self.end:.4g}")
        if self.width < 1:
            raise NasError(f"size schedule: width must be >= 1, got {self.width:.4g}")

    def centre(self, progress: float) -> float:
        p = min(max(float(progress), 0.0), 1.0)
        return self.start * (self.end / self.start) ** p

    def band(self, progress: float) -> tuple[float, float]:
        """(low, high) training FLOPs per image at ``progress`` (0 = run start, 1 = time budget)."""
        centre, half = self.centre(progress), math.sqrt(self.width)
        return max(self.start, centre / half), min(self.end, centre * half)

    def shortfall(self, flops: float, progress: float) -> float:
        """How far below the band ``flops`` is, as ``ln(low / flops)``; 0 inside or above it."""
        low, _ = self.band(progress)
        return max(0.0, math.log(low / flops)) if flops > 0 else math.inf

    def ceiling(self, progress: float) -> float:
        """The most training FLOPs per image admitted at ``progress``: the band's top (a rounding's worth above)."""
        return self.band(progress)[1] * (1 + 1e-9)

    def admits(self, flops: float, progress: float) -> bool:
        """Not above the band (the hard side: growth morphs cannot shrink a network back)."""
        return flops <= self.ceiling(progress)
