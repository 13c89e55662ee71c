"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no display, no pyplot state).

Every function takes plain data (frames from :mod:`aiperf.results.tables`, score timeline points)
and returns PNG bytes, or ``None`` when there is nothing to draw, so the report can say so
instead of showing an empty frame.

Names in a figure come from a ledger or telemetry (host names, worker names, devices) and are
drawn as plain text: every figure is drawn with mathtext and TeX off (a host called
``$\\frac{a}{b}$`` is drawn as those characters, and a lone ``$`` cannot fail the report), and
each name goes through :func:`label`: made inert, cut short, never hidden from a legend.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from aiperf.ledger.inert import inert
from aiperf.metrics.score import TimelinePoint, format_ops

WIDTH, HEIGHT, DPI = 6.4, 3.4, 110
MAX_LEGEND = 10
MAX_NODE_LINES = 64  # nodes drawn one line each in OPS per node; of more, an even sample (their mean counts all)
KIND_MARKERS = {"seed": "*", "arch": "o", "tune": "s"}
MAX_LABEL_CHARS = 40

P = ParamSpec("P")
R = TypeVar("R")


def plain_text(draw: Callable[P, R]) -> Callable[P, R]:
    """``draw`` with every text it creates taken literally: no mathtext (``$...$``), no TeX.

    Settings apply to a text when it is created, and tick labels are created when the figure
    is saved, so the whole drawing runs inside the context.
    """

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context({"text.usetex": False, "text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn


def label(name: object) -> str:
    """A name from a ledger or telemetry as figure text: inert, at most ``MAX_LABEL_CHARS``, and
    never starting with ``_`` (a legend leaves such a label out)."""
    text = inert(name)
    if len(text) > MAX_LABEL_CHARS:
        text = text[: MAX_LABEL_CHARS - 3] + "..."
    return " " + text if text.startswith("_") else text


def new_figure(width: float = WIDTH, height: float = HEIGHT) -> tuple[Figure, Axes]:
    """A figure drawn without a display (Agg), gridded, small tick labels: every plot aiperf embeds."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)
    return fig, ax


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes with no software stamp, so a page rebuilt from the same data is identical."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _si(unit: str) -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: format_ops(v, unit) if v else "0")


@plain_text
def score_over_time(timeline: Sequence[TimelinePoint], quality: str = "best accuracy") -> bytes | None:
    """OPS and regulated score as they stood at each moment of the run (``quality``: what regulates it)."""
    if not timeline or not any(p["total_ops"] for p in timeline):
        return None
    fig, ax = new_figure()
    t = [p["t"] for p in timeline]
    ax.plot(t, [p["ops_per_s"] for p in timeline], label="OPS (counted operations / s)", color="#1f77b4")
    ax.plot(t, [p["regulated"] for p in timeline], label=f"regulated = OPS x |ln(1 - {quality})|", color="#d62728")
    ax.yaxis.set_major_formatter(_si("OPS"))
    ax.set_xlabel("time since run start (s, master clock)", fontsize=9)
    ax.set_title("Score over time", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return to_png(fig)


@plain_text
def best_error_over_time(timeline: Sequence[TimelinePoint], epochs: pd.DataFrame) -> bytes | None:
    """Best validation error so far (a step line), over every epoch's own validation error."""
    if epochs.empty:
        return None
    fig, ax = new_figure()
    errors = (1.0 - epochs["val_acc"].astype(float)).clip(lower=1e-4)
    ax.scatter(epochs["t"], errors, s=10, alpha=0.35, color="#7f7f7f", label="each epoch")
    points = [(p["t"], 1.0 - p["best_val_acc"]) for p in timeline if p["best_val_acc"] is not None]
    if points:
        ax.step(
            [p[0] for p in points],
            [max(p[1], 1e-4) for p in points],
            where="post",
            color="#2ca02c",
            label="best so far",
        )
    percent = FuncFormatter(lambda v, _pos: f"{v * 100:.3g}%")
    if errors.max() / errors.min() >= 10:  # a log scale only helps (and has labels) across a decade
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(percent)
    ax.set_xlim(left=0)  # the run's whole time: a short run's epochs, all near its end, do not fill the axis
    ax.set_xlabel("time since run start (s)", fontsize=9)
    ax.set_ylabel("validation error (1 - top-1)", fontsize=9)
    ax.set_title("Best validation error over time", fontsize=10)
    ax.legend(fontsize=8)
    return to_png(fig)


@plain_text
def best_bits_per_byte_over_time(timeline: Sequence[TimelinePoint], epochs: pd.DataFrame) -> bytes | None:
    """A language run's best validation bits per byte so far (a step line), over every epoch's own.

    The best so far comes from the timeline's best quality (``8 * (1 - quality)``: exact, every
    epoch counted, where the epochs frame may be a sample); an epoch's own from its record.
    """
    data = epochs.dropna(subset=["bits_per_byte"]) if "bits_per_byte" in epochs else epochs.iloc[0:0]
    if data.empty:
        return None
    fig, ax = new_figure()
    ax.scatter(data["t"], data["bits_per_byte"].astype(float), s=10, alpha=0.35, color="#7f7f7f", label="each epoch")
    points = [(p["t"], 8.0 * (1.0 - p["best_val_acc"])) for p in timeline if p["best_val_acc"] is not None]
    if points:
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", color="#2ca02c", label="best so far")
    ax.set_xlim(left=0)
    ax.set_xlabel("time since run start (s)", fontsize=9)
    ax.set_ylabel("validation bits per byte", fontsize=9)
    ax.set_title("Best validation bits per byte over time", fontsize=10)
    ax.legend(fontsize=8)
    return to_png(fig)


def _spread_ops(epochs: pd.DataFrame, edges: np.ndarray, chunk: int = 100_000) -> np.ndarray:
    """Each bin's operations, every epoch's shared by how much of its busy interval the bin covers."""
    out = np.zeros(len(edges) - 1)
    ends = epochs["t"].to_numpy(dtype=float)
    busy = (epochs["train_s"].fillna(0).astype(float) + epochs["eval_s"].fillna(0).astype(float)).to_numpy()
    ops = epochs["ops"].fillna(0).astype(float).to_numpy()
    lo_edges, hi_edges = edges[:-1][None, :], edges[1:][None, :]
    for k in range(0, len(ends), chunk):
        end, length, amount = ends[k : k + chunk, None], busy[k : k + chunk, None], ops[k : k + chunk, None]
        start = end - length
        overlap = np.clip(np.minimum(hi_edges, end) - np.maximum(lo_edges, start), 0.0, None)
        instant = length <= 0  # no busy time recorded: all of it where it ended
        share = np.where(instant, (lo_edges < end) & (end <= hi_edges), overlap / np.where(instant, 1.0, length))
        out += (share * amount).sum(axis=0)
    return out


def node_rates(
    epochs: pd.DataFrame, bins: int | None = None, weight: float = 1.0, span_s: float = 0.0
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The bins' edges, from 0 to the run's span (or the last epoch's end, if later), and each node's counted
    operations per second in them (:func:`ops_per_node`)."""
    if bins is None:
        bins = min(max(len(epochs) // 3, 5), 30)
    end = max(float(epochs["t"].max()), span_s)
    edges = np.linspace(0.0, end if end > 0 else 1.0, bins + 1)
    width = edges[1] - edges[0]
    series = {
        str(node): _spread_ops(mine, edges) * weight / width
        for node, mine in epochs.groupby(epochs["node"].fillna("?"), sort=True)
    }
    return edges, series


@plain_text
def ops_per_node(
    epochs: pd.DataFrame,
    hostnames: dict[str, str],
    bins: int | None = None,
    weight: float = 1.0,
    run: tuple[float, float, int] | None = None,
) -> bytes | None:
    """Counted operations per second and node, in time bins, each epoch's spread over the time it trained.

    An epoch's operations are shared among the bins its steps covered (``train_s + eval_s``
    before its end), as the score's steadiness windows share them: counted in the bin it ended
    in alone, a node's rate zig-zagged with when epochs happened to end. By default there are
    about three epochs per bin (5 to 30 bins). ``weight``: how many epochs each row stands for
    (``RunResults.epochs_stride`` when the frame is a sample). Of more than ``MAX_NODE_LINES``
    nodes an even sample is drawn, faint, under the mean of all of them.

    ``run``: the run's wall time, OPS and nodes. The bins then span the whole run (start-up and
    the end included, where nothing was counted), and the run's OPS per node is drawn beside the
    nodes' rates: a bin's rate is what a node did while it trained, the score what the run did
    over its wall time, and a reader compares the two.
    """
    if epochs.empty:
        return None
    edges, series = node_rates(epochs, bins, weight, run[0] if run is not None else 0.0)
    width = edges[1] - edges[0]
    centres = (edges[:-1] + edges[1:]) / 2
    fig, ax = new_figure()
    nodes = list(series)
    if len(nodes) <= MAX_LEGEND:
        for node, rate in series.items():
            ax.plot(centres, rate, marker=".", label=label(hostnames.get(node) or node[:8]))
    else:  # too many for a legend: nodes faint (an even sample of them), their mean bold
        step = max(1, math.ceil(len(nodes) / MAX_NODE_LINES))
        for node in nodes[::step]:
            ax.plot(centres, series[node], color="#1f77b4", alpha=0.15, linewidth=0.8)
        ax.plot(
            centres,
            np.mean(list(series.values()), axis=0),
            color="#d62728",
            linewidth=2,
            label=f"mean of {len(nodes)} nodes",
        )
    if run is not None and run[2] > 0:
        per_node = run[1] / run[2]
        ax.axhline(per_node, color="black", linestyle="--", linewidth=1, label=f"the run's OPS / {run[2]} node(s)")
    ax.legend(fontsize=7, title="node" if len(nodes) <= MAX_LEGEND else None, title_fontsize=7)
    ax.set_xlim(0.0, edges[-1])
    ax.set_ylim(bottom=0.0)  # rates read against zero, not against the lowest bin
    ax.yaxis.set_major_formatter(_si("OPS"))
    ax.set_xlabel("time since run start (s)", fontsize=9)
    ax.set_title(f"Counted OPS per node ({width:.3g} s bins)", fontsize=10)
    return to_png(fig)


@plain_text
def size_schedule(
    epochs: pd.DataFrame, trials: pd.DataFrame, band: Callable[[float], tuple[float, float]], budget_s: float
) -> bytes | None:
    """The size schedule's band over the run, shaded, and each counted epoch at its trial's training FLOPs per image."""
    if epochs.empty or trials.empty or budget_s <= 0:
        return None
    sizes = trials.set_index("trial")["flops_train_per_image"]
    points = epochs[["t", "trial"]].join(sizes, on="trial").dropna(subset=["flops_train_per_image"])
    if points.empty:
        return None
    fig, ax = new_figure()
    ts = np.linspace(0.0, budget_s, 101)
    lows, highs = zip(*(band(t / budget_s) for t in ts), strict=True)
    ax.fill_between(ts, lows, highs, color="#2ca02c", alpha=0.2, label="size band")
    ax.scatter(points["t"], points["flops_train_per_image"], s=10, color="#1f77b4", label="counted epochs")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(_si("FLOP"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("master time (s)", fontsize=9)
    ax.set_ylabel("training FLOPs per image", fontsize=9)
    ax.set_title("Trained sizes against the size schedule", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return to_png(fig)


@plain_text
def busy_fraction(workers: pd.DataFrame) -> bytes | None:
    """Share of each worker's life spent in training and evaluation steps."""
    data = workers.dropna(subset=["busy_fraction"])
    if data.empty:
        return None
    fig, ax = new_figure()
    if len(data) <= 64:
        data = data.sort_values("worker")
        nodes = list(dict.fromkeys(data["node"]))
        colours = [f"C{nodes.index(n) % 10}" for n in data["node"]]
        ax.bar(range(len(data)), data["busy_fraction"], color=colours)
        ticks = [label(w) for w in data["worker"]]
        ax.set_xticks(range(len(data)), ticks, rotation=90 if len(data) > 12 else 0, fontsize=7)
        ax.set_xlabel("worker (colour: node)", fontsize=9)
        ax.set_ylim(0, 1.05)
    else:
        ax.hist(data["busy_fraction"], bins=20, range=(0, 1), color="#1f77b4")
        ax.set_xlabel("busy fraction", fontsize=9)
        ax.set_ylabel("workers", fontsize=9)
    mean = float(data["busy_fraction"].mean())
    ax.set_title(f"Device busy fraction per worker (mean {mean:.2f})", fontsize=10)
    return to_png(fig)


@plain_text
def lineage(trials: pd.DataFrame, quality: str = "best validation accuracy") -> bytes | None:
    """Every trial at (start time, generation), joined to its parent, coloured by its best ``quality``."""
    if trials.empty:
        return None
    fig, ax = new_figure(WIDTH * 1.55, HEIGHT * 1.45)
    where = {r.trial: (r.start_t, r.depth) for r in trials.itertuples()}
    for r in trials.itertuples():
        if isinstance(r.parent, str) and r.parent in where:
            (x0, y0), (x1, y1) = where[r.parent], where[r.trial]
            ax.plot([x0, x1], [y0, y1], color="#999999", linewidth=0.7, alpha=0.6, zorder=1)
    acc = trials["best_val_acc"].astype(float)
    known = acc.notna()
    scatter = None
    for kind, marker in KIND_MARKERS.items():
        mine = trials["kind"] == kind
        sel = trials[mine & known]
        if not sel.empty:
            scatter = ax.scatter(
                sel["start_t"],
                sel["depth"],
                c=sel["best_val_acc"].astype(float),
                cmap="viridis",
                vmin=float(acc[known].min()),
                vmax=float(acc[known].max()),
                marker=marker,
                s=42,
                edgecolors="black",
                linewidths=0.4,
                zorder=2,
                label=kind,
            )
        sel = trials[mine & ~known]
        if not sel.empty:
            ax.scatter(
                sel["start_t"],
                sel["depth"],
                marker=marker,
                s=42,
                facecolors="none",
                edgecolors="#d62728",
                zorder=2,
                label=f"{kind} (no accuracy)",
            )
    if scatter is not None:
        fig.colorbar(scatter, ax=ax, label=quality)
    ax.set_xlabel("trial start (s since run start)", fontsize=9)
    ax.set_ylabel("generation (morphisms from the seed)", fontsize=9)
    locator = ax.yaxis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # a new axis's AutoLocator
        locator.set_params(integer=True)
    ax.set_title(f"Architecture lineage: {len(trials)} trials (parent -> child)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return to_png(fig)


@plain_text
def utilisation(telemetry: pd.DataFrame, hostnames: dict[str, str]) -> bytes | None:
    """Accelerator utilisation per node over time (CPU utilisation where a node has no accelerator)."""
    if telemetry.empty:
        return None
    has_gpu = (telemetry["device"] != "cpu").any()
    data = telemetry[telemetry["device"] != "cpu"] if has_gpu else telemetry[telemetry["device"] == "cpu"]
    data = data.dropna(subset=["util_percent"])
    if data.empty:
        return None
    fig, ax = new_figure()
    groups = list(data.groupby(["node", "device"]))
    for (node, device), frame in groups:
        name = label(f"{hostnames.get(node) or node[:8]} {device}") if len(groups) <= MAX_LEGEND else None
        lines = ax.plot(frame["t"], frame["util_percent"], linewidth=1, alpha=0.8 if name else 0.3, label=name)
        own = frame.dropna(subset=["run_util_percent"]) if not has_gpu else frame.iloc[0:0]
        if not own.empty:  # a shared machine: of the host's busy CPU, what the run itself used
            mine = label(f"{hostnames.get(node) or node[:8]} this run's processes") if name else None
            ax.plot(own["t"], own["run_util_percent"], linewidth=2, color=lines[0].get_color(), label=mine)
    power = telemetry.dropna(subset=["power_w"])
    if not power.empty:
        twin = ax.twinx()
        total = power.groupby("wall").agg(t=("t", "first"), power_w=("power_w", "sum"))
        twin.plot(total["t"], total["power_w"], color="black", linestyle="--", linewidth=1, label="power (sum)")
        twin.set_ylabel("accelerator power (W)", fontsize=9)
        twin.tick_params(labelsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel(("accelerator" if has_gpu else "CPU (thin: all processes)") + " utilisation (%)", fontsize=9)
    ax.set_xlabel("time since run start (s)", fontsize=9)
    ax.set_title("Utilisation per node (telemetry)", fontsize=10)
    if len(groups) <= MAX_LEGEND:
        ax.legend(fontsize=7, loc="lower left")
    return to_png(fig)


@plain_text
def scaling(table: pd.DataFrame) -> bytes | None:
    """Score per node and weak-scaling efficiency against the node count."""
    if table.empty:
        return None
    fig = Figure(figsize=(WIDTH * 1.5, HEIGHT), dpi=DPI)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes", fontsize=9)
        ax.set_xticks(list(table["nodes"]), [str(n) for n in table["nodes"]])
    left.plot(table["nodes"], table["ops_per_s_per_node"], marker="o", label="OPS per node")
    left.plot(table["nodes"], table["regulated_per_node"], marker="s", label="regulated per node")
    left.yaxis.set_major_formatter(_si("OPS"))
    left.set_ylim(bottom=0)
    left.set_title("Score per node", fontsize=10)
    left.legend(fontsize=8)
    right.plot(table["nodes"], table["efficiency"], marker="o", color="#2ca02c", label="efficiency (OPS per node)")
    if "busy_fraction" in table and table["busy_fraction"].notna().any():
        right.plot(table["nodes"], table["busy_fraction"], marker="s", color="#9467bd", label="workers busy")
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ideal")
    top = max(1.1, float(table["efficiency"].max()) * 1.05) if table["efficiency"].notna().any() else 1.1
    right.set_ylim(0, top if math.isfinite(top) else 1.1)
    right.set_title("Weak-scaling efficiency vs the smallest size", fontsize=10)
    right.legend(fontsize=8)
    return to_png(fig)
