"""One list row per system and workload, from the summaries of its runs, and the ranking of the rows.

Pure functions of plain data (the runs' ``summary.json`` objects, the system description and
the checker's verdict), so the combination and the order can be tested without a package.
A package is written by someone else and may hold anything: every figure is read through
:func:`_number`, and a field of the wrong type reads as unknown, never as an exception.
The repeated runs are combined by :func:`aiperf.metrics.repeats.spread` (median, olympic mean,
CV, min, max); docs/submission.md, "The list", says which figure each column shows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from aiperf.ledger.inert import inert
from aiperf.metrics.repeats import Spread, spread
from aiperf.metrics.workloads import OFFICIAL_WORKLOAD

RANK_KEYS = ("ops", "regulated", "efficiency", "ops_per_watt")
RANK_LABELS = {
    "ops": "OPS",
    "regulated": "regulated OPS",
    "efficiency": "OPS / Rpeak",
    "ops_per_watt": "OPS per watt",
}


@dataclass(frozen=True)
class DevicePoint:
    """One kind of device a row's runs trained on: its name, unit, count and its share of the OPS (median)."""

    device: str
    unit: str  # accelerator | core
    count: int
    ops_per_s: float | None


@dataclass(frozen=True)
class Row:
    """One system running one workload, its runs combined; ``rank`` and ``note`` are set by :func:`rank_rows`."""

    package: str
    system: str
    workload: str
    accepted: bool
    finding: str | None = None  # the checker's first finding (rejected packages)
    submitter: str | None = None
    site: str | None = None
    nodes: int | None = None
    planned_nodes: int | None = None  # the nodes the runs' jobs were given, where stated (the most of them)
    trained_nodes: int | None = None  # the nodes trials ran on (the fewest of the runs)
    accelerators: str | None = None  # "8 x NVIDIA H100 80GB HBM3", "2 x AMD EPYC 7763 (cores)"
    devices: tuple[DevicePoint, ...] = ()
    backend: str | None = None
    precision: str | None = None
    ops: Spread | None = None
    regulated: Spread | None = None
    tokens_per_s: float | None = None  # median training tokens per second (language runs only)
    rpeak: float | None = None
    ops_over_rpeak: float | None = None
    ops_over_ceiling: float | None = None
    engine_efficiency: float | None = None  # OPS / (slots x steady device rate), docs/cluster.md
    compile_critical: float | None = None  # compiling on the critical path / the workers' time
    ops_per_watt: float | None = None
    energy_level: str | None = None  # "level 2: whole compute nodes", "below level 1: accelerators only", or why none
    duration_s: float | None = None
    official: bool | None = None
    comparable: bool | None = None
    runs: int = 0
    caveat: str | None = None  # what its runs' verdicts noted beside the rules (a shared machine)
    run_ids: tuple[str, ...] = ()  # its runs' run_id: one run is counted once across every package listed
    rank: int | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        # Every text here came from a package (a description, a summary, a folder's name) or names one:
        # made inert once, so no table, CSV, Markdown or page written from it carries a control
        # character, a bidirectional override or a lone surrogate (which no file encoding can write).
        for name, value in vars(self).items():
            if isinstance(value, str) and not value.isprintable():
                object.__setattr__(self, name, inert(value))

    @property
    def runs_text(self) -> str:
        cv = self.ops.cv if self.ops is not None else None
        return f"{self.runs}" + (f", CV {100 * cv:.1f} %" if cv is not None else "")

    def value(self, by: str) -> float | None:
        """The figure ``--by`` ranks on."""
        if by == "ops":
            return self.ops.median if self.ops is not None else None
        if by == "regulated":
            return self.regulated.median if self.regulated is not None else None
        if by == "efficiency":
            return self.ops_over_rpeak
        if by == "ops_per_watt":
            return self.ops_per_watt
        raise ValueError(f"unknown ranking key {by!r}")


def finite_number(value: object) -> float | None:
    """A finite number, or None (a string, a boolean, NaN or infinity in a summary is not a figure)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _declared_count(value: object) -> float | None:
    """A count a description gives as text ("16"): ASCII digits only ("²" is a digit to Python), at most 9 of them."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return float(value)
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _section(data: object, key: str) -> dict[str, object]:
    value = data.get(key) if isinstance(data, Mapping) else None
    return dict(value) if isinstance(value, Mapping) else {}


def _spread_of(values: Iterable[float | None]) -> Spread | None:
    """The spread over the runs, or None unless every run has the figure (a median of some runs would flatter)."""
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return spread([v for v in values if v is not None])


