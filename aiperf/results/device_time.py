"""Where a device's time went: steady steps, compilation on the critical path, input, hand-overs, idling.

A benchmark that ranks accelerators must show that it measured the accelerator, not its own
compiler and Python: the score divides counted operations by the whole run's wall time, so
every second a device spent waiting for a step to be built, for input or for its next trial
lowers it. This section splits each training slot's share of the run, from the ledger alone:

* ``steady_s``: train and evaluation steps of the counted epochs, less what they spent
  compiling and waiting for input -- the device doing counted work at its steady pace;
* ``compile_critical_s``: compilation the device waited for -- the first step's and first
  evaluation's excess over ordinary ones (each epoch record's ``compile_s``) and, where steps
  were compiled ahead, the wait for one still compiling (``compile_wait_s``);
* ``data_wait_s``: steps waiting for their input batch;
* ``between_trials_s``: a worker's gap between one trial's last step and the next one's first
  (building the model, weights, Ray's hand-over), less the compile wait in it;
* ``idle_s``: the rest of the workers' lives -- waiting for a trial, and epochs the run's end
  cut short (their work is not counted);
* ``starting_s``: slot time before its worker was ready (process, framework, dataset, ceiling)
  or after it closed: the planned slots times the score's wall time, less the workers' lives.

The steady device rate is the counted operations over the steady seconds, and the engine's
efficiency ``efficiency.engine`` = OPS / (slots x steady device rate) = steady_s / (slots x
wall_s): the share of the run in which the devices did counted work at the pace they showed
they can. ``workers.compile_critical_fraction`` is compile on the critical path over the
workers' lives. Ledgers whose epochs carry no ``compile_s`` (written before 2026-12-07, or by
the simulator) have no such section; their summaries keep the keys they were published with.
"""

from __future__ import annotations

from typing import TypedDict

from aiperf.ledger.schema import EpochRecord
from aiperf.metrics.score import format_ops


class WorkerTime(TypedDict):
    """One worker's steady and critical-path compile seconds (the summary's ``workers.per_worker`` adds them)."""

    steady_s: float
    compile_critical_s: float


class DeviceTimeSummary(TypedDict):
    """The summary's ``device_time`` section (see the module docstring); fractions are of ``slot_s``."""

    slots: int
    wall_s: float
    slot_s: float
    worker_s: float
    steady_s: float
    compile_critical_s: float
    compile_in_steps_s: float
    compile_wait_s: float
    data_wait_s: float
    between_trials_s: float
    idle_s: float
    starting_s: float
    steady_rate_ops_per_s: float | None
    fractions: dict[str, float | None]


class _Sums:
    __slots__ = ("between", "compile", "data_wait", "ops", "steps", "wait")

    def __init__(self) -> None:
        self.steps = self.compile = self.data_wait = self.between = self.wait = self.ops = 0.0

    def steady(self) -> float:
        return max(0.0, self.steps - self.compile - self.data_wait)


class DeviceTime:
    """The epochs' and workers' times, kept per worker one record at a time (see the module docstring)."""

    def __init__(self) -> None:
        self.per_worker: dict[str, _Sums] = {}
        self.measured = False  # some epoch carries compile_s: a worker of this version measured it

    def add_epoch(self, rec: EpochRecord) -> None:
        sums = self.per_worker.get(rec.worker or "?")
        if sums is None:
            sums = self.per_worker[rec.worker or "?"] = _Sums()
        sums.steps += float(rec.train_s or 0.0) + float(rec.eval_s or 0.0)
        sums.data_wait += float(rec.data_wait_s or 0.0)
        sums.ops += float(rec.ops or 0.0)
        if rec.compile_s is not None:
            self.measured = True
            sums.compile += float(rec.compile_s)
        if rec.idle_before_s is not None:
            sums.between += max(0.0, float(rec.idle_before_s))
        sums.wait += float(rec.compile_wait_s or 0.0)

    def worker(self, name: str) -> WorkerTime | None:
        """What the summary adds to a worker's entry (None before this section existed)."""
        sums = self.per_worker.get(name)
        if not self.measured:
            return None
        if sums is None:
            return {"steady_s": 0.0, "compile_critical_s": 0.0}
        return {"steady_s": sums.steady(), "compile_critical_s": sums.compile + sums.wait}

    def summary(self, slots: int, wall_s: float, worker_s: float) -> DeviceTimeSummary | None:
        """The run's section over ``slots`` x ``wall_s``; ``worker_s``: the workers' lives (their last records)."""
        if not self.measured:
            return None
        all_sums = list(self.per_worker.values())
        steps = sum(s.steps for s in all_sums)
        compile_in_steps = sum(s.compile for s in all_sums)
        wait = sum(s.wait for s in all_sums)
        data_wait = sum(s.data_wait for s in all_sums)
        steady = sum(s.steady() for s in all_sums)
        ops = sum(s.ops for s in all_sums)
        between = max(0.0, sum(s.between for s in all_sums) - wait)
        slot_s = max(0, slots) * max(0.0, wall_s)
        idle = max(0.0, worker_s - steps - between - wait)
        starting = max(0.0, slot_s - worker_s)

        def share(seconds: float) -> float | None:
            return seconds / slot_s if slot_s > 0 else None

        return {
            "slots": slots,
            "wall_s": wall_s,
            "slot_s": slot_s,
            "worker_s": worker_s,
            "steady_s": steady,
            "compile_critical_s": compile_in_steps + wait,
            "compile_in_steps_s": compile_in_steps,
            "compile_wait_s": wait,
            "data_wait_s": data_wait,
            "between_trials_s": between,
            "idle_s": idle,
            "starting_s": starting,
            "steady_rate_ops_per_s": ops / steady if steady > 0 else None,
            "fractions": {
                "steady": share(steady),
                "compile_critical": share(compile_in_steps + wait),
                "data_wait": share(data_wait),
                "between_trials": share(between),
                "idle": share(idle),
                "starting": share(starting),
            },
        }


def engine_efficiency(section: DeviceTimeSummary | None) -> float | None:
    """OPS / (slots x steady device rate), which is the steady share of the slots' time (module docstring)."""
    if section is None:
        return None
    return section["fractions"]["steady"]


def compile_critical_fraction(section: DeviceTimeSummary | None) -> float | None:
    """Compile on the critical path over the workers' lives."""
    if section is None or section["worker_s"] <= 0:
        return None
    return section["compile_critical_s"] / section["worker_s"]


def format_device_time(section: DeviceTimeSummary | None) -> str | None:
    """One line for the printed summary, or None when the ledger does not tell."""
    if section is None or section["slot_s"] <= 0:
        return None
    f = section["fractions"]
    parts = [
        f"{100 * (f[name] or 0.0):.1f} % {label}"
        for name, label in (
            ("steady", "steady steps"),
            ("compile_critical", "compiling (critical path)"),
            ("data_wait", "waiting for input"),
            ("between_trials", "between trials"),
            ("idle", "idle"),
            ("starting", "starting"),
        )
    ]
    rate = section["steady_rate_ops_per_s"]
    tail = f"; steady device rate {format_ops(rate)} a slot" if rate else ""
    return f"{section['slots']} slot(s) x {section['wall_s']:.0f} s: " + ", ".join(parts) + tail
