"""The run summary: computed from the ledger alone, written atomically, printed for people.

Because the summary is a pure function of the ledger, ``aiperf verify`` can recompute it
and compare, and a run that was killed still gets a correct summary afterwards. The one
additions from outside the ledger are the ``telemetry`` section (utilisation) and the
``energy`` section (energy, OPS per watt and its methodology level, :mod:`aiperf.record.energy`),
computed from ``telemetry.jsonl`` when the run recorded one; they never enter the score,
but telemetry can add notes to the verdict (a machine shared with other work, see
:func:`aiperf.record.telemetry.shared_machine_notes`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from aiperf.errors import AiperfError, os_error
from aiperf.metrics.rules import evaluate_rules
from aiperf.metrics.score import compute_score, format_ops
from aiperf.metrics.steadiness import steadiness
from aiperf.record.efficiency import efficiency_summary, format_efficiency
from aiperf.record.energy import EnergySummary, format_energy, not_measured, summarize_energy
from aiperf.record.files import write_atomic
from aiperf.record.inert import inert, inert_tree
from aiperf.record.ledger import LEDGER_NAME, read_ledger
from aiperf.record.schema import (
    BadImagesRecord,
    EpochRecord,
    Record,
    RunStartRecord,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    WorkerFailedRecord,
    WorkerRecord,
    of_type,
)
from aiperf.record.telemetry import TelemetrySummary, read_telemetry, shared_machine_notes, summarize_telemetry

SUMMARY_NAME = "summary.json"
STARVED_FRACTION = 0.10  # a worker waiting longer than this share of its step time for input is starved


class WorkerLife(TypedDict):
    """One worker's life as its last ``worker`` record states it."""

    node: str | None
    busy_fraction: float | None
    busy_s: float | None
    compile_s: float | None
    alive_s: float | None
    idle_gap_mean_s: float | None


class WorkersSummary(TypedDict):
    """The summary's ``workers`` section."""

    count: int
    busy_fraction_mean: float | None
    busy_fraction_min: float | None
    steady_busy_fraction_mean: float | None
    idle_gap_mean_s: float | None
    trials_step_reused: int
    trials_step_known: int
    per_worker: dict[str, WorkerLife]


class InputSummary(TypedDict):
    """The summary's ``input`` section: how long the training loops waited for input."""

    storage: str
    epochs_measured: int
    data_wait_s: float
    train_s: float
    wait_fraction: float | None
    per_worker_wait_fraction: dict[str, float | None]
    starved_workers: list[str]
    starved_threshold: float
    decode_threads: list[int]


class BadImagesSummary(TypedDict):
    """The summary's ``bad_images`` section: images skipped because they could not be decoded."""

    count: int
    fraction: float | None
    files: list[str]  # the first 20
    max_fraction: float | None
    missing: int  # of count: files deleted since the run began (the rest could not be decoded)


class StartFailure(TypedDict):
    worker: str
    hostname: str | None
    node: str | None
    cause: str


class StartFailures(TypedDict):
    """The summary's ``worker_start_failures`` section."""

    count: int
    first: StartFailure | None


class DeviceSummary(TypedDict):
    """The summary's ``devices`` section."""

    nodes: int
    cpus: float
    gpus: float
    accelerators: list[str]
    concurrency: int | None
    placement: str | None
    workers_by_device: dict[str, int]  # "kind: name" -> workers


def _worker_summary(records: list[Record]) -> WorkersSummary:
    workers = of_type(records, WorkerRecord)
    ends = [r for r in of_type(records, TrialEndRecord) if r.step_reused is not None]
    fractions = [w.busy_fraction for w in workers if w.busy_fraction is not None]
    steady = [w.steady_busy_fraction for w in workers if w.steady_busy_fraction is not None]
    gaps = [w.idle_gaps.mean_s for w in workers if w.idle_gaps.mean_s is not None]
    return {
        "count": len(workers),
        "busy_fraction_mean": sum(fractions) / len(fractions) if fractions else None,
        "busy_fraction_min": min(fractions) if fractions else None,
        # Busy time less each completed trial's compile_s (its first step and evaluation beyond ordinary ones).
        "steady_busy_fraction_mean": sum(steady) / len(steady) if steady else None,
        "idle_gap_mean_s": sum(gaps) / len(gaps) if gaps else None,
        # Completed trials whose worker reused a model it had compiled (no tracing, no compiling).
        "trials_step_reused": sum(1 for r in ends if r.step_reused),
        "trials_step_known": len(ends),
        "per_worker": {
            w.worker: {
                "node": w.node,
                "busy_fraction": w.busy_fraction,
                "busy_s": w.busy_s,
                "compile_s": w.compile_s,
                "alive_s": w.alive_s,
                "idle_gap_mean_s": w.idle_gaps.mean_s,
            }
            for w in workers
        },
    }


