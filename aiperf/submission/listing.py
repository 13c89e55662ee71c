"""``aiperf list DIR...``: the rows of many submission packages, ranked, as a table, CSV or Markdown.

A list maintainer runs this on packages other people wrote, so input is bounded before it is
read (how many packages here; how large each file, how many entries and runs, with the bounds
of :mod:`aiperf.submission.layout`) and every path a package names must stay inside it. A
package that cannot be read is not an error of the command: it is listed below the ranking
with what is wrong, like any rejected package. Only what makes no list at all (a folder that
holds no package, too many packages) is one line and exit 2. Strings from packages are shown
with control characters replaced and, in CSV, never as a spreadsheet formula; the HTML page
is :mod:`aiperf.submission.list_page`.
"""

from __future__ import annotations

import io
import json
import os
import stat
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

from aiperf.errors import AiperfError, excerpt, first_line, os_error
from aiperf.ledger.files import write_atomic
from aiperf.ledger.inert import HIDDEN_CATEGORIES
from aiperf.ledger.json_types import JSONObject, JSONValue
from aiperf.metrics.score import format_ops, format_percent
from aiperf.results.summary import MAX_SUMMARY_BYTES, SUMMARY_NAME, format_rate
from aiperf.submission.layout import (
    MAX_DESCRIPTION_BYTES,
    PACKAGE_JSON,
    PackageEntry,
    inside,
    read_bounded,
    read_package_json,
    system_file,
)
from aiperf.submission.ranking import RANK_LABELS, Row, combine_runs, rank_rows

MAX_PACKAGES = 10_000
TEXT_CHARS = 36  # a string from a package in the plain table (the notes below it are whole)

Verdict = tuple[bool, str | None]  # accepted, first finding
Checker = Callable[[Path], Verdict]


class _Unreadable(Exception):
    """A file of a package that cannot be read; becomes the row's finding."""


def checker_verdict(package: Path) -> Verdict:
    """``aiperf check``'s verdict on ``package``: accepted, or its first finding."""
    from aiperf.submission.check import check_package

    try:
        result = check_package(package)
    except AiperfError as exc:
        return False, first_line(exc)
    return result.accepted, (result.findings[0].text if result.findings else None)


def find_packages(paths: Sequence[str | Path], limit: int = MAX_PACKAGES) -> list[Path]:
    """Each path is a package (it holds package.json) or a folder of packages (its subfolders that do)."""
    if not paths:
        raise AiperfError("list: give at least one package folder")
    found: dict[Path, Path] = {}  # resolved -> as given
    for given in paths:
        path = Path(given)
        try:
            if not path.is_dir():
                raise AiperfError(f"list: {excerpt(str(given))} is not a folder (a package or a folder of packages)")
            if (path / PACKAGE_JSON).exists():
                inner = [path]
            else:
                inner = sorted(p for p in _subfolders(path, limit) if (p / PACKAGE_JSON).exists())
                if not inner:
                    raise AiperfError(
                        f"list: {excerpt(str(given))} holds no package ({PACKAGE_JSON}, nor in any subfolder)"
                    )
            for p in inner:
                found.setdefault(p.resolve(), p)
        except OSError as exc:
            raise os_error(exc, path, "read") from None
        if len(found) > limit:
            raise AiperfError(f"list: more than {limit:,} packages; list them in parts")
    return list(found.values())


def _subfolders(path: Path, limit: int) -> list[Path]:
    """The folders directly in ``path``; more than ``limit`` of them is an error (the scan stops there)."""
    found = []
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                found.append(Path(entry.path))
                if len(found) > limit:
                    raise AiperfError(
                        f"list: {excerpt(str(path))} holds more than {limit:,} folders; list them in parts"
                    )
    return found


def _path(package: Path, relative: str) -> Path:
    """``package/relative`` when it is a portable path inside the package, not leading out through a link."""
    path = inside(package, relative)
    if path is None:
        raise _Unreadable(f"path {excerpt(relative)} is not a portable path inside the package")
    try:
        if not path.resolve().is_relative_to(package.resolve()):
            raise _Unreadable(f"{relative} leads out of the package")
    except (OSError, RuntimeError) as exc:
        raise _Unreadable(f"{relative}: {first_line(exc)}") from None
    return path


