"""``aiperf verify``: re-derive everything a run claims from its ledger and compare.

Four independent checks, each of which an edit to the results must get past:

1. the hash chain: every record's ``seq`` follows the previous one, its ``prev`` is the
   previous record's ``hash`` and its ``hash`` is the SHA-256 of its own content, so an
   edited, removed, inserted or reordered record shows where it happened;
2. the bookkeeping: the run header comes first, the master clock never runs backwards,
   every epoch belongs to a trial that started and no epoch of an attempt is counted twice;
3. the operation counts: every trial's FLOPs are recounted from the architecture stored in
   its ``trial_start`` record, and every epoch's ``train_ops``, ``eval_ops``, ``ops`` and
   ``aiperf_ops`` from those FLOPs, the epoch's image counts and its batch size;
4. the claims: the summary (score, validity rules, trial counts, the ledger's record count
   and last hash, which anchors the end of the chain) is recomputed and must equal
   ``summary.json`` field by field.

A ledger rewritten wholesale with fresh hashes passes check 1 but not checks 3 and 4 unless
the summary is rewritten to match too: publish ``summary.json``'s ``ledger.last_hash`` with
a result to pin the ledger down completely.

Before checks 2-4 every record's shape is checked (``aiperf.record.schema``): a record with
a string where a number belongs fails verification there, by name, instead of crashing a
later check. Input that cannot be read as a ledger at all (no such directory, a line that
is not JSON, nesting too deep to parse) raises :class:`~aiperf.errors.AiperfError`, which
the CLI reports with exit code 2; a failed check is exit code 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError, excerpt
from aiperf.metrics.flops import GraphCost, aiperf_compatible_operations, count_flops, epoch_operations
from aiperf.metrics.score import format_ops
from aiperf.record.files import read_regular
from aiperf.record.ledger import read_ledger_contents, record_hash
from aiperf.record.schema import shape_problems
from aiperf.record.summary import SUMMARY_NAME, build_summary
from aiperf.record.telemetry import read_telemetry
from nas.errors import NasError
from nas.graph import Graph
from nas.serialize import graph_from_dict

REL_TOL = 1e-9  # JSON round-trips floats exactly; this only absorbs summation order
MAX_LISTED = 10
MAX_SUMMARY_BYTES = 16 * 1024 * 1024  # a real summary.json is a few kilobytes


def describe(record: dict[str, Any]) -> str:
    """``seq 12 (epoch t00003 epoch 2)``: how a message points at a record."""
    what = [_label(record.get("type", "?"))]
    if "trial" in record:
        what.append(_label(record["trial"]))
    if record.get("type") == "epoch" and "epoch" in record:
        what.append(f"epoch {_label(record['epoch'])}")
    return f"seq {_label(record.get('seq', '?'))} ({' '.join(what)})"


def _label(value: Any) -> str:
    """A field as it appears in a message: itself when short and printable, else an excerpt."""
    text = value if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**15:
        text = str(value)
    return text if text is not None and text.isprintable() and len(text) <= 40 else excerpt(value)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


# --- 1. the hash chain ------------------------------------------------------------------------


def check_chain(records: list[dict[str, Any]]) -> list[str]:
    """Sequence numbers, ``prev`` links and each record's own hash, in file order."""
    problems = []
    seqs = [r.get("seq") for r in records]
    for line, rec in enumerate(records):
        where = f"line {line + 1}, {describe(rec)}"
        if rec.get("hash") != record_hash(rec):
            problems.append(f"{where}: its content does not match its hash (the record was edited)")
        if rec.get("seq") != line:
            if line in seqs[line + 1 :]:
                problems.append(f"{where}: expected seq {line} here; it comes later (records were reordered)")
            elif isinstance(rec.get("seq"), int) and rec["seq"] > line:
                problems.append(
                    f"{where}: expected seq {line}; seq {line}..{rec['seq'] - 1} missing (records were removed)"
                )
            else:
                problems.append(f"{where}: expected seq {line} (a record was duplicated or inserted)")
        expected_prev = records[line - 1].get("hash") if line else ""
        if rec.get("prev") != expected_prev:
            problems.append(
                f"{where}: 'prev' is not the hash of the record before it (records were removed, inserted or reordered)"
            )
    return problems