def _median_all(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def _one_of(values: Iterable[str | None]) -> str | None:
    """The runs' common value, or all their values joined when they differ."""
    seen = list(dict.fromkeys(v for v in values if v))
    return ", ".join(seen) if seen else None


def _precisions(summary: Mapping[str, object]) -> str | None:
    values = summary.get("precision")
    if not isinstance(values, list):
        return None
    return ", ".join(v for v in values if isinstance(v, str)) or None


# Kinds of device one run trained on, as the list reads them: a real machine has a handful (one per
# node kind and precision); a summary listing 12,000 took the list minutes (quadratic).
MAX_DEVICE_KINDS = 64


def _by_device(summary: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """A summary's ``efficiency.by_device``, the first ``MAX_DEVICE_KINDS`` entries, by device (its first entry)."""
    entries = _section(summary, "efficiency").get("by_device")
    found: dict[str, dict[str, object]] = {}
    for d in entries[:MAX_DEVICE_KINDS] if isinstance(entries, list) else []:
        if isinstance(d, Mapping) and isinstance(d.get("device"), str):
            found.setdefault(d["device"], dict(d))
    return found


def _device_points(summaries: Sequence[Mapping[str, object]]) -> tuple[DevicePoint, ...]:
    """The first run's kinds of device, each with the median over the runs of the OPS those devices counted."""
    runs = [_by_device(s) for s in summaries]
    points = []
    for first in runs[0].values() if runs else []:
        device, unit, count = _text(first.get("device")), _text(first.get("unit")), finite_number(first.get("devices"))
        if device is None or count is None or count <= 0:
            continue
        shares = [finite_number(run[device].get("ops_per_s")) if device in run else None for run in runs]
        points.append(DevicePoint(device, unit or "accelerator", int(count), _median_all(shares)))
    return tuple(points)


def _accelerators_text(points: Sequence[DevicePoint], system: Mapping[str, object]) -> str | None:
    """What the runs trained on; without a recorded breakdown, what the system description declares."""
    if points:
        return "; ".join(f"{p.count} x {p.device}" + (" (cores)" if p.unit == "core" else "") for p in points)
    top500 = _section(system, "top500")
    count, name = finite_number(top500.get("accelerator_count")), _text(top500.get("accelerator"))
    if count and name:
        return f"{count:.0f} x {name}"
    cores, cpu = finite_number(top500.get("total_cores")), _text(top500.get("processor"))
    return f"{cores:.0f} x {cpu} (cores)" if cores and cpu else None


def _energy(summaries: Sequence[Mapping[str, object]]) -> tuple[float | None, str]:
    """Median OPS per watt when every run was metered, with the lowest methodology level among them and
    what was metered (the figure covers only that: accelerators alone flatter a machine)."""
    sections = [_section(s, "energy") for s in summaries]
    figures = [finite_number(e.get("ops_per_watt")) if e.get("measured") is True else None for e in sections]
    metered = sum(1 for f in figures if f is not None)
    if not metered:
        return None, "not measured"
    if any(e.get("bound") is not True for e, f in zip(sections, figures, strict=True) if f is not None):
        # telemetry is outside the hash chain: an energy figure counts only from what the ledger binds
        return None, "not ranked: telemetry not bound by its ledger"
    if metered < len(figures):
        return None, f"metered in {metered} of {len(figures)} runs only"
    granularity = [finite_number(_section(_section(e, "aspects"), "granularity").get("level")) for e in sections]
    if any(g == 0 for g in granularity):  # MLPerf's and the EEHPC methodology's rule: >= 1 power reading a second
        return None, "not ranked: power sampled less than once a second"
    levels = [finite_number(e.get("level")) for e in sections]
    level = min((v for v in levels if v is not None), default=None)
    text = "level unknown" if level is None else (f"level {level:.0f}" if level >= 1 else "below level 1")
    covers = _one_of(_text(e.get("covers_text")) for e in sections)
    return _median_all(figures), f"{text}: {covers}" if covers else text


def _caveat(summaries: Sequence[Mapping[str, object]]) -> str | None:
    """The notes the runs' verdicts carry beside the rules (``shared machine: 57 % of CPU time outside the run``),
    each once with how many runs it concerns: a ranked figure measured beside other work says so."""
    counts: dict[str, int] = {}
    for summary in summaries:
        notes = _section(summary, "verdict").get("notes")
        for note in notes if isinstance(notes, list) else []:
            if isinstance(note, str) and note:
                kind = note.split(":", 1)[0]
                counts[kind] = counts.get(kind, 0) + 1
    if not counts:
        return None
    return "; ".join(f"{kind} in {n} of {len(summaries)} run(s)" for kind, n in sorted(counts.items()))


def _extreme(pick: Callable[[list[float]], float], values: list[float | None]) -> int | None:
    """``pick`` (min or max) of the runs' counts that are stated, as a whole number; None when none is."""
    known = [v for v in values if v is not None]
    return int(pick(known)) if known else None


def _all_true(summaries: Sequence[Mapping[str, object]], key: str) -> bool | None:
    values = [_section(s, "verdict").get(key) for s in summaries]
    if not values or any(not isinstance(v, bool) for v in values):
        return None
    return all(values)


def combine_runs(
    package: str,
    system: str,
    workload: str,
    summaries: Sequence[Mapping[str, object]],
    description: Mapping[str, object],
    accepted: bool,
    finding: str | None = None,
) -> Row:
    """The row of one system and workload from its runs' summaries and its system description."""
    scores = [_section(s, "score") for s in summaries]
    efficiency = [_section(s, "efficiency") for s in summaries]
    points = _device_points(summaries)
    ops_per_watt, level = _energy(summaries)
    nodes = finite_number(_section(summaries[0], "devices").get("nodes")) if summaries else None
    if nodes is None:
        nodes = _declared_count(description.get("number_of_nodes"))
    rpeaks = [finite_number(e.get("rpeak_flops")) for e in efficiency]
    return Row(
        package=package,
        system=_text(description.get("system_name")) or system,
        workload=workload,
        accepted=accepted,
        finding=finding,
        submitter=_text(description.get("submitter")),
        site=_text(_section(description, "top500").get("site")),
        nodes=int(nodes) if nodes is not None else None,
        planned_nodes=_extreme(max, [finite_number(_section(s, "devices").get("planned_nodes")) for s in summaries]),
        trained_nodes=_extreme(min, [finite_number(_section(s, "devices").get("trained_nodes")) for s in summaries]),
        accelerators=_accelerators_text(points, description),
        devices=points,
        backend=_one_of(_text(s.get("backend")) for s in summaries),
        precision=_one_of(_precisions(s) for s in summaries),
        ops=_spread_of(finite_number(s.get("ops_per_s")) for s in scores),
        regulated=_spread_of(finite_number(s.get("regulated")) for s in scores),
        tokens_per_s=_median_all([finite_number(_section(s, "language").get("tokens_per_s")) for s in summaries]),
        rpeak=_median_all(rpeaks),
        ops_over_rpeak=_median_all([finite_number(e.get("ops_over_rpeak")) for e in efficiency]),
        ops_over_ceiling=_median_all([finite_number(e.get("ops_over_ceiling")) for e in efficiency]),
        engine_efficiency=_median_all([finite_number(e.get("engine")) for e in efficiency]),
        compile_critical=_median_all(
            [finite_number(_section(s, "workers").get("compile_critical_fraction")) for s in summaries]
        ),
        ops_per_watt=ops_per_watt,
        energy_level=level,
        duration_s=_median_all([finite_number(s.get("wall_s")) for s in scores]),
        official=_all_true(summaries, "official"),
        comparable=_all_true(summaries, "comparable"),
        runs=len(summaries),
        caveat=_caveat(summaries),
        run_ids=tuple(run_id for s in summaries if (run_id := _text(s.get("run_id")))),
    )


def _workload_order(workload: str) -> tuple[int, str]:
    return (0 if workload == OFFICIAL_WORKLOAD else 1, workload)


def _shared_runs(rows: list[Row]) -> dict[int, str]:
    """Accepted rows holding a run another accepted row also holds (its run_id), and why each is not ranked.

    A run is counted once: the same audited runs packaged twice would otherwise rank twice. Which
    package is the runs' own is the list maintainer's to settle, so none of them is ranked.
    """
    holders: dict[str, list[Row]] = {}
    for r in rows:
        if r.accepted:
            for run_id in dict.fromkeys(r.run_ids):
                holders.setdefault(run_id, []).append(r)
    why: dict[int, str] = {}
    for run_id, held in holders.items():
        for r in held if len(held) > 1 else ():
            others = sorted({o.package for o in held if o is not r})
            why.setdefault(id(r), f"run {run_id} is also in {', '.join(others)}: a run counts once")
    return why


def rank_rows(rows: Iterable[Row], by: str = "ops") -> list[Row]:
    """Rows in list order: per workload (the official one first), the accepted rows ranked by ``by``
    (descending, equal figures share a rank), then the accepted rows that cannot be ranked (the
    figure unknown, runs not comparable), each with a note saying why; after all workloads, the
    rejected packages' rows, with their first finding."""
    if by not in RANK_KEYS:
        raise ValueError(f"unknown ranking key {by!r}")
    label = RANK_LABELS[by]
    rows = list(rows)
    shared = _shared_runs(rows)
    out: list[Row] = []
    for workload in sorted({r.workload for r in rows if r.accepted}, key=_workload_order):
        mine = [r for r in rows if r.accepted and r.workload == workload]
        rankable = [r for r in mine if r.comparable is not False and r.value(by) is not None and id(r) not in shared]
        rankable.sort(key=lambda r: (-(r.value(by) or 0.0), r.system, r.package))
        rank, previous = 0, None
        for i, r in enumerate(rankable, 1):
            if r.value(by) != previous:
                rank, previous = i, r.value(by)
            out.append(replace(r, rank=rank, note=r.caveat))
        ranked = {id(r) for r in rankable}
        for r in sorted((r for r in mine if id(r) not in ranked), key=lambda r: (r.system, r.package)):
            why = shared.get(id(r)) or ("custom rules, not comparable" if r.comparable is False else f"{label} unknown")
            out.append(replace(r, rank=None, note=f"not ranked: {why}"))
    for r in sorted((r for r in rows if not r.accepted), key=lambda r: (r.package, r.system, r.workload)):
        out.append(replace(r, rank=None, note=f"rejected: {r.finding or 'no finding recorded'}"))
    return out