def _storage(start: RunStartRecord) -> str:
    """How the images were held: ``storage`` where the header says, else from ``streaming`` (older headers)."""
    dataset = start.dataset
    return dataset.storage or ("stream" if dataset.streaming else "memory")


def _input_summary(start: RunStartRecord, records: list[Record]) -> InputSummary:
    """How long the training loops waited for input, overall and per worker (from the epoch records)."""
    measured = [r for r in of_type(records, EpochRecord) if r.data_wait_s is not None]
    per_worker: dict[str, list[float]] = {}
    for r in measured:
        wait_train = per_worker.setdefault(r.worker or "?", [0.0, 0.0])
        wait_train[0] += r.data_wait_s or 0.0  # not None: filtered above
        wait_train[1] += r.train_s or 0.0  # optional in the record's shape
    wait = sum(w for w, _ in per_worker.values())
    train = sum(t for _, t in per_worker.values())
    fractions = {w: (wt[0] / wt[1] if wt[1] > 0 else None) for w, wt in per_worker.items()}
    threads = sorted({w.decode_threads for w in of_type(records, WorkerRecord) if w.decode_threads})
    return {
        "storage": _storage(start),
        "epochs_measured": len(measured),
        "data_wait_s": wait,
        "train_s": train,
        "wait_fraction": wait / train if train > 0 else None,
        "per_worker_wait_fraction": fractions,
        "starved_workers": sorted(w for w, f in fractions.items() if f is not None and f > STARVED_FRACTION),
        "starved_threshold": STARVED_FRACTION,
        "decode_threads": threads,
    }


def _bad_images_summary(start: RunStartRecord, records: list[Record]) -> BadImagesSummary:
    """Images skipped because they could not be decoded: at load time (in memory) and on the workers."""
    dataset = start.dataset
    at_load_count = dataset.bad_images.count if dataset.bad_images is not None else 0
    at_load_files = dataset.bad_images.files if dataset.bad_images is not None else []
    missing = dataset.bad_images.missing_count if dataset.bad_images is not None else 0
    streamed: list[str] = []
    for r in of_type(records, BadImagesRecord):
        streamed.extend(f for f in r.files if f not in streamed)
        missing += len(r.missing)
    count = at_load_count + len(streamed)
    total = (dataset.train_images or 0) + (dataset.eval_images or 0) + at_load_count
    return {
        "count": count,
        "fraction": count / total if total else None,
        "files": (list(at_load_files) + streamed)[:20],
        "max_fraction": start.config.dataset.max_bad_fraction,
        "missing": missing,
    }


def _start_failures(records: list[Record]) -> StartFailures:
    failed = of_type(records, WorkerFailedRecord)
    first = failed[0] if failed else None
    return {
        "count": len(failed),
        "first": (
            {"worker": first.worker, "hostname": first.hostname, "node": first.node, "cause": first.cause}
            if first is not None
            else None
        ),
    }


def _device_summary(start: RunStartRecord, records: list[Record]) -> DeviceSummary:
    plan = start.plan
    devices: dict[str, int] = {}
    for w in of_type(records, WorkerRecord):
        key = f"{w.device.get('kind', '?')}: {w.device.get('name', '?')}"  # device: as the worker reported it
        devices[key] = devices.get(key, 0) + 1
    return {
        "nodes": len(plan.nodes),
        "cpus": sum(n.cpus for n in plan.nodes),
        "gpus": sum(n.gpus for n in plan.nodes),
        "accelerators": sorted({n.accelerator for n in plan.nodes if n.accelerator}),
        "concurrency": plan.concurrency,
        "placement": plan.placement,
        "workers_by_device": devices,
    }


