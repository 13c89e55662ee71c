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
