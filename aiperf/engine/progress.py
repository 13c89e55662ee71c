"""The live progress line: elapsed time, trials done and running, best accuracy, current OPS.

Kept incrementally (running sums), so printing it costs nothing however long the run is.
On a terminal the line redraws in place; otherwise one line is printed per interval.

It prints through an :class:`~aiperf.engine.output.Output`, so a closed, broken or stalled
stdout can neither stop nor slow the run, and a note quoting a worker's error or a file name
stays on one line of its own (:func:`~aiperf.ledger.inert.inert`).
"""

from __future__ import annotations

import sys
from typing import TextIO

from aiperf.engine.output import Output, output
from aiperf.families import family_for
from aiperf.ledger.inert import inert
from aiperf.metrics.score import format_ops

WORKER_NOTES = 16  # up to this many planned workers, each one's start is a line of its own


def format_elapsed(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


class Progress:
    """Accumulates what the master reports and prints a status line every ``interval_s``."""

    def __init__(
        self,
        interval_s: float,
        budget_s: float,
        stream: TextIO | Output | None = None,
        family: str = "image",
        workers: int = 0,
    ) -> None:
        self.interval_s = interval_s
        self.family = family_for(family)  # how its quality shows (accuracy, or bits per byte: docs/llm.md)
        self.budget_s = budget_s
        self.stream = output(stream if stream is not None else sys.stdout)
        self.tty = self.stream.isatty()
        self.ops = 0.0
        self.last_epoch_t = 0.0
        self.best: float | None = None
        self.epochs = 0
        self.done = 0
        self.failed = 0
        self.workers = workers  # planned workers: the line counts them ready while they start (0: not shown)
        self.ready = 0
        self._last_print = -1e9

    def epoch(self, ops: float, val_acc: float, t: float) -> None:
        self.ops += ops
        self.epochs += 1
        self.last_epoch_t = t
        self.best = val_acc if self.best is None else max(self.best, val_acc)

    def worker_ready(self, where: str, ready_s: float) -> None:  # ready_s: the run's clock
        """A worker finished starting (framework, dataset, matmul ceiling): said once per worker on small runs."""
        self.ready += 1
        if self.workers <= WORKER_NOTES:
            self.note(f"{where} ready at {ready_s:.1f} s ({self.ready} of {self.workers})")

    def trial_done(self) -> None:
        self.done += 1

    def trial_failed(self, trial: str, error: str) -> None:
        self.failed += 1
        self._emit(f"trial {inert(trial)} failed: {inert(error)}", newline=True)

    def note(self, text: str) -> None:
        """Something the person watching should know now (a worker that failed to start, skipped images)."""
        self._emit(inert(text), newline=True)

    def line(self, t: float, running: int, queued: int = 0) -> str:
        ops = self.ops / self.last_epoch_t if self.last_epoch_t > 0 else 0.0
        best = self.family.best_text(self.best)
        return (
            f"[{format_elapsed(t)} / {format_elapsed(self.budget_s)}] trials {self.done} done, {running} running"
            f"{f', {queued} queued' if queued else ''}"
            f"{f', {self.failed} failed' if self.failed else ''} | epochs {self.epochs} | best {best}"
            f" | {format_ops(ops)}"
            + (
                f" | workers {self.ready}/{self.workers} ready (starting: Ray, framework, dataset, matmul ceiling)"
                if self.workers > 0 and self.ready < self.workers
                else ""
            )
        )

    def maybe_print(self, t: float, running: int, queued: int = 0) -> None:
        if t - self._last_print >= self.interval_s:
            self._last_print = t
            self._emit(self.line(t, running, queued))

    def _emit(self, text: str, newline: bool = False) -> None:
        if self.tty and not newline:
            self.stream.redraw(text)
        else:
            self.stream.write(("\n" if self.tty else "") + text + "\n")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