def _header(records: list[Record], source: object) -> RunStartRecord:
    """The ``run_start`` record a ledger begins with (``read_ledger`` refuses any other ledger)."""
    if not records:
        raise AiperfError(f"{source}: the ledger has no complete record")
    start = records[0]
    if not isinstance(start, RunStartRecord):
        raise AiperfError(f"{source}: the ledger does not begin with a run_start record")
    return start


def summarize(records: list[Record], source: object = "the ledger") -> dict[str, Any]:
    """Everything the run claims, derived from its ledger records (as ``read_ledger`` returns them)."""
    start = _header(records, source)
    score = compute_score(records)
    verdict = evaluate_rules(records, score)
    ends = of_type(records, TrialEndRecord)
    starts = of_type(records, TrialStartRecord)
    epochs = of_type(records, EpochRecord)
    stops = of_type(records, RunStopRecord)
    statuses: dict[str, int] = {}
    for r in ends:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    best = max(epochs, key=lambda r: (r.val_acc, -r.seq), default=None)
    best_trial = None
    if best is not None:
        ts = next((r for r in starts if r.trial == best.trial), None)
        if ts is None:
            raise AiperfError(f"the ledger's best epoch (seq {best.seq}) belongs to a trial that never started")
        best_trial = {
            "trial": best.trial,
            "epoch": best.epoch,
            "val_acc": best.val_acc,
            "arch_id": ts.arch_id,
            "params": ts.params,
            "kind": ts.kind,
            "lineage": ts.lineage,
            "flops_train_per_image": ts.flops.train_per_image,
        }
    precisions = sorted({r.precision for r in epochs})
    dataset, plan = start.dataset, start.plan
    return {
        "run_id": start.run_id,
        "name": start.config.run.name,
        "status": stops[-1].status.value if stops else "running or killed",
        "stop_reason": stops[-1].reason if stops else "no run_stop record: the master was killed",
        "dataset": {
            "name": dataset.name,
            "train_images": dataset.train_images,
            "eval_images": dataset.eval_images,
            "input_shape": dataset.input_shape,
            "num_classes": dataset.num_classes,
            "fingerprint": dataset.fingerprint,
        },
        "backend": plan.backend,
        "precision": precisions,
        "devices": _device_summary(start, records),
        "score": {
            **score.to_dict(),
            "ops_human": format_ops(score.ops_per_s),
            "regulated_human": format_ops(score.regulated),
            "aiperf_regulated_human": format_ops(score.aiperf_regulated),
        },
        "steadiness": steady.to_dict() if (steady := steadiness(records)) is not None else None,
        "efficiency": efficiency_summary(records, score.ops_per_s, score.wall_s),
        "verdict": {**verdict.to_dict(), "headline": verdict.headline()},
        "trials": {
            "started": len({r.trial for r in starts}),
            "by_status": statuses,
            "distinct_architectures": len({r.arch_id for r in starts}),
            "epochs_counted": len(epochs),
        },
        "best": best_trial,
        "workers": _worker_summary(records),
        "input": _input_summary(start, records),
        "bad_images": _bad_images_summary(start, records),
        "worker_start_failures": _start_failures(records),
        "ledger": {"records": len(records), "last_hash": records[-1].hash},
    }


def build_summary(run_dir: str | Path, records: list[Record] | None = None) -> dict[str, Any]:
    """The summary of ``run_dir``: :func:`summarize` of its ledger plus its telemetry, if it has any."""
    run_dir = Path(run_dir)
    records = read_ledger(run_dir) if records is None else records
    summary = summarize(records, run_dir / LEDGER_NAME)
    samples = read_telemetry(run_dir)
    if samples:
        interval = _header(records, run_dir / LEDGER_NAME).config.run.telemetry_interval_s
        summary["telemetry"] = summarize_telemetry(samples, interval)
        notes = shared_machine_notes(summary["telemetry"])
        if notes:  # additive: the rules' verdict stands; the notes say what it was measured beside
            verdict = summary["verdict"]
            verdict["notes"] = notes
            verdict["headline"] = f"{verdict['headline']}; {'; '.join(notes)}"
    summary["energy"] = energy_section(summary, samples, records, run_dir / LEDGER_NAME)
    return summary


