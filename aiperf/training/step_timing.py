"""What a trial's first steps cost beyond ordinary ones: the compile share every family's trainer reports."""

from __future__ import annotations


def compile_overhead(first_step_s: float, epoch_s: float, steps: int) -> float:
    """What the first step cost beyond an ordinary step of its epoch: the tracing/compilation alone.

    The first step also trains a counted batch; charging all of it to compilation would call
    real training work overhead (a large batch's step on a CPU core is no small part of it:
    benchmarks/RESULTS.md). With a single step there is nothing to compare with, and the
    whole first step is charged.
    """
    if steps < 2:
        return first_step_s
    ordinary = max(0.0, epoch_s - first_step_s) / (steps - 1)
    return max(0.0, first_step_s - ordinary)


def eval_compile_overhead(eval_s: list[float]) -> float:
    """What the first evaluation cost beyond the trial's later ones (tracing the predict step); 0 with one."""
    if len(eval_s) < 2:
        return 0.0
    return max(0.0, eval_s[0] - min(eval_s[1:]))


class CompileShares:
    """The compile time each epoch of a trial discloses, so an epoch record carries its own share.

    The first epoch discloses its first step's excess (:func:`compile_overhead`); the first
    evaluation's excess (:func:`eval_compile_overhead`) can only be told once a later evaluation
    is timed, so each later epoch discloses what the first evaluation cost beyond the fastest
    one since, less what was disclosed before. The shares add up to the trial's ``compile_s``;
    an epoch stopped by the run's end discloses nothing, and a single-epoch trial's first
    evaluation stays in its step time (it cannot be told apart).
    """

    def __init__(self) -> None:
        self.train_s: float | None = None  # the first step's excess, once measured
        self.evals: list[float] = []
        self._eval_disclosed = 0.0

    def epoch(self, first_step_excess: float | None, eval_s: float) -> float:
        """This epoch's share: ``first_step_excess`` (measured in it, else None) and the evaluations' new excess."""
        share = 0.0
        if self.train_s is None and first_step_excess is not None:
            self.train_s = first_step_excess
            share += first_step_excess
        self.evals.append(eval_s)
        eval_excess = eval_compile_overhead(self.evals)
        share += eval_excess - self._eval_disclosed
        self._eval_disclosed = eval_excess
        return share

    def total(self) -> float | None:
        """The trial's compile_s (None while no first step was measured)."""
        return None if self.train_s is None else self.train_s + eval_compile_overhead(self.evals)
