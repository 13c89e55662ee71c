"""The list as one self-contained HTML page: a sortable table and two plots, nothing fetched from anywhere.

Built like the run report (:mod:`aiperf.results.report`, whose style and scripts it shares): the
plots are matplotlib PNGs embedded as ``data:`` URIs, the style and the sort script are inline,
so the page can be published or mailed as one file. Every string on it came from a package
someone else wrote, so each is escaped (``html.escape``, quotes included) and every plot label
is cut short and has its ``$`` escaped (matplotlib would read it as mathematics). The plots show
accepted packages only: a rejected package's figures have not been checked.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter

from aiperf.metrics.score import format_ops
from aiperf.results.plots import new_figure, to_png
from aiperf.results.report import ERROR_HOOK, SORT_SCRIPT, STYLE, figure_html
from aiperf.submission.listing import COLUMNS, plain
from aiperf.submission.ranking import RANK_LABELS, Row

MAX_BARS = 40  # systems in the efficiency plot (the best by OPS / Rpeak)
MAX_KINDS = 10  # device kinds with their own colour in the scaling plot
LABEL_CHARS = 32
PAGE_STYLE = """
main { max-width: 1680px; }
td { max-width: 280px; overflow-wrap: break-word; } td.num { white-space: nowrap; }
tr.rejected td { color: #8a939e; } tr.unranked td { color: #5b6572; }
td.finding { max-width: 360px; overflow-wrap: anywhere; font-size: 12px; }
.wrap { overflow-x: auto; }
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _label(text: str) -> str:
    """A plot label from a package: short, one line, no mathematics."""
    text = plain(text, LABEL_CHARS).replace("$", r"\$")
    return " " + text if text.startswith("_") else text  # matplotlib hides legend labels starting with "_"


def scaling_plot(rows: Sequence[Row]) -> bytes | None:
    """OPS against the number of devices, log-log, one colour per kind of device (accepted rows)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if not r.accepted:
            continue
        for p in r.devices:
            ops = p.ops_per_s if p.ops_per_s is not None else (r.ops.median if len(r.devices) == 1 and r.ops else None)
            if ops and ops > 0:
                series.setdefault(f"{p.device} ({p.unit}s)", []).append((p.count, ops))
    if not series:
        return None
    fig, ax = new_figure()
    kinds = sorted(series, key=lambda k: -len(series[k]))
    for i, kind in enumerate(kinds):
        points = sorted(series[kind])
        own = i < MAX_KINDS
        ax.plot(
            [c for c, _ in points],
            [o for _, o in points],
            marker="o",
            linestyle="-" if own else "none",
            color=f"C{i}" if own else "#aaaaaa",
            label=_label(kind) if own else None,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ops_text = FuncFormatter(lambda v, _pos: format_ops(v) if v > 0 else "0")
    count_text = FuncFormatter(lambda v, _pos: f"{v:g}")
    for axis, formatter in ((ax.yaxis, ops_text), (ax.xaxis, count_text)):  # 1-2-5 ticks: labels within a decade
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(formatter)
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("devices the runs trained on (accelerators, or CPU cores)", fontsize=9)
    ax.set_title("OPS against device count, per kind of device", fontsize=10)
    ax.legend(fontsize=7, title="device" + (f" (first {MAX_KINDS}; others grey)" if len(kinds) > MAX_KINDS else ""))
    return to_png(fig)


def efficiency_plot(rows: Sequence[Row]) -> bytes | None:
    """OPS / Rpeak and OPS / measured ceiling per system and workload (accepted rows with an Rpeak)."""
    known = [r for r in rows if r.accepted and r.ops_over_rpeak is not None]
    known = sorted(known, key=lambda r: -(r.ops_over_rpeak or 0.0))[:MAX_BARS]
    if not known:
        return None
    fig, ax = new_figure(height=max(2.4, 0.9 + 0.32 * len(known)))
    y = range(len(known))
    ax.barh([v - 0.2 for v in y], [r.ops_over_rpeak or 0 for r in known], height=0.4, label="OPS / Rpeak")
    ax.barh(
        [v + 0.2 for v in y],
        [r.ops_over_ceiling or 0 for r in known],
        height=0.4,
        label="OPS / measured ceiling",
        color="#ff7f0e",
    )
    ax.set_yticks(list(y), [_label(f"{r.system} ({r.workload})") for r in known], fontsize=7)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_title("Efficiency per system" + (f" (the best {MAX_BARS})" if len(known) == MAX_BARS else ""), fontsize=10)
    ax.set_xlim(0, 1.3 * max(max(r.ops_over_rpeak or 0, r.ops_over_ceiling or 0) for r in known) or 1)
    ax.legend(fontsize=7, loc="lower right")
    return to_png(fig)


# The value a column sorts by, where it is a number (the text of the other cells sorts as text).
SORT_VALUES: dict[str, Callable[[Row], float | None]] = {
    "rank": lambda r: r.rank,
    "nodes": lambda r: r.nodes,
    "OPS": lambda r: r.value("ops"),
    "regulated OPS": lambda r: r.value("regulated"),
    "tokens/s": lambda r: r.tokens_per_s,
    "Rpeak": lambda r: r.rpeak,
    "OPS/Rpeak": lambda r: r.ops_over_rpeak,
    "OPS/ceiling": lambda r: r.ops_over_ceiling,
    "engine": lambda r: r.engine_efficiency,
    "OPS per watt": lambda r: r.ops_per_watt,
    "runs": lambda r: r.runs,
    "duration": lambda r: r.duration_s,
}


def _cell(header: str, cell: Callable[[Row], str], row: Row) -> str:
    text = _e(plain(cell(row), None))
    if header not in SORT_VALUES:
        return f"<td>{text}</td>"
    value = SORT_VALUES[header](row)
    return f'<td class="num" data-value="{"" if value is None else _e(repr(float(value)))}">{text}</td>'


def _table(rows: Sequence[Row]) -> str:
    head = "".join(f'<th data-key="{_e(h)}">{_e(h)}</th>' for h, _ in COLUMNS) + '<th data-key="note">note</th>'
    body = []
    for r in rows:
        cls = "rejected" if not r.accepted else ("unranked" if r.rank is None else "ranked")
        cells = "".join(_cell(h, cell, r) for h, cell in COLUMNS)
        body.append(f'<tr class="{cls}">{cells}<td class="finding">{_e(plain(r.note or "", None))}</td></tr>')
    return (
        f'<div class="wrap"><table class="sortable" id="list"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def render_list_page(rows: Sequence[Row], by: str, sources: Sequence[str] = ()) -> str:
    """The page as a string (``rows`` in list order, as :func:`aiperf.submission.ranking.rank_rows` gives them)."""
    from aiperf import __version__

    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    ranked = sum(1 for r in rows if r.rank is not None)
    rejected = sum(1 for r in rows if not r.accepted)
    workloads = sorted({r.workload for r in rows})
    body = (
        "<h1>aiperf list</h1>"
        f'<div class="sub">{len(rows)} row(s) from {len(set(r.package for r in rows))} package(s) &middot; '
        f"{ranked} ranked by {_e(RANK_LABELS[by])} (descending, per workload) &middot; {rejected} rejected"
        f" &middot; workloads: {_e(', '.join(plain(w) for w in workloads))}</div>"
        "<p>Only packages <code>aiperf check</code> accepted are ranked; rows whose figure is unknown follow"
        " them, and rejected packages are listed last with their first finding. OPS, regulated OPS and"
        " tokens/s (a language workload's training tokens per second) are the median of each entry's runs"
        " (runs: count and coefficient of variation of OPS); OPS per watt"
        " covers only what was metered, at the methodology level shown. Click a column's header to sort.</p>"
        + _table(rows)
        + '<h2>Plots</h2><div class="grid">'
        + figure_html(
            scaling_plot(rows),
            "Median OPS of each accepted entry against the devices it trained on, log-log; a line joins the entries"
            " of one kind of device.",
            "OPS against device count",
            empty="nothing to plot",
        )
        + figure_html(
            efficiency_plot(rows),
            "Median OPS / Rpeak (dense vendor figures) and OPS / measured matmul ceiling of each accepted entry.",
            "Efficiency per system",
            empty="nothing to plot",
        )
        + "</div>"
        + f"<footer>Generated {generated} by aiperf {_e(__version__)} from"
        f" {_e(', '.join(plain(s, None) for s in sources[:20]))}{' ...' if len(sources) > 20 else ''}."
        " Every figure can be re-checked with <code>aiperf check DIR</code>.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>aiperf list: {ranked} ranked</title>"
        f"<style>{STYLE}{PAGE_STYLE}</style><script>{ERROR_HOOK}</script></head>"
        f"<body><main>{body}</main><script>{SORT_SCRIPT}</script></body></html>\n"
    )