def energy_section(
    summary: dict[str, Any], samples: list[dict[str, Any]], records: list[Record], source: object
) -> EnergySummary:
    """The ``energy`` section: the run's OPS per watt with its sources and methodology level, or why there is none."""
    if not samples:
        return not_measured("no telemetry recorded")
    start = _header(records, source)
    nodes = start.plan.nodes
    hosts = len({n.hostname for n in nodes}) if all(n.hostname for n in nodes) else len(nodes)
    score = summary["score"]
    return summarize_energy(
        samples,
        ops_per_s=score["ops_per_s"],
        wall_s=score["wall_s"],
        run_hosts=hosts,
        interval_s=start.config.run.telemetry_interval_s,
        run_start_wall=start.wall,
    )


def save_summary(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically; a write that fails is an :class:`AiperfError` (exit 1) naming it."""
    path = Path(run_dir) / SUMMARY_NAME
    try:
        write_atomic(path, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    except OSError as exc:
        raise os_error(exc, path, "write", exit_code=1) from None
    return path


def write_summary(run_dir: str | Path) -> dict[str, Any]:
    """Recompute the summary from ``run_dir``'s ledger and write ``summary.json`` atomically."""
    summary = build_summary(run_dir)
    save_summary(run_dir, summary)
    return summary


def format_summary(summary: dict[str, Any], run_dir: str | Path) -> str:
    """The result block printed at the end of a run.

    Every string in it is made inert first: a run id, host name or reason read from a ledger
    cannot print a line of its own, move the cursor or reorder the line.
    """
    summary = inert_tree(summary)
    s, v = summary["score"], summary["verdict"]
    acc = s.get("best_val_acc")
    best = summary.get("best") or {}
    devices = summary["devices"]
    where = ", ".join(f"{n} x {k}" for k, n in devices["workers_by_device"].items()) or "no workers recorded"
    lines = [
        f"aiperf result: run {summary['run_id']} ({summary['name']}), {summary['status']}",
        f"  score (OPS)          {s['ops_human']}  = {format_ops(s['total_ops'], 'OP')} counted"
        f" over {s['wall_s']:.1f} s",
        f"  regulated score      {s['regulated_human']}  = OPS x |ln(1 - {acc if acc is not None else 0:.4f})|",
        f"  AIPerf-compatible    {s['aiperf_regulated_human']}  (regulated, AIPerf's FLOP conventions)",
        f"  steadiness           {format_steadiness(summary.get('steadiness'))}",
        f"  best val accuracy    {acc:.4f} (trial {best.get('trial')}, {best.get('params', 0):,} params)"
        if acc is not None
        else "  best val accuracy    - (no epoch completed)",
        f"  trials               {summary['trials']['started']} started, {summary['trials']['by_status']},"
        f" {summary['trials']['distinct_architectures']} distinct architectures, "
        f"{summary['trials']['epochs_counted']} epochs counted",
        f"  devices              {devices['concurrency']} concurrent trials on {devices['nodes']} node(s): {where};"
        f" backend {summary['backend']}, precision {', '.join(summary['precision']) or '-'}",
        f"  efficiency           {format_efficiency(summary.get('efficiency'))}",
        f"  verdict              {v['headline']}",
    ]
    if summary["status"] == "failed":
        lines.insert(1, f"  failed because       {summary.get('stop_reason')}")
    workers = summary["workers"]  # summarize always writes it, as the sections below
    if workers.get("busy_fraction_mean") is not None:
        lines.insert(-1, f"  workers              {format_workers(workers)}")
    failures = summary.get("worker_start_failures") or {}
    if failures.get("count"):
        first = failures["first"]
        lines.insert(
            -1,
            f"  workers not started  {failures['count']}, e.g. worker {first['worker']} on node "
            f"{first.get('hostname') or first.get('node')}: {first['cause']}",
        )
    for line in format_input(summary["input"], summary["bad_images"]):
        lines.insert(-1, line)
    telemetry = summary.get("telemetry")
    if telemetry:
        lines.append(f"  telemetry            {format_telemetry(telemetry)}")
    if summary.get("energy"):
        lines.append(f"  energy               {format_energy(summary['energy'])}")
    lines.append(f"  results              {inert(run_dir)}")
    return "\n".join(lines)


def format_steadiness(steady: dict[str, Any] | None) -> str:
    """One line: the steady part's OPS, its spread across windows and the 95 % interval of its mean."""
    if not steady:
        return "- (too few epochs to tell)"
    return (
        f"{format_ops(steady['steady_ops_per_s'])} +/- {100 * steady['half_width']:.1f} % (95 %) after start-up;"
        f" windows of {steady['window_s']:.0f} s vary {100 * steady['window_cv']:.1f} %"
        f" ({format_ops(steady['window_min_ops_per_s'])} to {format_ops(steady['window_max_ops_per_s'])})"
    )


def format_workers(w: WorkersSummary) -> str:
    """One line: how much of the workers' lives went into training and evaluation steps (once measured)."""
    busy, steady = w["busy_fraction_mean"], w.get("steady_busy_fraction_mean")
    assert busy is not None  # the caller prints this line only when it was measured
    text = f"{w['count']} worker(s), {100 * busy:.0f}% of their time in train/eval steps"
    if steady is not None:
        text += f" ({100 * steady:.0f}% excluding compilation)"
    if w.get("idle_gap_mean_s") is not None:
        text += f", {w['idle_gap_mean_s']:.2f} s mean gap between trials"
    if w.get("trials_step_known"):
        text += f", {w['trials_step_reused']} of {w['trials_step_known']} trials on an already compiled step"
    return text


def format_input(inp: InputSummary, bad: BadImagesSummary) -> list[str]:
    """The input pipeline's lines: share of step time spent waiting, starved workers, skipped images."""
    lines = []
    wait_fraction = inp.get("wait_fraction")
    if wait_fraction is not None:
        how = "streamed" if inp.get("storage") == "stream" else "resident arrays"
        if inp.get("decode_threads"):
            how += f", {'/'.join(str(t) for t in inp['decode_threads'])} decode thread(s) per worker"
        lines.append(f"  input pipeline       {100 * wait_fraction:.0f} % of step time waiting ({how})")
    if inp.get("starved_workers"):
        starved = inp["starved_workers"]
        lines.append(
            f"  input warning        {len(starved)} worker(s) waited more than "
            f"{100 * inp['starved_threshold']:.0f} % of their step time for input ({', '.join(starved[:4])}"
            f"{', ...' if len(starved) > 4 else ''}): the input pipeline limits this run; give each worker more "
            "CPU cores (dataset.decode_threads, cluster.cpus_per_trial) or hold the data in memory"
        )
    if bad.get("count"):
        from aiperf.datasets.bad_images import name_a_few

        fraction = bad.get("fraction")
        share = f" ({100 * fraction:.2f} % of the images)" if fraction is not None else ""
        missing = bad.get("missing") or 0
        why = "cannot be decoded" if not missing else f"{missing} missing (deleted since the run began)"
        if missing and missing < bad["count"]:
            why += f", {bad['count'] - missing} cannot be decoded"
        lines.append(
            f"  bad images           {bad['count']} skipped, {why}{share}: {name_a_few(bad['files'], bad['count'])}"
        )
    return lines


def format_telemetry(t: TelemetrySummary) -> str:
    """One line: utilisation where it was measured (energy has its own line, :func:`format_energy`)."""
    parts = [f"{t['samples']} samples from {t['nodes']} node(s)"]
    if t.get("accelerator_util_mean_percent") is not None:
        parts.append(f"accelerators {t['accelerator_util_mean_percent']:.0f}% busy")
    if t.get("cpu_util_mean_percent") is not None:
        parts.append(f"CPU {t['cpu_util_mean_percent']:.0f}% busy")
    if t.get("nodes_lost"):
        parts.append(f"{len(t['nodes_lost'])} node(s) stopped answering")
    return ", ".join(parts)
