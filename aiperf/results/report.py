"""``aiperf report``: one self-contained HTML page that explains a run to a person.

Everything comes from the run directory (the ledger, plus ``telemetry.jsonl`` when present)
and goes into a single file: plots are PNGs embedded as base64 ``data:`` URIs, the style
and the small script (sortable tables) are inline, and nothing refers to any other file or
any network address, so the page can be mailed, archived or opened offline as it is.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import pandas as pd

from aiperf.errors import os_error
from aiperf.ledger.files import write_atomic
from aiperf.ledger.inert import inert_lines
from aiperf.ledger.schema import Record, RunStartRecord
from aiperf.ledger.store import LEDGER_NAME, iter_ledger
from aiperf.metrics.rules import VerdictDict
from aiperf.metrics.score import format_ops, format_percent, score_timeline
from aiperf.metrics.steadiness import SteadinessDict
from aiperf.results import plots
from aiperf.results.efficiency import EfficiencySummary
from aiperf.results.size_pace import format_size_pace
from aiperf.results.summary import RunDigest, build_summary, format_rate, format_telemetry
from aiperf.results.summary_model import RunSummary
from aiperf.results.tables import RunResults, load
from aiperf.sampling.energy import joules_text
from nas.schedule import SizeSchedule

REPORT_NAME = "report.html"
# Epochs and trials the report's plots draw at most: a longer run's are an even sample (every k-th,
# aiperf.results.tables), which its scatter plots show as they would show every point; OPS per node
# weights each sampled epoch by k. The score, the timeline and the summary count every record.
REPORT_ROWS = 20_000
TOP_ARCHITECTURES = 15

STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 0; color: #1d232b;
       background: #f5f6f8; }
main { max-width: 1180px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px 0; } h2 { font-size: 17px; margin: 28px 0 10px 0; }
.sub { color: #5b6572; font-size: 13px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin-top: 16px; }
.card { background: #fff; border-radius: 8px; padding: 12px 16px; box-shadow: 0 1px 3px rgba(0,0,0,.12);
        min-width: 150px; }
.card .label { font-size: 12px; color: #5b6572; } .card .value { font-size: 22px; font-weight: 600; }
.card.headline { border-left: 6px solid #1f77b4; } .card .value.big { font-size: 28px; }
.badge { display: inline-block; padding: 3px 10px; border-radius: 12px; font-weight: 600; font-size: 13px; }
.valid { background: #d8f3dc; color: #1b5e20; } .unofficial { background: #fff3cd; color: #7a5a00; }
.invalid { background: #fde2e1; color: #9b1c1c; }
.note { background: #fff3cd; color: #7a5a00; padding: 6px 10px; border-radius: 6px; font-size: 13px; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 14px; }
figure { background: #fff; margin: 0; padding: 8px; border-radius: 8px; box-shadow: 0 1px 3px rgba(0,0,0,.12); }
figure img { width: 100%; height: auto; display: block; } figcaption { font-size: 12px; color: #5b6572; }
figure.wide { grid-column: 1 / -1; }
.empty { padding: 40px; text-align: center; color: #8a939e; font-size: 13px; }
table { border-collapse: collapse; background: #fff; font-size: 12.5px; box-shadow: 0 1px 3px rgba(0,0,0,.12); }
th, td { padding: 5px 9px; border-bottom: 1px solid #e6e8eb; text-align: left; vertical-align: top; }
th { background: #eef0f3; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; } table.sortable th:hover { background: #e1e5ea; }
.pass { color: #1b5e20; font-weight: 600; } .fail { color: #9b1c1c; font-weight: 600; }
.pairs { width: 100%; table-layout: fixed; } .pairs th { width: 38%; } .pairs td { overflow-wrap: anywhere; }
.two { display: grid; grid-template-columns: repeat(auto-fit, minmax(360px, 1fr)); gap: 14px; align-items: start; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
pre { background: #fff; padding: 10px; overflow-x: auto; max-height: 420px; }
footer { margin-top: 32px; font-size: 12px; color: #5b6572; }
"""

# Errors anywhere on the page are recorded on <html data-errors>, and the last script marks
# <body data-ready> once it has run: a headless browser can then tell a page that works.
ERROR_HOOK = """
window.addEventListener('error', function (e) {
  var root = document.documentElement;
  var seen = root.getAttribute('data-errors');
  root.setAttribute('data-errors', (seen ? seen + ' | ' : '') + String(e.message));
});
"""

