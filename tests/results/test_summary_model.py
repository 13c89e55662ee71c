"""summary.json has one type (aiperf.results.summary_model.RunSummary): it must say what a run writes.

Each written summary is walked against the type, section by section: every key the type
requires is there, and every key there is one the type names (required or not). The key table
in docs/results.md ("What summary.json holds") must name the same top-level keys.
"""

from __future__ import annotations

import json
import re
import shutil
import types
import typing
from pathlib import Path

import pytest
from lm_ledger import language_run

from aiperf.results import summary_model
from aiperf.results.summary import build_summary, summarize
from aiperf.results.summary_model import DigestSummary, RunSummary

REPO = Path(__file__).resolve().parents[2]


def keys_of(td: type) -> tuple[set[str], set[str]]:
    """(required, optional) keys of a TypedDict, from its annotations (``from __future__`` or not)."""
    required, optional = set(), set()
    for key, hint in typing.get_type_hints(td, include_extras=True).items():
        origin = typing.get_origin(hint)
        if origin is typing.NotRequired or (origin is not typing.Required and not td.__total__):
            optional.add(key)
        else:
            required.add(key)
    return required, optional


def _unwrap(hint: object) -> object:
    while typing.get_origin(hint) in (typing.NotRequired, typing.Required):
        hint = typing.get_args(hint)[0]
    return hint


def shape_problems(value: object, hint: object, path: str) -> list[str]:
    """Where ``value`` has keys its type does not name, or lacks keys it requires (TypedDicts at any depth)."""
    hint = _unwrap(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return []
        dicts = [a for a in typing.get_args(hint) if typing.is_typeddict(_unwrap(a))]
        return shape_problems(value, dicts[0], path) if len(dicts) == 1 else []
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{path} is {type(value).__name__}, not an object"]
        assert isinstance(hint, type)
        required, optional = keys_of(hint)
        problems = [
            f"{path}.{k} is written but {hint.__name__} does not name it" for k in value.keys() - required - optional
        ]
        problems += [f"{path}.{k} is required by {hint.__name__} but not written" for k in required - value.keys()]
        hints = typing.get_type_hints(hint, include_extras=True)
        for key in value.keys() & hints.keys():
            problems += shape_problems(value[key], hints[key], f"{path}.{key}")
        return problems
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint)
        return [p for k, v in enumerate(value) for p in shape_problems(v, item, f"{path}[{k}]")]
    if origin is dict and isinstance(value, dict):
        _, item = typing.get_args(hint)
        return [p for k, v in value.items() for p in shape_problems(v, item, f"{path}[{k!r}]")]
    return []


def _typeddicts_of_the_model() -> list[type]:
    return [
        t
        for t in vars(summary_model).values()
        if isinstance(t, type) and typing.is_typeddict(t) and t.__module__ == summary_model.__name__
    ]


@pytest.mark.parametrize("td", _typeddicts_of_the_model(), ids=lambda t: t.__name__)
def test_python_sees_the_model_s_optional_keys(td):
    # With `from __future__ import annotations`, Python 3.11 counts NotRequired keys as required.
    required, optional = keys_of(td)
    assert (set(td.__required_keys__), set(td.__optional_keys__)) == (required, optional)


def _written(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _with_telemetry(sim_run: Path, tmp_path: Path) -> Path:
    """A copy of the simulated run with utilisation and power samples over its time (its run_stop binds none)."""
    run = tmp_path / "run"
    shutil.copytree(sim_run, run)
    wall = json.loads((run / "ledger.jsonl").read_text().splitlines()[0])["wall"]
    samples = [
        {
            "wall": wall + 5.0 * k,
            "node": "n1",
            "cpu_percent": 40.0,
            "host_mem_used_bytes": 5,
            "host_mem_total_bytes": 10,
            "accelerators": [  # another job on the GPU (outside_util_percent): the verdict gains a note
                {"index": 0, "util_percent": 50.0, "outside_util_percent": 60.0, "power_w": 100.0}
            ],
        }
        for k in range(6)
    ]
    (run / "telemetry.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return run


def test_the_simulated_run_s_summary_json_is_a_run_summary(sim_run):
    summary = _written(sim_run)
    assert shape_problems(summary, RunSummary, "summary") == []
    required, optional = keys_of(RunSummary)
    assert required <= summary.keys() <= required | optional
    assert "device_time" in summary  # the optional sections the simulator's epochs give are checked too


def test_a_summary_with_telemetry_and_energy_is_a_run_summary(sim_run, tmp_path):
    run = _with_telemetry(sim_run, tmp_path)
    summary = build_summary(run)
    assert "telemetry" in summary and summary["energy"]["measured"] and summary["verdict"].get("notes")
    assert shape_problems(summary, RunSummary, "summary") == []


def test_a_language_run_s_summary_is_a_run_summary(tmp_path):
    run = language_run(tmp_path / "lm")
    summary = build_summary(run)
    assert summary.get("family") == "language" and "train_tokens" in summary["dataset"]
    assert summary["best"] is not None and "bits_per_byte" in summary["best"]
    assert shape_problems(summary, RunSummary, "summary") == []


def test_the_ledger_s_own_summary_is_a_digest_summary(sim_run):
    from aiperf.ledger.store import read_ledger

    summary = summarize(read_ledger(sim_run))
    assert shape_problems(summary, DigestSummary, "summary") == []
    required, _ = keys_of(RunSummary)
    assert required - summary.keys() == {"energy"}  # build_summary adds it (and telemetry, where there is some)


def test_a_key_the_type_does_not_name_is_found(sim_run):
    summary = _written(sim_run)
    summary["workers"]["surprise"] = 1
    del summary["score"]["ops_human"]
    problems = shape_problems(summary, RunSummary, "summary")
    assert "summary.workers.surprise is written but WorkersSummary does not name it" in problems
    assert "summary.score.ops_human is required by ScoreSummary but not written" in problems


def _documented_keys() -> tuple[set[str], set[str]]:
    """(always, sometimes): the top-level keys docs/results.md's summary.json table names."""
    text = (REPO / "docs" / "results.md").read_text()
    section = text.split("### What `summary.json` holds", 1)[1].split("\n#", 1)[0]
    always, sometimes = set(), set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        keys = set(re.findall(r"`([a-z_]+)`", cells[0]))
        (always if cells[1].startswith("always") else sometimes).update(keys)
    return always, sometimes


def test_docs_results_md_names_the_keys_the_type_names():
    always, sometimes = _documented_keys()
    required, optional = keys_of(RunSummary)
    assert (always, sometimes) == (required, optional)
