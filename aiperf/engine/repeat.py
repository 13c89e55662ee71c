"""``aiperf run --repeat N``: N runs of one config with distinct seeds, and the spread of their scores.

Each run is an ordinary run in its own directory (seed ``run.seed + k`` for run ``k``), so
each is verified, audited, packaged and listed like any other. What the repetition adds is a
record of which runs belong together (``repeat-<first run id>.json`` in the results directory,
written after every run, so an interrupted series keeps the runs it finished) and the figures
a list shows for them: median, coefficient of variation, min and max
(:mod:`aiperf.metrics.repeats`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO, TypedDict

from aiperf import cli_limits as limits
from aiperf.config import MAX_SEED, Config
from aiperf.errors import AiperfError, os_error
from aiperf.ledger.files import write_atomic
from aiperf.ledger.inert import inert
from aiperf.metrics.repeats import Spread, format_spread, spread
from aiperf.metrics.score import format_ops

if TYPE_CHECKING:
    from aiperf.results.summary_model import RunSummary

MAX_REPEATS = limits.REPEAT.high
Figure = Literal["ops_per_s", "regulated", "best_val_acc"]  # keys of the summary's score section
FIGURES: tuple[Figure, ...] = ("ops_per_s", "regulated", "best_val_acc")


class _Done(TypedDict):
    """One run of the repetition, as it ended."""

    seed: int
    run_dir: str
    summary: RunSummary


def repeat_seeds(cfg: Config, count: int) -> list[int]:
    """The seeds of ``count`` runs from ``cfg.run.seed`` on, checked before any run starts."""
    limits.REPEAT.check(count)
    last = cfg.run.seed + count - 1
    if last > MAX_SEED:
        raise AiperfError(
            f"--repeat {count} from run.seed={cfg.run.seed} needs seeds up to {last} (at most {MAX_SEED})"
        )
    return [cfg.run.seed + k for k in range(count)]


def combine(summaries: list[RunSummary]) -> dict[str, Spread]:
    """The spread of each figure over the runs that have it."""
    out: dict[str, Spread] = {}
    for figure in FIGURES:
        values = [value for s in summaries if (value := s["score"].get(figure)) is not None]
        if values:
            out[figure] = spread(values)
    return out


def format_repeats(name: str, seeds: list[int], spreads: dict[str, Spread]) -> str:
    lines = [f"aiperf: {len(seeds)} run(s) of {inert(name)}, seeds {', '.join(map(str, seeds))}:"]
    shows: dict[str, tuple[str, Callable[[float], str]]] = {
        "ops_per_s": ("OPS", format_ops),
        "regulated": ("regulated", format_ops),
        "best_val_acc": ("best val acc", _accuracy),
    }
    for figure, s in spreads.items():
        label, show = shows[figure]
        lines.append(format_spread(label, s, show))
    return "\n".join(lines)


def _accuracy(value: float) -> str:
    return f"{value:.4f}"


def run_repeated(cfg: Config, count: int, address: str | None, out: TextIO | None = None) -> int:
    """Run ``cfg`` ``count`` times with successive seeds; prints and records the spread. Returns the exit code."""
    from aiperf.engine.run import run_benchmark

    out = out or sys.stdout
    seeds = repeat_seeds(cfg, count)
    done: list[_Done] = []
    record: Path | None = None
    code = 0
    for seed in seeds:
        run_cfg = cfg.model_copy(deep=True)
        run_cfg.run.seed = seed
        run_dir, summary = run_benchmark(run_cfg, address=address)
        done.append({"seed": seed, "run_dir": str(run_dir), "summary": summary})
        record = record or Path(cfg.run.results_dir) / f"repeat-{summary['run_id']}.json"
        _save(record, cfg, done)
        if summary.get("status") == "interrupted":
            code = 130
            break
        if summary.get("status") == "failed":
            code = 1
    summaries = [d["summary"] for d in done if d["summary"].get("status") == "completed"]
    ran = [d["seed"] for d in done if d["summary"].get("status") == "completed"]
    if summaries:
        print(format_repeats(cfg.run.name, ran, combine(summaries)), file=out)
    print(f"aiperf: the runs of this repetition are listed in {record}", file=out)
    return code


def _save(path: Path, cfg: Config, done: list[_Done]) -> None:
    completed = [d["summary"] for d in done if d["summary"].get("status") == "completed"]
    document = {
        "name": cfg.run.name,
        "runs": [
            {
                "seed": d["seed"],
                "run_dir": d["run_dir"],
                "run_id": d["summary"]["run_id"],
                "status": d["summary"]["status"],
                **{f: d["summary"]["score"].get(f) for f in FIGURES},
            }
            for d in done
        ],
        "spread": {k: v.to_dict() for k, v in combine(completed).items()} if completed else {},
    }
    try:
        write_atomic(path, (json.dumps(document, indent=2) + "\n").encode())
    except OSError as exc:
        raise os_error(exc, path, "write the repetition's record") from None
