"""The run summary: computed from the ledger alone, written atomically, printed for people.

Because the summary is a pure function of the ledger, ``aiperf verify`` can recompute it
and compare, and a run that was killed still gets a correct summary afterwards. The one
addition from outside the ledger is the ``telemetry`` section (utilisation, energy), which
is computed from ``telemetry.jsonl`` when the run recorded one; it never enters the score,
but it can add notes to the verdict (a machine shared with other work, see
:func:`aiperf.record.telemetry.shared_machine_notes`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError, os_error
from aiperf.metrics.rules import evaluate_rules
from aiperf.metrics.score import compute_score, format_ops
from aiperf.record.files import write_atomic
from aiperf.record.ledger import LEDGER_NAME, read_ledger
from aiperf.record.schema import check_shapes
from aiperf.record.telemetry import read_telemetry, shared_machine_notes, summarize_telemetry

SUMMARY_NAME = "summary.json"
DATASET_FIELDS = ("name", "train_images", "eval_images", "input_shape", "num_classes", "fingerprint")


def _worker_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    workers = [r for r in records if r["type"] == "worker"]
    fractions = [w["busy_fraction"] for w in workers if w.get("busy_fraction") is not None]
    steady = [w["steady_busy_fraction"] for w in workers if w.get("steady_busy_fraction") is not None]
    gaps = [w["idle_gaps"]["mean_s"] for w in workers if w.get("idle_gaps", {}).get("mean_s") is not None]
    return {
        "count": len(workers),
        "busy_fraction_mean": sum(fractions) / len(fractions) if fractions else None,
        "busy_fraction_min": min(fractions) if fractions else None,
        # Busy time less the first step of each completed trial (tracing/compilation + one step).
        "steady_busy_fraction_mean": sum(steady) / len(steady) if steady else None,
        "idle_gap_mean_s": sum(gaps) / len(gaps) if gaps else None,
        "per_worker": {
            w["worker"]: {
                "node": w.get("node"),
                "busy_fraction": w.get("busy_fraction"),
                "busy_s": w.get("busy_s"),
                "compile_s": w.get("compile_s"),
                "alive_s": w.get("alive_s"),
                "idle_gap_mean_s": w.get("idle_gaps", {}).get("mean_s"),
            }
            for w in workers
        },
    }


def _device_summary(start: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    plan = start.get("plan") or {}
    nodes = plan.get("nodes", [])
    devices = {}
    for w in (r for r in records if r["type"] == "worker"):
        dev = w.get("device") or {}
        key = f"{dev.get('kind', '?')}: {dev.get('name', '?')}"
        devices[key] = devices.get(key, 0) + 1
    return {
        "nodes": len(nodes),
        "cpus": sum(n.get("cpus", 0) for n in nodes),
        "gpus": sum(n.get("gpus", 0) for n in nodes),
        "accelerators": sorted({n.get("accelerator") for n in nodes if n.get("accelerator")}),
        "concurrency": plan.get("concurrency"),
        "placement": plan.get("placement"),
        "workers_by_device": devices,
    }


def summarize(records: list[dict[str, Any]], source: Any = "the ledger") -> dict[str, Any]:
    """Everything the run claims, derived from its ledger records (checked first: see ``record.schema``)."""
    check_shapes(records, source)
    start = records[0]
    score = compute_score(records)
    verdict = evaluate_rules(records, score)
    ends = [r for r in records if r["type"] == "trial_end"]
    starts = [r for r in records if r["type"] == "trial_start"]
    epochs = [r for r in records if r["type"] == "epoch"]
    stops = [r for r in records if r["type"] == "run_stop"]
    statuses: dict[str, int] = {}
    for r in ends:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    best = max(epochs, key=lambda r: (r["val_acc"], -r["seq"]), default=None)
    best_trial = None
    if best is not None:
        ts = next((r for r in starts if r["trial"] == best["trial"]), None)
        if ts is None:
            raise AiperfError(f"the ledger's best epoch (seq {best['seq']}) belongs to a trial that never started")
        best_trial = {
            "trial": best["trial"],
            "epoch": best["epoch"],
            "val_acc": best["val_acc"],
            "arch_id": ts["arch_id"],
            "params": ts["params"],
            "kind": ts["kind"],
            "lineage": ts.get("lineage", []),
            "flops_train_per_image": ts["flops"]["train_per_image"],
        }
    precisions = sorted({r["precision"] for r in epochs})
    dataset, plan = start.get("dataset") or {}, start.get("plan") or {}
    return {
        "run_id": start["run_id"],
        "name": _run_section(start).get("name"),
        "status": stops[-1]["status"] if stops else "running or killed",
        "stop_reason": stops[-1].get("reason") if stops else "no run_stop record: the master was killed",
        "dataset": {k: dataset.get(k) for k in DATASET_FIELDS},
        "backend": plan.get("backend"),
        "precision": precisions,
        "devices": _device_summary(start, records),
        "score": {
            **score.to_dict(),
            "ops_human": format_ops(score.ops_per_s),
            "regulated_human": format_ops(score.regulated),
            "aiperf_regulated_human": format_ops(score.aiperf_regulated),
        },
        "verdict": {**verdict.to_dict(), "headline": verdict.headline()},
        "trials": {
            "started": len({r["trial"] for r in starts}),
            "by_status": statuses,
            "distinct_architectures": len({r["arch_id"] for r in starts}),
            "epochs_counted": len(epochs),
        },
        "best": best_trial,
        "workers": _worker_summary(records),
        "ledger": {"records": len(records), "last_hash": records[-1]["hash"]},
    }


def _run_section(start: dict[str, Any]) -> dict[str, Any]:
    return (start.get("config") or {}).get("run") or {}


def build_summary(run_dir: str | Path, records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The summary of ``run_dir``: :func:`summarize` of its ledger plus its telemetry, if it has any."""
    run_dir = Path(run_dir)
    records = read_ledger(run_dir) if records is None else records
    summary = summarize(records, run_dir / LEDGER_NAME)
    samples = read_telemetry(run_dir)
    if samples:
        interval = _run_section(records[0]).get("telemetry_interval_s")
        summary["telemetry"] = summarize_telemetry(samples, summary["score"]["total_ops"], interval)
        notes = shared_machine_notes(summary["telemetry"])
        if notes:  # additive: the rules' verdict stands; the notes say what it was measured beside
            verdict = summary["verdict"]
            verdict["notes"] = notes
            verdict["headline"] = f"{verdict['headline']}; {'; '.join(notes)}"
    return summary


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
    """The result block printed at the end of a run."""
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
        f"  best val accuracy    {acc:.4f} (trial {best.get('trial')}, {best.get('params', 0):,} params)"
        if acc is not None
        else "  best val accuracy    - (no epoch completed)",
        f"  trials               {summary['trials']['started']} started, {summary['trials']['by_status']},"
        f" {summary['trials']['distinct_architectures']} distinct architectures, "
        f"{summary['trials']['epochs_counted']} epochs counted",
        f"  devices              {devices['concurrency']} concurrent trials on {devices['nodes']} node(s): {where};"
        f" backend {summary['backend']}, precision {', '.join(summary['precision']) or '-'}",
        f"  verdict              {v['headline']}",
    ]
    workers = summary.get("workers") or {}
    if workers.get("busy_fraction_mean") is not None:
        lines.insert(-1, f"  workers              {format_workers(workers)}")
    telemetry = summary.get("telemetry")
    if telemetry:
        lines.append(f"  telemetry            {format_telemetry(telemetry)}")
    lines.append(f"  results              {run_dir}")
    return "\n".join(lines)