SORT_SCRIPT = """
(function () {
  function key(cell) {
    var v = cell.getAttribute('data-value');
    if (v !== null && v !== '' && !isNaN(parseFloat(v))) { return parseFloat(v); }
    return cell.textContent.trim().toLowerCase();
  }
  var tables = document.querySelectorAll('table.sortable');
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.title = 'sort by this column';
      th.addEventListener('click', function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var ascending = th.getAttribute('data-order') !== 'asc';
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
          return ascending ? c : -c;
        });
        th.setAttribute('data-order', ascending ? 'asc' : 'desc');
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  window.addEventListener('load', function () {
    var images = document.images, shown = 0;
    for (var i = 0; i < images.length; i++) { if (images[i].naturalWidth > 0) { shown++; } }
    document.body.setAttribute('data-images', shown + '/' + images.length);
  });
  document.body.setAttribute('data-ready', '1');
})();
"""


def _e(value: object) -> str:
    """Text for the page: HTML escaped, and control or format characters (a bidi override) shown as escapes."""
    return html.escape(inert_lines(value))


def _num(value: object, fmt: str = "{:,}") -> str:
    """A right-aligned numeric cell that sorts by its value."""
    if value is None or (isinstance(value, float) and value != value):
        return '<td class="num" data-value="">-</td>'
    return f'<td class="num" data-value="{value}">{_e(fmt.format(value))}</td>'