# --- 2. bookkeeping ---------------------------------------------------------------------------


def check_bookkeeping(records: list[dict[str, Any]]) -> list[str]:
    problems = []
    if not records or records[0].get("type") != "run_start":
        return ["the ledger does not begin with a run_start record"]
    started: set[str] = set()
    counted: set[tuple[Any, Any, Any]] = set()
    last_t = -math.inf
    for rec in records:
        t = rec.get("t")
        if not isinstance(t, (int, float)):
            problems.append(f"{describe(rec)}: no master-clock time 't'")
        elif t < last_t:
            problems.append(f"{describe(rec)}: t={t} is earlier than the record before it ({last_t})")
        else:
            last_t = t
        if rec.get("type") == "trial_start":
            started.add(rec.get("trial"))
        elif rec.get("type") == "epoch":
            if rec.get("trial") not in started:
                problems.append(f"{describe(rec)}: an epoch of a trial that never started")
            key = (rec.get("trial"), rec.get("attempt", 0), rec.get("epoch"))
            if key in counted:
                problems.append(f"{describe(rec)}: this epoch of this attempt is counted twice")
            counted.add(key)
    return problems


# --- 3. operation counts ----------------------------------------------------------------------


def _field_mismatch(rec: dict[str, Any], name: str, recorded: Any, recomputed: Any) -> str:
    return f"{describe(rec)}: {name} is {recorded!r} but the stored architecture gives {recomputed!r}"