def read_json(path: Path, relative: str, limit: int) -> JSONValue:
    """A JSON file of a package: a regular file of at most ``limit`` bytes (its size checked before reading)."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _Unreadable(f"{relative} is not a regular file")
        if info.st_size > limit:
            raise _Unreadable(f"{relative} is {info.st_size:,} bytes, more than the {limit:,} allowed")
        data = read_bounded(path, limit)
    except OSError as exc:
        raise _Unreadable(f"cannot read {relative}: {exc.strerror or first_line(exc)}") from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _Unreadable(f"{relative} is not JSON ({first_line(exc, 80)})") from None


def _object(package: Path, relative: str, limit: int) -> JSONObject:
    data = read_json(_path(package, relative), relative, limit)
    if not isinstance(data, dict):
        raise _Unreadable(f"{relative} is not a JSON object")
    return data


def _entry_row(package: Path, label: str, entry: PackageEntry, verdict: Verdict) -> Row:
    accepted, finding = verdict
    try:
        if not entry.runs:
            raise _Unreadable("the entry lists no runs")
        description = _object(package, system_file(entry.system), MAX_DESCRIPTION_BYTES)
        summaries = [_object(package, f"{run}/{SUMMARY_NAME}", MAX_SUMMARY_BYTES) for run in entry.runs]
    except _Unreadable as exc:
        # The checker reads the same files; a package it accepted that the list cannot read is not ranked.
        return Row(label, entry.system, entry.workload, accepted=False, finding=finding or f"list: {exc}")
    return combine_runs(label, entry.system, entry.workload, summaries, description, accepted, finding)


def package_rows(package: Path, check: Checker | None = None, label: str | None = None) -> list[Row]:
    """The rows of one package (one per entry of its package.json), with ``check``'s verdict (``aiperf check``'s)."""
    label = label if label is not None else str(package)
    accepted, finding = (check or checker_verdict)(package)
    try:
        index = read_package_json(package)
    except AiperfError as exc:
        return [Row(label, package.name, "?", accepted=False, finding=finding or f"list: {first_line(exc)}")]
    if not index.entries:
        return [Row(label, package.name, "?", accepted=False, finding=finding or "list: package.json lists nothing")]
    return [_entry_row(package, label, entry, (accepted, finding)) for entry in index.entries]


def read_rows(paths: Sequence[str | Path], check: Checker | None = None) -> list[Row]:
    """The rows of every package under ``paths`` (:func:`find_packages`), unranked."""
    rows: list[Row] = []
    for package in find_packages(paths):
        rows.extend(package_rows(package, check))
    return rows


# --- the tables --------------------------------------------------------------------------------


def plain(value: object, limit: int | None = TEXT_CHARS) -> str:
    """A string from a package made safe for a terminal or a Markdown cell: no control or format
    characters (escape sequences, bidirectional overrides), cut to ``limit``."""
    text = "" if value is None else str(value)
    text = "".join("?" if unicodedata.category(c) in HIDDEN_CATEGORIES else c for c in text)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def _ops(value: float | None, unit: str = "OPS") -> str:
    return format_ops(value, unit) if value is not None else "-"


def _watts(row: Row) -> str:
    if row.ops_per_watt is None:
        return row.energy_level or "-"
    return f"{format_ops(row.ops_per_watt, 'OPS/W')} ({row.energy_level})"


def _nodes(row: Row) -> str:
    """The nodes at the runs' start, and where trials ran on fewer than a job was given, how many of how many."""
    text = str(row.nodes) if row.nodes is not None else "-"
    planned, trained = row.planned_nodes, row.trained_nodes
    if planned is not None and trained is not None and trained < planned:
        text += f" (trials on {trained} of {planned} planned)"
    return text


def _official(row: Row) -> str:
    return "-" if row.official is None else ("yes" if row.official else "no")


def _tokens(row: Row) -> str:
    return format_rate(row.tokens_per_s, "tokens/s") if row.tokens_per_s is not None else "-"


def _duration(row: Row) -> str:
    return f"{row.duration_s:,.0f} s" if row.duration_s is not None else "-"


# (header, the cell as text): the columns of the plain table, the Markdown table and the page.
COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("rank", lambda r: str(r.rank) if r.rank is not None else "-"),
    ("workload", lambda r: r.workload),
    ("system", lambda r: r.system),
    ("submitter", lambda r: r.submitter or "-"),
    ("site", lambda r: r.site or "-"),
    ("nodes", lambda r: _nodes(r)),
    ("accelerators", lambda r: r.accelerators or "-"),
    ("backend", lambda r: r.backend or "-"),
    ("precision", lambda r: r.precision or "-"),
    ("OPS", lambda r: _ops(r.value("ops"))),
    ("regulated OPS", lambda r: _ops(r.value("regulated"))),
    ("tokens/s", _tokens),
    ("Rpeak", lambda r: _ops(r.rpeak, "FLOP/s")),
    ("OPS/Rpeak", lambda r: format_percent(r.ops_over_rpeak)),
    ("OPS/ceiling", lambda r: format_percent(r.ops_over_ceiling)),
    ("engine", lambda r: format_percent(r.engine_efficiency)),
    ("OPS per watt", _watts),
    ("runs", lambda r: r.runs_text),
    ("duration", _duration),
    ("official", _official),
    ("verdict", lambda r: "accepted" if r.accepted else "rejected"),
]