def _table(headers: list[str], rows: list[str], sortable: bool = False) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _pairs(items: Sequence[tuple[str, object]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items)
    return f'<table class="pairs"><tbody>{rows}</tbody></table>'


def figure_html(png: bytes | None, caption: str, alt: str, wide: bool = False, empty: str = "nothing recorded") -> str:
    """A captioned ``<figure>`` with the PNG inline (the page stays one file), or a note when there is no plot."""
    cls = ' class="wide"' if wide else ""
    if png is None:
        return (
            f'<figure{cls}><div class="empty">{_e(alt)}: {_e(empty)}</div>'
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )
    data = base64.b64encode(png).decode()
    return (
        f'<figure{cls}><img alt="{_e(alt)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _or_unknown(value: object) -> object:
    """A header field the page shows as ``?`` where the ledger does not state it."""
    return "?" if value is None else value


def _measured(value: object) -> object:
    """A rule's measured figure as the rest of the page shows figures (0.8858, not 0.885794); words as they are."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.4g}" if number == number and abs(number) != float("inf") else value


def _verdict_class(verdict: VerdictDict) -> str:
    if not verdict["valid"]:
        return "invalid"
    return "valid" if verdict["official"] else "unofficial"


def _steadiness_card(steady: SteadinessDict | None) -> tuple[str, str, str, str]:
    """The run's own spread: the steady part's OPS with its 95 % interval (summaries before it: none)."""
    if not steady:
        return ("", "steady OPS", "-", "too few epochs to tell")
    return (
        "",
        "steady OPS",
        f"{format_ops(steady['steady_ops_per_s'])} ± {100 * steady['half_width']:.1f} %",
        f"95 % interval over {steady['windows']} windows of {steady['window_s']:.0f} s after start-up;"
        f" windows vary {100 * steady['window_cv']:.1f} %",
    )


def _efficiency_card(e: EfficiencySummary | None) -> tuple[str, str, str, str]:
    """OPS against Rpeak and against the measured matmul ceiling (docs/system.md); "-" where unknown."""
    if not e:
        return ("", "efficiency", "-", "not recorded (a summary from before 2026-11-25)")
    peak = f"{format_percent(e['ops_over_rpeak'])} of Rpeak" if e.get("ops_over_rpeak") is not None else "Rpeak unknown"
    ceiling, ceiling_flops = e.get("ops_over_ceiling"), e.get("ceiling_flops")
    note = (
        f"{format_percent(ceiling)} of the measured ceiling {format_ops(ceiling_flops, 'FLOP/s')}"
        if ceiling is not None and ceiling_flops is not None  # a ratio to the ceiling has its ceiling
        else "ceiling not measured"
    )
    rpeak = e.get("rpeak_flops")
    if rpeak:
        note += f"; Rpeak {format_ops(rpeak, 'FLOP/s')} ({', '.join(e.get('rpeak_sources') or [])}, dense)"
    return ("", "OPS / Rpeak", peak, note)


def _efficiency_section(summary: RunSummary) -> str:
    """Per kind of device: its devices, Rpeak (with its source), measured ceiling and both ratios."""
    e = summary.get("efficiency")
    if not e or not e.get("by_device"):
        return ""

    def flops(value: float | None) -> str:
        return format_ops(value, "FLOP/s") if value else "unknown"

    share = format_percent

    rows = [
        f"<tr><td>{_e(d['device'])}</td><td>{d['devices']} {_e(d['unit'])}(s) on {d['nodes']} node(s)</td>"
        f"<td>{_e(d['precision'])}</td><td>{_e(format_ops(d['ops_per_s']))}</td>"
        f"<td>{_e(flops(d['rpeak_flops']))}</td><td>{_e(d.get('rpeak_source') or '-')}</td>"
        f"<td>{_e(share(d['ops_over_rpeak']))}</td><td>{_e(flops(d['ceiling_flops']))}</td>"
        f"<td>{_e(share(d['ops_over_ceiling']))}</td></tr>"
        for d in e["by_device"]
    ]
    references = "".join(
        f'<p class="sub">{_e(d["device"])}: {_e(d.get("rpeak_arithmetic"))}; {_e(d.get("rpeak_reference"))}</p>'
        for d in e["by_device"]
        if d.get("rpeak_reference")
    )
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in e.get("notes") or [])
    headers = ["device", "used", "precision", "OPS", "Rpeak", "source", "OPS / Rpeak", "ceiling", "OPS / ceiling"]
    return '<h2 id="efficiency">Efficiency</h2>' + notes + _table(headers, rows) + references


def _language_cards(summary: RunSummary) -> list[tuple[str, str, str, str]]:
    """A language run's cards beside OPS: tokens per second over the score's duration, AIPerf's count
    (none: it counts images), and the best bits per byte with the quality they give."""
    s, language = summary["score"], summary["language"]
    bits, acc = language.get("best_bits_per_byte"), s.get("best_val_acc")
    return [
        (
            "",
            "tokens per second",
            format_rate(language["tokens_per_s"], "tokens/s"),
            f"{format_rate(language['tokens'], 'tokens')} trained in {s['wall_s']:.1f} s",
        ),
        ("", "AIPerf-compatible", "-", "AIPerf's conventions count images: none in a language run"),
        _steadiness_card(summary.get("steadiness")),
        _efficiency_card(summary.get("efficiency")),
        (
            "",
            "best validation bits per byte",
            f"{bits:.4f}" if bits is not None else "-",
            (f"trial {language.get('best_bits_per_byte_trial')}; " if bits is not None else "")
            + (f"quality 1 - bits/byte / 8 = {acc:.4f}; " if acc is not None else "")
            + f"quality factor {s['quality']:.3f}",
        ),
    ]


def _headline(summary: RunSummary) -> str:
    s, v = summary["score"], summary["verdict"]
    acc = s.get("best_val_acc")
    language = summary.get("language") is not None
    cards = [
        (
            "headline",
            "regulated score",
            s["regulated_human"],
            "OPS x |ln(1 - best quality)|" if language else "OPS x |ln(1 - best accuracy)|",
        ),
        ("", "OPS", s["ops_human"], f"{format_ops(s['total_ops'], 'OP')} counted in {s['wall_s']:.1f} s"),
    ]
    if language:
        cards += _language_cards(summary)
    else:
        cards += [
            ("", "AIPerf-compatible", s["aiperf_regulated_human"], "regulated, AIPerf's FLOP conventions"),
            _steadiness_card(summary.get("steadiness")),
            _efficiency_card(summary.get("efficiency")),
            (
                "",
                "best validation accuracy",
                f"{acc:.4f}" if acc is not None else "-",
                f"quality factor {s['quality']:.3f}",
            ),
        ]
    cards += [
        (
            "",
            "trials",
            f"{summary['trials']['started']}",
            f"{summary['trials']['distinct_architectures']} architectures, "
            f"{summary['trials']['epochs_counted']} epochs",
        ),
    ]
    html_cards = "".join(
        f'<div class="card {cls}"><div class="label">{_e(label)}</div>'
        f'<div class="value{" big" if cls else ""}">{_e(value)}</div><div class="sub">{_e(note)}</div></div>'
        for cls, label, value, note in cards
    )
    badge = f'<span class="badge {_verdict_class(v)}" id="verdict">{_e(v["headline"])}</span>'
    notes = "".join(f'<p class="note" id="verdict-note">{_e(n)}</p>' for n in v.get("notes") or [])
    if "comparable" in v:  # summaries written before workloads carried their rules have no such field
        notes += (
            f'<p class="sub" id="verdict-workload">Workload {_e(v.get("workload"))}, under its own rules'
            " (comparable with other runs of it).</p>"
            if v["comparable"]
            else f'<p class="note" id="verdict-workload">custom rules: not comparable: {_e("; ".join(v["custom"]))}</p>'
        )
    rules = [
        f"<tr><td>{_e(r['name'])}</td><td>{_e(_measured(r['measured']))}</td><td>{_e(r['required'])}</td>"
        f'<td class="{"pass" if r["passed"] else "fail"}">{"pass" if r["passed"] else "FAIL"}</td></tr>'
        for r in v["rules"]
    ]
    return (
        f'<div class="cards">{html_cards}</div>'
        f"<h2>Verdict {badge}</h2>{notes}"
        f'<p class="sub">Run status: {_e(summary["status"])} ({_e(summary["stop_reason"])}).</p>'
        + _table(["rule", "measured", "required", ""], rules)
    )


def _hostnames(header: RunStartRecord) -> dict[str, str]:
    return {n.node_id: n.hostname or "" for n in header.plan.nodes}


def run_rate(summary: Mapping[str, object]) -> tuple[float, float, int] | None:
    """The run's wall time, OPS and nodes, from its summary (None where it has no score yet)."""
    score, devices = summary.get("score"), summary.get("devices")
    if not (isinstance(score, dict) and isinstance(devices, dict)):
        return None
    wall, ops, nodes = score.get("wall_s"), score.get("ops_per_s"), devices.get("nodes")
    if not (isinstance(wall, (int, float)) and isinstance(ops, (int, float)) and isinstance(nodes, int)):
        return None
    return float(wall), float(ops), nodes


def _plots(results: RunResults, summary: RunSummary) -> str:
    timeline = results.timeline or score_timeline(results.records)
    hosts = _hostnames(results.header)
    language = _language(results)
    quality = "best quality" if language else "best accuracy"
    progress = (
        figure_html(
            plots.best_bits_per_byte_over_time(timeline, results.epochs),
            "Grey: each counted epoch. Green: the best validation bits per byte so far.",
            "best validation bits per byte",
        )
        if language
        else figure_html(
            plots.best_error_over_time(timeline, results.epochs),
            "Grey: each counted epoch. Green: the best validation error so far.",
            "best validation error",
        )
    )
    figures = [
        figure_html(
            plots.score_over_time(timeline, quality),
            "Each point is the score had the run stopped then.",
            "score over time",
        ),
        progress,
        figure_html(
            plots.ops_per_node(results.epochs, hosts, weight=results.epochs_stride, run=run_rate(summary)),
            "Counted operations of the epochs each node completed, per second (each epoch's shared among the bins"
            " it trained in). Dashed: the run's OPS (all counted operations over its wall time) per node.",
            "OPS per node",
        ),
        figure_html(
            plots.busy_fraction(results.workers),
            "Time in training and evaluation steps over each worker's lifetime.",
            "busy fraction",
        ),
    ]
    if not results.telemetry.empty:
        figures.append(
            figure_html(
                plots.utilisation(results.telemetry, hosts), format_telemetry(summary["telemetry"]), "utilisation"
            )
        )
    pace = summary.get("size_pace")
    budget = results.header.config.run.time_budget_s
    if pace is not None and budget:
        schedule = SizeSchedule(pace["start"], pace["end"], pace["width"])
        figures.append(
            figure_html(
                plots.size_schedule(results.epochs, results.trials, schedule.band, float(budget)),
                f"Green: the band of training FLOPs per image the workload fixes over the run; blue: each counted "
                f"epoch at its network's size. {format_size_pace(pace)}.",
                "trained sizes against the size schedule",
            )
        )
    colour = "best quality (1 - bits per byte / 8)" if language else "best validation accuracy"
    figures.append(
        figure_html(
            plots.lineage(results.trials, colour),
            "Each trial at its start time and generation; lines join parent to child. Marker: star seed, "
            f"circle new architecture, square re-tuned hyperparameters. Colour: {colour}.",
            "architecture lineage",
            wide=True,
        )
    )
    return f'<div class="grid">{"".join(figures)}</div>'


def _language(results: RunResults) -> bool:
    return results.header.family == "language"


# The top-trials table: (header, column of RunResults.trials, number format); None formats text.
# One list per family, the columns both share first and last.
_TRIAL_COLUMNS = [("trial", "trial", None), ("kind", "kind", None), ("architecture", "arch_id", None)]
_ARCH_COLUMNS = [("generation", "depth", "{}"), ("params", "params", "{:,}")]
_END_COLUMNS = [("status", "status", None), ("morphisms", "lineage", None)]
_IMAGE_COLUMNS = [
    *_TRIAL_COLUMNS,
    *_ARCH_COLUMNS,
    ("train FLOPs/image", "flops_train_per_image", "{:,.0f}"),
    ("eval FLOPs/image", "flops_eval_per_image", "{:,.0f}"),
    ("batch", "batch_size", "{}"),
    ("learning rate", "learning_rate", "{:.3g}"),
    ("epochs", "epochs", "{}"),
    ("best accuracy", "best_val_acc", "{:.4f}"),
    *_END_COLUMNS,
]
_LANGUAGE_COLUMNS = [
    *_TRIAL_COLUMNS,
    *_ARCH_COLUMNS,
    ("train FLOPs/token", "flops_train_per_token", "{:,.0f}"),
    ("eval FLOPs/token", "flops_eval_per_token", "{:,.0f}"),
    ("batch (sequences)", "batch_size", "{}"),
    ("sequence length", "seq_len", "{}"),
    ("learning rate", "learning_rate", "{:.3g}"),
    ("epochs", "epochs", "{}"),
    ("best bits/byte", "best_bits_per_byte", "{:.4f}"),
    ("quality", "best_val_acc", "{:.4f}"),
    *_END_COLUMNS,
]


def _trials_table(trials: pd.DataFrame, columns: list[tuple[str, str, str | None]]) -> str:
    """The best trials, ranked, one row each: numbers right-aligned and sortable, the architecture as code."""
    rows = []
    for rank, r in enumerate(trials.head(TOP_ARCHITECTURES).to_dict("records"), start=1):
        cells = [_num(rank, "{}")]
        for _, name, fmt in columns:
            if fmt is not None:
                cells.append(_num(r[name], fmt))
            elif name == "arch_id":
                cells.append(f"<td><code>{_e(r[name])}</code></td>")
            else:
                cells.append(f"<td>{_e(r[name])}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return _table(["#", *(header for header, _, _ in columns)], rows, sortable=True)


def _top_architectures(results: RunResults) -> str:
    trials = results.trials.dropna(subset=["best_val_acc"]).sort_values(
        ["best_val_acc", "start_t"], ascending=[False, True], kind="stable"
    )
    shown = min(TOP_ARCHITECTURES, len(trials))
    total = max(results.trials_total, len(results.trials))
    if _language(results):
        note = f'<p class="sub">The {shown} best of {total} trials (lowest bits per byte); click a column to sort.</p>'
        return note + _trials_table(trials, _LANGUAGE_COLUMNS)
    note = f'<p class="sub">The {shown} most accurate of {total} trials; click a column to sort.</p>'
    return note + _trials_table(trials, _IMAGE_COLUMNS)


def _input_section(summary: RunSummary) -> str:
    """How the images reached the trainers: storage, time spent waiting for input, skipped images."""
    inp, bad = summary.get("input") or {}, summary.get("bad_images") or {}
    if not inp:
        return ""
    share = inp.get("wait_fraction")
    items = [
        ("storage", "streamed (decoded on the workers)" if inp.get("storage") == "stream" else "resident arrays"),
        ("decode threads per worker", ", ".join(str(t) for t in inp.get("decode_threads") or []) or "-"),
        ("waiting for input", f"{100 * share:.1f} % of step time" if share is not None else "not measured"),
        ("data wait / step time", f"{inp.get('data_wait_s', 0):.1f} s / {inp.get('train_s', 0):.1f} s"),
        ("images skipped (undecodable)", bad.get("count", 0) - (bad.get("missing") or 0)),
        ("images skipped (missing: deleted since the run began)", bad.get("missing") or 0),
    ]
    note = ""
    if inp.get("starved_workers"):
        note = (
            f'<p class="fail">{len(inp["starved_workers"])} worker(s) waited more than '
            f"{100 * inp['starved_threshold']:.0f} % of their step time for input: the input pipeline limits this run."
            "</p>"
        )
    rows = [
        f"<tr><td>{_e(w)}</td>{_num(100 * f if f is not None else None, '{:.1f}')}</tr>"
        for w, f in sorted((inp.get("per_worker_wait_fraction") or {}).items())
    ]
    skipped = ""
    if bad.get("files"):
        skipped = "<h2>Skipped images</h2><pre>" + _e("\n".join(bad["files"])) + "</pre>"
    return (
        '<h2>Input pipeline</h2><div class="two"><div>'
        + _pairs(items)
        + note
        + "</div><div>"
        + _table(["worker", "% of step time waiting"], rows, sortable=True)
        + "</div></div>"
        + skipped
    )


def _energy_section(summary: RunSummary) -> str:
    """Energy: OPS per watt with its methodology level, what it covers and from which sources, or "not measured"."""
    energy = summary.get("energy")
    if not energy:
        return ""  # a summary from before the energy section
    if not energy.get("measured"):
        rows = [(k.replace("_", " "), v) for k, v in sorted((energy.get("not_available") or {}).items())]
        return f'<h2 id="energy">Energy: not measured</h2><p class="sub">{_e(energy.get("headline"))}</p>' + (
            _pairs(rows) if rows else ""
        )
    per_op, per_watt, joules = energy.get("joules_per_op"), energy.get("ops_per_watt"), energy.get("energy_j")
    items = [
        ("OPS per watt", format_ops(per_watt, "OPS/W") if per_watt else "-"),
        ("energy per counted operation", joules_text(per_op) if per_op is not None else "-"),
        ("methodology level", f"{energy.get('level_text')} (EEHPC WG power measurement methodology, v2.0 RC 1.0)"),
        ("covers", energy.get("covers_text")),
        ("sources", "; ".join(energy.get("sources") or [])),
        ("meter kind", energy.get("meter_kind")),
        (
            "nodes metered",
            f"{energy.get('hosts_metered')} of {energy.get('hosts')}"
            + (" (power extrapolated to all)" if energy.get("extrapolated") else ""),
        ),
        ("mean power", f"{energy['power_w']:.1f} W" if energy.get("power_w") is not None else "-"),
        (  # a measured section always has its energy
            "energy metered",
            f"{format_ops(joules, 'J') if joules is not None else '-'} over {energy.get('span_s') or 0:.0f} s",
        ),
    ]
    aspects = [
        f"<tr><td>{_e(name.replace('_', ' '))}</td><td>{_e(a.get('level') or 'below 1')}</td>"
        f"<td>{_e(a.get('why'))}</td></tr>"
        for name, a in (energy.get("aspects") or {}).items()
    ]
    parts = [
        (
            k.replace("_", " "),
            f"{format_ops(v['energy_j'], 'J')}, mean {v['power_w']:.1f} W, {v['source']}, {v['hosts']} node(s)",
        )
        for k, v in (energy.get("by_subsystem") or {}).items()
    ]
    parts += [(f"{k.replace('_', ' ')} (not available)", v) for k, v in (energy.get("not_available") or {}).items()]
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in energy.get("notes") or [])
    return (
        f'<h2 id="energy">Energy: {_e(energy.get("level_text"))}</h2>{notes}<div class="two"><div>'
        + _pairs(items)
        + "</div><div>"
        + _table(["aspect", "level", "why"], aspects)
        + "</div></div>"
        + _pairs(parts)
    )


def _system(header: RunStartRecord, summary: RunSummary) -> str:
    plan = header.plan
    nodes = [
        f"<tr><td>{_e(n.hostname or n.node_id[:12])}</td>{_num(n.cpus, '{:g}')}"
        f"{_num(n.gpus, '{:g}')}<td>{_e(n.accelerator or '-')}</td>"
        f"{_num((n.memory_bytes or 0) / 2**30, '{:.1f}')}<td>{_e(n.cpu_model)}</td></tr>"
        for n in plan.nodes
    ]
    devices = ", ".join(f"{k} x {n}" for k, n in summary["devices"]["workers_by_device"].items()) or "-"
    plan_items = [
        ("placement", plan.placement),
        ("Ray actors", plan.actors or "per_worker"),
        ("concurrent trials", plan.concurrency),
        ("workers by device", devices),
        ("backend", plan.backend),
        ("precision requested / used", f"{plan.precision} / {', '.join(summary['precision']) or '-'}"),
        ("batch size (default)", plan.batch_size),
        ("threads per trial", plan.threads_per_trial),
    ]
    if plan.compile_ahead is not None:  # recorded from 2026-12-07
        state = "on" if plan.compile_ahead else "off"
        plan_items.append(("compile ahead", f"{state} ({plan.compile_ahead_why})" if plan.compile_ahead_why else state))
    if plan.trial_sizing:  # recorded from 2026-12-08
        plan_items.append(("trials", plan.trial_sizing))
    if plan.workload:  # chosen for the host: no --config was named
        plan_items.append(("workload", f"{plan.workload} ({plan.workload_why})"))
    ds = header.dataset
    split = ds.split
    family = (
        [
            ("train tokens", ds.train_tokens),
            ("validation tokens", ds.eval_tokens),
            ("vocabulary", ds.vocab_size),
            ("tokenizer", ds.tokenizer),
            ("bytes per token", ds.bytes_per_token),
        ]
        if header.family == "language"
        else [
            ("train images", ds.train_images),
            ("validation images", ds.eval_images),
            ("input shape", ds.input_shape),
            ("classes", ds.num_classes),
        ]
    )
    split_text = (
        f"{_or_unknown(split.method)}, seed {_or_unknown(split.seed)}, disjoint: {split.disjoint}"
        if split is not None
        else "?, seed ?, disjoint: None"
    )
    dataset_items = [
        ("name", ds.name),
        ("source", ds.source),
        *family,
        ("storage", ds.storage or ("stream" if ds.streaming else "memory")),
        ("split", split_text),
        ("fingerprint", ds.fingerprint),
    ]
    versions = sorted(header.versions.items())
    system = header.system
    return (
        "<h2>System</h2>"
        + _table(["node", "CPUs", "GPUs", "accelerator", "memory (GiB)", "CPU model"], nodes)
        + f'<p class="sub">Head: {_e(system.head)}; {_e(system.platform)}</p>'
        + '<div class="two"><div><h2>Plan</h2>'
        + _pairs(plan_items)
        + "</div><div><h2>Dataset</h2>"
        + _pairs(dataset_items)
        + "</div><div><h2>Software</h2>"
        + _pairs(versions)
        + "</div><div><h2>Rules in force</h2>"
        + _pairs(sorted(header.rules.model_dump(exclude_unset=True).items()))  # as the header states them
        + "</div></div>"
        + "<details><summary>Full configuration</summary><pre>"
        + _e(json.dumps(header.config.model_dump(exclude_unset=True), indent=2, sort_keys=True))
        + "</pre></details>"
    )


def _audit_section(run_dir: str | Path, records: list[Record]) -> str:
    """What ``aiperf audit`` found (``audit.json``), when it has been run: when, what, pass/fail per trial.

    Shown as passed only when the ledger's audit record names this very file (a file written
    beside the ledger by hand, or edited after the audit, is shown as not vouched for).
    """
    from aiperf.ledger.audit_file import bound_audit

    audit = bound_audit(run_dir, records) if run_dir else None
    if audit is None:
        return ""
    data = audit.data
    at = data.get("audited_at", 0)
    try:  # a number (or text of one) as aiperf audit wrote it; anything else (null, a list) is unknown
        if not isinstance(at, (int, float, str)):
            raise TypeError(at)
        when = datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        when = "?"
    ledger, options = data.get("ledger"), data.get("options")  # audit.json may come from anyone: types checked
    ledger, options = (ledger if isinstance(ledger, dict) else {}), (options if isinstance(options, dict) else {})
    if audit.passed:
        badge, note = "passed", ""
    elif data.get("ok") is not True:
        badge, note = "FAILED", ""
    else:
        badge, note = "not vouched for", f" <b>(audit.json says passed, but {_e(audit.why)})</b>"
    what = (
        f"ledger verified, weight hashes checked, best trial and {options.get('sample')} sampled trial(s)"
        f" re-evaluated, {options.get('retrain')} re-trained (seed {options.get('seed')},"
        f" speed factor {options.get('speed_factor')})"
    )
    trials = data.get("trials")
    trials = trials if isinstance(trials, list) else []
    rows = [
        f"<tr><td>{_e(c.get('trial'))}</td><td>{_e(c.get('check'))}</td><td>{_e(c.get('status'))}</td>"
        f"<td>{_e(c.get('detail'))}</td></tr>"
        for c in trials
        if isinstance(c, dict)
    ]
    machine = data.get("machine")
    machine = machine if isinstance(machine, dict) else {}
    return (
        f"<h2>Audit: {badge}</h2><p>{_e(data.get('message'))}{note}</p>"
        + _pairs([("audited", when), ("checked", what), ("machine", ", ".join(f"{k} {v}" for k, v in machine.items()))])
        + (_table(["trial", "check", "result", "detail"], rows) if rows else "")
    )


# (the share's key in device_time.fractions, its seconds' key in device_time, label, what it holds)
_DeviceTimePart = tuple[
    str,
    Literal["steady_s", "compile_critical_s", "data_wait_s", "between_trials_s", "idle_s", "starting_s"],
    str,
    str,
]
DEVICE_TIME_PARTS: tuple[_DeviceTimePart, ...] = (
    (
        "steady",
        "steady_s",
        "steady steps",
        "train and evaluation steps of counted epochs, less compiling and input waits",
    ),
    ("compile_critical", "compile_critical_s", "compiling (critical path)", "waiting for a step to compile"),
    ("data_wait", "data_wait_s", "waiting for input", "steps waiting for their batch"),
    ("between_trials", "between_trials_s", "between trials", "model build, weights, Ray's hand-over"),
    ("idle", "idle_s", "idle", "no trial to run, and epochs the run's end cut short (not counted)"),
    ("starting", "starting_s", "starting", "before the worker was ready: process, framework, dataset, ceiling"),
)


def _device_time_section(summary: RunSummary) -> str:
    """Where the slots' time went (aiperf.results.device_time) and the engine's efficiency (from 2026-12-07)."""
    section = summary.get("device_time")
    if not section:
        return ""
    fractions = section["fractions"]
    rows = [
        f"<tr><td>{_e(label)}</td><td>{section[seconds]:,.1f}</td>"
        f"<td>{100 * (fractions.get(name) or 0.0):.1f} %</td><td>{_e(what)}</td></tr>"
        for name, seconds, label, what in DEVICE_TIME_PARTS
    ]
    engine = summary["efficiency"].get("engine")
    critical = summary["workers"].get("compile_critical_fraction")
    rate = section.get("steady_rate_ops_per_s")
    lead = (
        f'<p class="sub">{section["slots"]} slot(s) x {section["wall_s"]:,.0f} s. Engine efficiency '
        f"{_e(f'{100 * engine:.1f} %' if engine is not None else '-')}: OPS over slots x the steady device rate "
        f"({_e(format_ops(rate) if rate else '-')} a slot); compiling on the critical path "
        f"{_e(f'{100 * critical:.1f} %' if critical is not None else '-')} of the workers' time.</p>"
    )
    return (
        '<h2 id="device-time">Where the devices\' time went</h2>'
        + lead
        + _table(["part", "slot-seconds", "share", "what"], rows)
    )


def render_report(results: RunResults, summary: RunSummary, run_dir: str | Path = "") -> str:
    """The page as a string."""
    header = results.header
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    started = datetime.fromtimestamp(header.wall, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ledger = summary["ledger"]
    body = (
        f"<h1>aiperf run {_e(summary['run_id'])}</h1>"
        f'<div class="sub">{_e(summary["name"])} &middot; started {started} &middot; dataset '
        f"{_e(summary['dataset']['name'])} &middot; {summary['devices']['nodes']} node(s), "
        f"{summary['devices']['concurrency']} concurrent trials &middot; backend {_e(summary['backend'])}</div>"
        + _headline(summary)
        + "<h2>Progress</h2>"
        + _plots(results, summary)
        + "<h2>Top architectures</h2>"
        + _top_architectures(results)
        + _input_section(summary)
        + _energy_section(summary)
        + _efficiency_section(summary)
        + _device_time_section(summary)
        + _system(header, summary)
        + _audit_section(run_dir, results.records)
        + f"<footer>Computed from {ledger['records']} ledger records; last hash <code>{_e(ledger['last_hash'])}</code>."
        f" Check it with <code>aiperf verify {_e(run_dir)}</code>. Report generated {generated}.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>aiperf {_e(summary['run_id'])}: {_e(summary['score']['regulated_human'])}</title>"
        f"<style>{STYLE}</style><script>{ERROR_HOOK}</script></head>"
        f"<body><main>{body}</main><script>{SORT_SCRIPT}</script></body></html>\n"
    )


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write ``report.html`` (or ``output``) for the run in ``run_dir``; returns its path."""
    run_dir = Path(run_dir)
    digest = RunDigest(run_dir / LEDGER_NAME, reread=lambda: iter_ledger(run_dir))
    results = load(run_dir, max_rows=REPORT_ROWS, digest=digest)  # one pass over the ledger for both
    summary = build_summary(run_dir, digest=digest)
    page = render_report(results, summary, run_dir)
    path = Path(output) if output else run_dir / REPORT_NAME
    if path.is_dir():
        path = path / REPORT_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, page.encode())
    except OSError as exc:
        raise os_error(exc, path, "write the report to", exit_code=1) from None
    return path
