"""``aiperf run --must-end-by T``: a run that cannot end before its batch job does is refused before it starts.

A job that reaches its time limit is signalled and killed: the run ends interrupted, invalid, and
resuming it counts the queue wait as run time. So a launcher passes the job's end (less its own
teardown), and a run whose budget and stop do not fit is refused at once, with the numbers,
instead of being cut short hours later. Nothing is shortened silently.
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

from aiperf.engine.master import BUDGET_GRACE_S
from aiperf.errors import AiperfError

# After its budget a run needs its stop (run_stop within BUDGET_GRACE_S), then its summary, report and
# exit: 40 s more covers them for a run of thousands of trials (benchmarks/RESULTS.md has the timings).
STOP_MARGIN_S = BUDGET_GRACE_S + 40.0


def _clock(unix_time: float) -> str:
    return datetime.datetime.fromtimestamp(unix_time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_fits(deadline: float, budget_s: float, *, runs: int = 1, elapsed_s: float = 0.0, now: float) -> None:
    """Raise :class:`AiperfError` unless ``runs`` runs of ``budget_s`` (less ``elapsed_s`` already run) end by
    ``deadline``; each run stops within :data:`STOP_MARGIN_S` after its budget."""
    left_per_run = max(0.0, budget_s - elapsed_s)
    need = runs * (left_per_run + STOP_MARGIN_S)
    if now + need <= deadline:
        return
    what = f"{runs} runs x " if runs > 1 else ""
    left = deadline - now
    fits = int(left / runs - STOP_MARGIN_S + elapsed_s) if left > runs * STOP_MARGIN_S else 0
    advice = f"lower run.time_budget_s to at most {fits}" if fits > 0 else "the job has no time left for a run"
    raise AiperfError(
        f"--must-end-by {_clock(deadline)} is {max(0, int(left))} s away, but the run needs {int(need)} s"
        f" ({what}{left_per_run:g} s of budget + {STOP_MARGIN_S:g} s to stop and write its results): {advice},"
        " or give the job more time"
    )


def _resumed_budget(run_dir: Path) -> tuple[float, float] | None:
    """(budget, seconds since its run_start) of the run to resume; None when its ledger cannot tell (the resume
    itself then names what is wrong)."""
    from aiperf.ledger.schema import RunStartRecord, parse_record
    from aiperf.ledger.store import LEDGER_NAME, LedgerStream

    try:
        for _, raw in LedgerStream(run_dir):
            record = parse_record(raw, 0, run_dir / LEDGER_NAME)
            budget = record.config.run.time_budget_s if isinstance(record, RunStartRecord) else None
            return (float(budget), time.time() - record.wall) if budget is not None else None
    except (AiperfError, OSError, ValueError):
        return None
    return None


def check_must_end_by(args: argparse.Namespace, deadline: float) -> None:
    """The ``--must-end-by`` check for ``aiperf run``'s arguments (a new run, ``--repeat N`` or ``--resume``)."""
    now = time.time()
    if args.resume:
        recorded = _resumed_budget(Path(args.resume))
        if recorded is not None:
            budget, elapsed = recorded
            check_fits(deadline, budget, elapsed_s=elapsed, now=now)
        return
    from aiperf.config import load_config

    cfg = load_config(args.config, args.overrides)
    check_fits(deadline, cfg.run.time_budget_s, runs=args.repeat or 1, now=now)