def _notes(rows: Sequence[Row], limit: int | None) -> list[str]:
    return [f"{plain(r.system, limit)} ({plain(r.workload, limit)}): {plain(r.note, None)}" for r in rows if r.note]


def format_table(rows: Sequence[Row], by: str) -> str:
    """The plain table printed on stdout, then one line per row that is not ranked, saying why."""
    if not rows:
        return "no rows"
    cells = [[plain(cell(r)) for _, cell in COLUMNS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(COLUMNS)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(COLUMNS, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    ranked = sum(1 for r in rows if r.rank is not None)
    lines.append(f"{ranked} of {len(rows)} row(s) ranked by {RANK_LABELS[by]} (descending), per workload")
    return "\n".join(lines + _notes(rows, TEXT_CHARS))


def _markdown_cell(text: str) -> str:
    text = plain(text, None).replace("\\", "\\\\")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for c in "|`*_[]#!":
        text = text.replace(c, "\\" + c)
    return text


def format_markdown(rows: Sequence[Row], by: str) -> str:
    """The table in Markdown (strings escaped: no HTML, links or emphasis from a package), and the notes."""
    headers = [h for h, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_markdown_cell(cell(r)) for _, cell in COLUMNS) + " |" for r in rows]
    notes = [f"- {_markdown_cell(n)}" for n in _notes(rows, None)]
    intro = f"Ranked by {RANK_LABELS[by]} (descending), per workload; only accepted packages are ranked."
    return "\n".join([intro, "", *lines, *(["", *notes] if notes else [])]) + "\n"


def _csv_safe(value: object) -> object:
    """A string a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``) starts with a quote instead."""
    if isinstance(value, str) and value and value[0] in "=+-@\t\r":
        return "'" + value
    return value


CSV_FIELDS = (
    "rank", "workload", "system", "submitter", "site", "nodes", "planned_nodes", "trained_nodes", "accelerators",
    "backend", "precision",
    "ops_per_s", "ops_olympic_mean", "ops_min", "ops_max", "ops_cv", "regulated", "regulated_cv", "tokens_per_s",
    "rpeak_flops", "ops_over_rpeak", "ops_over_ceiling", "engine_efficiency", "compile_critical_fraction",
    "ops_per_watt", "energy_level",
    "runs", "duration_s", "official", "verdict", "note", "package",
)  # fmt: skip


def csv_records(rows: Sequence[Row]) -> list[dict[str, object]]:
    """One record per row with the figures as numbers (OPS, FLOP/s, fractions, seconds) for a spreadsheet."""
    records = []
    for r in rows:
        ops, reg = r.ops, r.regulated
        values = (
            r.rank, r.workload, r.system, r.submitter, r.site, r.nodes, r.planned_nodes, r.trained_nodes,
            r.accelerators, r.backend, r.precision,
            ops.median if ops else None, ops.olympic_mean if ops else None, ops.min if ops else None,
            ops.max if ops else None, ops.cv if ops else None, reg.median if reg else None, reg.cv if reg else None,
            r.tokens_per_s,
            r.rpeak, r.ops_over_rpeak, r.ops_over_ceiling, r.engine_efficiency, r.compile_critical,
            r.ops_per_watt, r.energy_level,
            r.runs, r.duration_s, r.official, "accepted" if r.accepted else "rejected", r.note, r.package,
        )  # fmt: skip
        records.append({k: _csv_safe(v) for k, v in zip(CSV_FIELDS, values, strict=True)})
    return records


def format_csv(rows: Sequence[Row]) -> str:
    """The rows as CSV (pandas), one header line, figures in base units."""
    import pandas as pd

    buffer = io.StringIO()
    pd.DataFrame(csv_records(rows), columns=list(CSV_FIELDS)).to_csv(buffer, index=False, lineterminator="\n")
    return buffer.getvalue()


def write_text(path: str | Path, text: str) -> Path:
    """Write one output file whole (a failed write is one line, exit 1)."""
    path = Path(path)
    try:
        write_atomic(path, text.encode())
    except OSError as exc:
        raise os_error(exc, path, "write", exit_code=1) from None
    return path


def make_list(
    paths: Sequence[str | Path],
    by: str = "ops",
    *,
    csv_path: str | Path | None = None,
    md_path: str | Path | None = None,
    html_path: str | Path | None = None,
    check: Checker | None = None,
) -> str:
    """Rank the packages under ``paths``, write the files asked for, and return the plain table."""
    rows = rank_rows(read_rows(paths, check), by)
    if csv_path is not None:
        write_text(csv_path, format_csv(rows))
    if md_path is not None:
        write_text(md_path, format_markdown(rows, by))
    if html_path is not None:
        from aiperf.submission.list_page import render_list_page

        write_text(html_path, render_list_page(rows, by, [str(p) for p in paths]))
    return format_table(rows, by)