def format_workers(w: dict[str, Any]) -> str:
    """One line: how much of the workers' lives went into training and evaluation steps."""
    text = f"{w['count']} worker(s), {100 * w['busy_fraction_mean']:.0f}% of their time in train/eval steps"
    if w.get("steady_busy_fraction_mean") is not None:
        text += f" ({100 * w['steady_busy_fraction_mean']:.0f}% excluding first steps/compilation)"
    if w.get("idle_gap_mean_s") is not None:
        text += f", {w['idle_gap_mean_s']:.2f} s mean gap between trials"
    return text


def format_telemetry(t: dict[str, Any]) -> str:
    """One line: utilisation, energy and OPS per watt where they were measured."""
    parts = [f"{t['samples']} samples from {t['nodes']} node(s)"]
    if t.get("accelerator_util_mean_percent") is not None:
        parts.append(f"accelerators {t['accelerator_util_mean_percent']:.0f}% busy")
    if t.get("cpu_util_mean_percent") is not None:
        parts.append(f"CPU {t['cpu_util_mean_percent']:.0f}% busy")
    if t.get("energy_j") is not None:
        mean_power = f" (mean {t['power_mean_w']:.0f} W)" if t.get("power_mean_w") else ""
        parts.append(f"accelerator energy {format_ops(t['energy_j'], 'J')}{mean_power}")
    if t.get("ops_per_watt") is not None:
        parts.append(format_ops(t["ops_per_watt"], "OPS/W"))
    if t.get("nodes_lost"):
        parts.append(f"{len(t['nodes_lost'])} node(s) stopped answering")
    return ", ".join(parts)
