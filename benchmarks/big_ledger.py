"""A ledger of millions of records, as a 12-hour run at 65,536 workers writes, and what its readers cost.

Writing ten million records with the real master takes days (the search costs ~20-27 ms per proposed
trial, benchmarks/RESULTS.md), so the ledger is made in two steps, each through the real code:

1. **A real simulated run** (``benchmarks/scale_sim.py``'s ``simulate``: the real master, search and
   ledger driving ``--seed-workers`` simulated workers for ``--seed-trials`` trials each). Its ledger is
   a run as aiperf writes it: trial starts with searched graphs and counted FLOPs, epochs, trial ends.
2. **Replay**: a new run directory whose ledger is written by the real ``LedgerWriter``, record by
   record: the seed's ``run_start``, then copies of the seed's trial records (``trial_start``,
   ``epoch``, ``trial_end``, ``requeue``, in the seed's order), each copy with fresh trial ids
   (``t00012-17`` in copy 17; ``parent`` and ``inherit`` renamed alike), its times shifted by one
   seed run length per copy, and its workers renamed so the run has ``--workers`` workers
   (``w00003-5``: the seed's worker w00003 in the 6th group of seed-sized worker sets). The last copy
   holds only the first trials of the seed, whole, to come close to ``--records``. Then one
   ``worker`` record per worker (its ``busy_s`` the sum of its epochs' step times, as ``aiperf
   verify`` recomputes it) and a completed ``run_stop``; then ``summary.json`` from the ledger.

Every record is one the writer appended (``LedgerWriter.append``: header, chain hash, one write per
line), in batches of ``--batch`` records sharing one fsync as the master's event batches do; so the
ledger verifies (``aiperf verify``) and its records per second and bytes per record are the
writer's. What the replay does not exercise is the search: the architectures repeat every copy
(verify's FLOP count caches them by content, so its FLOP recount is cheaper than for ten million
records of distinct trials would be).

    PYTHONPATH=. python benchmarks/big_ledger.py --records 1000000 --out /tmp/big1m
    /usr/bin/time -v aiperf verify /tmp/big1m
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aiperf.ledger.schema import (
    EpochRecord,
    Record,
    RequeueRecord,
    RunStartRecord,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    WorkerRecord,
)
from aiperf.ledger.store import LEDGER_NAME, LedgerWriter, read_ledger
from aiperf.results.summary import write_summary

TRIAL_TYPES = (TrialStartRecord, EpochRecord, TrialEndRecord, RequeueRecord)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seed_run(directory: Path, workers: int, trials_per_worker: float, epochs: int, seed: int) -> float:
    """Step 1: a real simulated run into ``directory``; returns its wall seconds."""
    from scale_sim import simulate

    began = time.perf_counter()
    simulate(
        workers=workers,
        trial_s=600.0,
        epochs=epochs,
        trials_per_worker=trials_per_worker,
        seed=seed,
        ledger_dir=directory,
    )
    return time.perf_counter() - began


class Replay:
    """Step 2: the seed's trial records, copied with fresh ids, through one ``LedgerWriter``."""

    def __init__(self, seed_records: list[Record], workers: int) -> None:
        start = seed_records[0]
        assert isinstance(start, RunStartRecord)
        self.start = start
        self.body = [r for r in seed_records if isinstance(r, TRIAL_TYPES)]
        self.template_worker = next(r for r in seed_records if isinstance(r, WorkerRecord))
        self.template_stop = next(r for r in reversed(seed_records) if isinstance(r, RunStopRecord))
        self.span = max(float(r.t) for r in self.body) + 1.0  # one seed run: copies follow one another
        seed_workers = sorted({r.worker for r in self.body if isinstance(r, EpochRecord) and r.worker})
        self.groups = max(1, workers // max(1, len(seed_workers)))
        # Each body record's trial, by the order in which the seed started them (the last copy is cut by it).
        order: dict[str, int] = {}
        for r in self.body:
            if isinstance(r, TrialStartRecord):
                order.setdefault(r.trial, len(order))
        self.trial_index = [order.get(getattr(r, "trial", ""), 0) for r in self.body]
        self.trials = len(order)
        self.busy: dict[str, float] = {}  # worker -> its epochs' train_s + eval_s, summed as verify sums them
        self.node_of: dict[str, str | None] = {}

    def copy(self, number: int, trials: int | None = None) -> Any:
        """The records of copy ``number`` (of its first ``trials`` trials only, when given)."""
        shift = number * self.span
        group = number % self.groups
        for index, rec in zip(self.trial_index, self.body, strict=True):
            if trials is not None and index >= trials:
                continue
            update: dict[str, Any] = {"t": round(float(rec.t) + shift, 6)}
            trial = getattr(rec, "trial", None)
            if number and trial:
                update["trial"] = f"{trial}-{number}"
            worker = getattr(rec, "worker", None)
            if worker:
                update["worker"] = f"{worker}-{group}"
            if isinstance(rec, TrialStartRecord) and number:
                for name in ("parent", "inherit"):
                    if getattr(rec, name) and name in rec.model_fields_set:
                        update[name] = f"{getattr(rec, name)}-{number}"
            new = rec.model_copy(update=update)
            if isinstance(new, EpochRecord):
                key = new.worker or ""
                self.busy[key] = self.busy.get(key, 0.0) + float(new.train_s or 0.0) + float(new.eval_s or 0.0)
                self.node_of[key] = new.node
            yield new

    def worker_records(self, end_t: float) -> Any:
        for worker, busy in self.busy.items():
            yield self.template_worker.model_copy(
                update={
                    "t": end_t,
                    "worker": worker,
                    "node": self.node_of.get(worker),
                    "busy_s": busy,
                    "alive_s": end_t,
                    "compile_s": 0.0,
                    "busy_fraction": busy / end_t,
                    "steady_busy_fraction": busy / end_t,
                }
            )


def write_big_ledger(seed_dir: Path, out: Path, records: int, workers: int, batch: int) -> dict[str, Any]:
    """Replay the seed run's ledger into ``out`` until it holds about ``records`` records; returns the figures."""
    seed_records = read_ledger(seed_dir)
    replay = Replay(seed_records, workers)
    per_copy = len(replay.body)
    seed_workers = len({r.worker for r in replay.body if isinstance(r, EpochRecord)})
    copies_guess = max(1, (records - 1) // per_copy)
    tail = min(workers, seed_workers * min(replay.groups, copies_guess + 1)) + 1  # worker records and run_stop
    room = max(per_copy // max(1, replay.trials), records - 1 - tail)
    full, rest = divmod(room, per_copy)
    part = round(replay.trials * rest / per_copy)
    out.mkdir(parents=True, exist_ok=True)
    if (out / LEDGER_NAME).exists():
        raise SystemExit(f"{out / LEDGER_NAME} exists: choose an empty --out")
    written = 0
    began = time.perf_counter()
    cpu0 = time.process_time()
    with LedgerWriter(out) as ledger:
        system = replay.start.system.model_copy(update={"workers": workers})
        header = replay.start.model_copy(update={"t": 0.0, "run_id": f"big-ledger-{records}", "system": system})
        ledger.append(header)
        written += 1
        pending = 0
        copies = [(c, None) for c in range(full)] + ([(full, part)] if part else [])
        last_t = 0.0
        ledger_batch = ledger.batch()
        ledger_batch.__enter__()
        try:
            for number, trials in copies:
                for rec in replay.copy(number, trials):
                    ledger.append(rec)
                    last_t = rec.t
                    written += 1
                    pending += 1
                    if pending >= batch:  # the batch's one fsync, then the next batch
                        ledger_batch.__exit__(None, None, None)
                        ledger_batch = ledger.batch()
                        ledger_batch.__enter__()
                        pending = 0
                if number % 10 == 0:
                    rate = written / (time.perf_counter() - began)
                    print(
                        f"  copy {number + 1}/{len(copies)}: {written:,} records, {rate:,.0f}/s, "
                        f"peak RSS {_peak_rss_mib():,.0f} MiB",
                        file=sys.stderr,
                    )
            end_t = round(float(last_t) + 1.0, 6)
            for rec in replay.worker_records(end_t):
                ledger.append(rec)
                written += 1
            ledger.append(replay.template_stop.model_copy(update={"t": end_t}))
            written += 1
        finally:
            ledger_batch.__exit__(None, None, None)
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu0
    size = (out / LEDGER_NAME).stat().st_size
    write_peak = _peak_rss_mib()
    s0 = time.perf_counter()
    write_summary(out)
    summary_s = time.perf_counter() - s0
    return {
        "records": written,
        "bytes": size,
        "bytes_per_record": size / written,
        "write_s": wall,
        "write_cpu_s": cpu,
        "records_per_s": written / wall,
        "batch": batch,
        "copies": len(copies),
        "seed_records": len(seed_records),
        "seed_trial_records": per_copy,
        "workers": len(replay.busy),
        "summary_s": summary_s,
        "write_peak_rss_mib": write_peak,
        "peak_rss_mib": _peak_rss_mib(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="about how many records to write")
    parser.add_argument("--out", type=Path, required=True, help="the run directory to create")
    parser.add_argument("--workers", type=int, default=65_536, help="workers the replayed run has")
    parser.add_argument("--seed-workers", type=int, default=1024, help="simulated workers of the real seed run")
    parser.add_argument("--seed-trials", type=float, default=3.0, help="trials per worker in the seed run")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per trial")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seed-dir", type=Path, help="reuse this seed run (default: OUT.seed, made if absent)")
    parser.add_argument("--batch", type=int, default=256, help="records per fsync (the master's event batch)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    seed_dir = args.seed_dir or args.out.with_name(args.out.name + ".seed")
    figures: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg()}
    if not (seed_dir / LEDGER_NAME).exists():
        figures["seed_run_s"] = seed_run(seed_dir, args.seed_workers, args.seed_trials, args.epochs, args.seed)
    figures.update(write_big_ledger(seed_dir, args.out, args.records, args.workers, args.batch))
    print(
        f"{figures['records']:,} records, {figures['bytes'] / 2**30:.2f} GiB "
        f"({figures['bytes_per_record']:.0f} B/record)"
        f" in {figures['write_s']:.0f} s: {figures['records_per_s']:,.0f} records/s with one fsync per "
        f"{args.batch} records ({figures['write_cpu_s']:.0f} s CPU); {figures['workers']:,} workers; "
        f"summary.json in {figures['summary_s']:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