def check_flops(records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Recount every trial's FLOPs and every epoch's operations; returns (problems, trials checked)."""
    problems: list[str] = []
    costs: dict[str, tuple[Graph, GraphCost]] = {}  # per trial, from its latest trial_start
    cache: dict[str, tuple[Graph, GraphCost]] = {}  # per architecture document
    for rec in records:
        if rec.get("type") == "trial_start":
            try:
                doc = rec.get("graph")
                key = json.dumps(doc, sort_keys=True)
                if key not in cache:
                    graph = graph_from_dict(doc)
                    cache[key] = (graph, count_flops(graph))
                graph, cost = cache[key]
            except (NasError, AiperfError, TypeError, ValueError) as exc:
                problems.append(f"{describe(rec)}: the stored architecture is not readable ({exc})")
                continue
            costs[rec.get("trial")] = (graph, cost)
            problems.extend(_check_trial_start(rec, graph, cost))
        elif rec.get("type") == "epoch" and rec.get("trial") in costs:
            problems.extend(_check_epoch(rec, *costs[rec["trial"]]))
    return problems, len(costs)


def _check_trial_start(rec: dict[str, Any], graph: Graph, cost: GraphCost) -> list[str]:
    # arch_id is a grouping label whose hash recipe may change between versions: not a claim checked here.
    problems = []
    if rec.get("params") != graph.param_count:
        problems.append(_field_mismatch(rec, "params", rec.get("params"), graph.param_count))
    flops = rec.get("flops") if isinstance(rec.get("flops"), dict) else {}
    expected = {
        "forward": cost.forward,
        "backward": cost.backward,
        "update_per_step": cost.update_per_step,
        "eval_per_image": cost.eval_per_image,
    }
    batch = (rec.get("hparams") or {}).get("batch_size")
    try:
        expected["train_per_image"] = cost.train_per_image(batch)
    except AiperfError as exc:
        problems.append(f"{describe(rec)}: hparams.batch_size: {exc}")
    for name, value in expected.items():
        if not _close(flops.get(name), value):
            problems.append(_field_mismatch(rec, f"flops.{name}", flops.get(name), value))
    return problems


def _check_epoch(rec: dict[str, Any], graph: Graph, cost: GraphCost) -> list[str]:
    try:
        train, evaluation = epoch_operations(
            cost, rec.get("train_images"), rec.get("eval_images"), rec.get("batch_size")
        )
        aiperf = aiperf_compatible_operations(graph, rec.get("train_images"), rec.get("eval_images"))
    except (AiperfError, TypeError) as exc:
        return [f"{describe(rec)}: its image counts or batch size are unusable ({exc})"]
    problems = []
    for name, value in (
        ("train_ops", train),
        ("eval_ops", evaluation),
        ("ops", train + evaluation),
        ("aiperf_ops", aiperf),
    ):
        if not _close(rec.get(name), value):
            problems.append(_field_mismatch(rec, name, rec.get(name), value))
    return problems


# --- 4. the claims ----------------------------------------------------------------------------


def diff(recorded: Any, recomputed: Any, path: str = "") -> list[str]:
    """Every place where ``recorded`` (summary.json) differs from ``recomputed``, as dotted paths."""
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        out = []
        for key in sorted(set(recorded) | set(recomputed), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in recorded:
                out.append(f"summary.json has no {sub} (the ledger gives {_short(recomputed[key])})")
            elif key not in recomputed:
                out.append(f"summary.json has {sub} = {_short(recorded[key])}, which the ledger does not give")
            else:
                out.extend(diff(recorded[key], recomputed[key], sub))
        return out
    if isinstance(recorded, list) and isinstance(recomputed, list) and len(recorded) == len(recomputed):
        return [
            p for k, (a, b) in enumerate(zip(recorded, recomputed, strict=True)) for p in diff(a, b, f"{path}[{k}]")
        ]
    if _close(recorded, recomputed):
        return []
    return [f"summary.json {path} is {_short(recorded)} but the ledger gives {_short(recomputed)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def check_summary(run_dir: Path, records: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any] | None]:
    """Recompute the summary and compare it with ``summary.json``; returns (problems, recomputed)."""
    path = run_dir / SUMMARY_NAME
    try:
        data = read_regular(path, MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        return [f"{path} is missing (run `aiperf summary {run_dir}` to write it, then publish it)"], None
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_SUMMARY_BYTES:
        return [f"{path} is larger than any summary ({MAX_SUMMARY_BYTES:,} bytes or more)"], None
    try:
        recorded = json.loads(data)
    except (ValueError, RecursionError):
        return [f"{path} is not valid JSON"], None
    try:
        recomputed = build_summary(run_dir, records)
    except AiperfError as exc:
        return [f"the summary cannot be recomputed from the ledger ({exc})"], None
    return diff(recorded, recomputed), recomputed


# --- all of it --------------------------------------------------------------------------------


def verify_run(run_dir: str | Path) -> tuple[bool, str]:
    """Run every check; ``(True, "verified: ...")`` or ``(False, "verify failed: <first problem> ...")``.

    Raises :class:`~aiperf.errors.AiperfError` when ``run_dir`` cannot be read as a run at all.
    """
    run_dir = Path(run_dir)
    contents = read_ledger_contents(run_dir)
    records = contents.records
    if not records:
        raise AiperfError(f"{run_dir}: the ledger has no complete record")
    read_telemetry(run_dir)  # unreadable (a FIFO, a device) is unreadable input, not a failed check
    problems = check_chain(records)
    shapes = shape_problems(records)
    problems += shapes
    trials = 0
    summary: dict[str, Any] | None = None
    if not shapes:  # the deeper checks compute with the fields the shapes guarantee
        problems += check_bookkeeping(records)
        flop_problems, trials = check_flops(records)
        problems += flop_problems
        summary_problems, summary = check_summary(run_dir, records)
        problems += summary_problems
    if problems:
        lines = [f"verify failed: {problems[0]}"]
        lines += [f"  also: {p}" for p in problems[1:MAX_LISTED]]
        if len(problems) > MAX_LISTED:
            lines.append(f"  ... and {len(problems) - MAX_LISTED} more problems")
        return False, "\n".join(lines)
    assert summary is not None
    epochs = sum(1 for r in records if r.get("type") == "epoch")
    score, verdict = summary["score"], summary["verdict"]
    torn = contents.torn_note(run_dir / "ledger.jsonl")
    return True, (
        f"verified: run {summary['run_id']}: {len(records)} records, hash chain intact "
        f"(last {records[-1]['hash'][:16]}); FLOPs of {trials} trials and operations of {epochs} epochs "
        f"recomputed; score {score['ops_human']} (regulated {score['regulated_human']}, "
        f"{format_ops(score['total_ops'], 'OP')} counted) and verdict '{verdict['headline']}' match {SUMMARY_NAME}"
        + (f"\n  note: {torn}" if torn else "")
    )
