"""``aiperf list``: runs combined, rows ranked, rejected packages below, hostile strings escaped, input bounded."""

from __future__ import annotations

import io
import json
import re
import shutil

import pandas as pd
import pytest
from helpers import page_health, render_in_chromium

from aiperf import cli
from aiperf.errors import AiperfError
from aiperf.submission import listing
from aiperf.submission.list_page import render_list_page
from aiperf.submission.listing import (
    csv_records,
    find_packages,
    format_csv,
    format_markdown,
    format_table,
    read_rows,
)
from aiperf.submission.ranking import RANK_KEYS, Row, combine_runs, rank_rows

H100 = "NVIDIA H100 80GB HBM3"


def summary(
    ops: object = 1e12,
    *,
    regulated: object = None,
    rpeak: float | None = 8e15,
    ceiling: float | None = 4e15,
    ops_per_watt: float | None = None,
    level: int = 2,
    covers: str = "accelerators only",
    official: bool = False,
    comparable: bool = True,
    wall_s: float = 600.0,
    device: str = H100,
    unit: str = "accelerator",
    count: int = 8,
) -> dict:
    """The parts of a run's summary.json the list reads (aiperf/results/summary.py writes them)."""
    number = ops if isinstance(ops, (int, float)) and not isinstance(ops, bool) else 0.0
    return {
        "backend": "jax",
        "precision": ["bfloat16"],
        "devices": {"nodes": 1},
        "score": {"ops_per_s": ops, "regulated": number * 2 if regulated is None else regulated, "wall_s": wall_s},
        "efficiency": {
            "ops_per_s": ops,
            "rpeak_flops": rpeak,
            "ops_over_rpeak": number / rpeak if rpeak else None,
            "ceiling_flops": ceiling,
            "ops_over_ceiling": number / ceiling if ceiling else None,
            "by_device": [{"device": device, "unit": unit, "devices": count, "ops_per_s": ops}],
        },
        "energy": (
            {"measured": True, "ops_per_watt": ops_per_watt, "level": level, "covers_text": covers, "bound": True}
            if ops_per_watt is not None
            else {"measured": False, "ops_per_watt": None, "level": None, "headline": "energy: not measured"}
        ),
        "verdict": {"valid": True, "official": official, "comparable": comparable},
    }


def describe(name: str, submitter: str = "Example Centre", site: str = "Example Site") -> dict:
    return {"system_name": name, "submitter": submitter, "number_of_nodes": "1", "top500": {"site": site}}


def row(system: str, ops: float | None, workload: str = "smoke", accepted: bool = True, **kwargs: object) -> Row:
    runs = [summary(ops if ops is not None else "unknown", **kwargs)]  # type: ignore[arg-type]
    finding = None if accepted else f"{system}: the manifest does not match"
    return combine_runs(f"pkg-{system}", system, workload, runs, describe(system), accepted, finding)


def write_package(root, name, entries, descriptions=None):
    """A package directory as aiperf package lays it out, with only the files the list reads."""
    pkg = root / name
    pkg.mkdir(parents=True)
    index = []
    for (system, workload), runs in entries.items():
        (pkg / "systems").mkdir(parents=True, exist_ok=True)
        description = (descriptions or {}).get(system, describe(system))
        (pkg / "systems" / f"{system}.json").write_text(json.dumps(description))
        paths = []
        for i, s in enumerate(runs, 1):
            run = pkg / "results" / system / workload / f"run_{i}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps(s))
            paths.append(f"results/{system}/{workload}/run_{i}")
        index.append({"system": system, "workload": workload, "config": f"results/{system}/{workload}/config.yaml",
                      "runs": paths})  # fmt: skip
    package = {"format": "aiperf-package/1", "created": "2026-11-26T00:00:00Z", "aiperf_version": "0.1.0",
               "commit": None, "entries": index}  # fmt: skip
    (pkg / "package.json").write_text(json.dumps(package))
    return pkg


def accept_all(verdicts=None):
    """A checker that accepts every package but those named in ``verdicts`` (name -> first finding)."""
    verdicts = verdicts or {}
    return lambda package: (False, verdicts[package.name]) if package.name in verdicts else (True, None)


# --- combining runs ----------------------------------------------------------------------------


def test_runs_are_combined_by_the_median_with_their_spread():
    runs = [summary(1.0e12, ops_per_watt=2e9, wall_s=600), summary(1.3e12, ops_per_watt=3e9, wall_s=610),
            summary(1.1e12, ops_per_watt=4e9, level=1, wall_s=620)]  # fmt: skip
    r = combine_runs("pkg", "sys", "smoke", runs, describe("Big Iron"), True)
    assert r.system == "Big Iron" and r.submitter == "Example Centre" and r.site == "Example Site"
    assert r.runs == 3 and r.ops is not None and r.ops.median == pytest.approx(1.1e12)
    assert r.ops.min == 1.0e12 and r.ops.max == 1.3e12 and r.ops.cv == pytest.approx(0.1348, abs=1e-4)
    assert r.regulated is not None and r.regulated.median == pytest.approx(2.2e12)
    assert r.ops_over_rpeak == pytest.approx(1.1e12 / 8e15) and r.ops_over_ceiling == pytest.approx(1.1e12 / 4e15)
    assert r.rpeak == 8e15 and r.duration_s == 610
    assert r.ops_per_watt == 3e9 and r.energy_level == "level 1: accelerators only"  # the lowest level of the runs
    assert r.accelerators == f"8 x {H100}" and r.nodes == 1 and r.backend == "jax" and r.precision == "bfloat16"
    assert r.devices[0].count == 8 and r.devices[0].ops_per_s == pytest.approx(1.1e12)
    assert r.official is False and r.runs_text == "3, CV 13.5 %"


def test_a_ranked_row_whose_runs_shared_their_machine_says_so_in_its_note():
    busy = summary(1.0e12)
    busy["verdict"]["notes"] = ["shared machine: 59 % of CPU time outside the run"]
    quiet = summary(1.1e12)
    r = combine_runs("pkg", "sys", "smoke", [busy, busy, quiet], describe("Busy Box"), True)
    assert r.caveat == "shared machine in 2 of 3 run(s)"
    (ranked,) = rank_rows([r])
    assert ranked.rank == 1 and ranked.note == "shared machine in 2 of 3 run(s)"
    assert "shared machine in 2 of 3 run(s)" in listing.format_table([ranked], "ops")
    assert combine_runs("pkg", "sys", "smoke", [quiet], describe("Quiet"), True).caveat is None


def test_a_row_whose_runs_trained_on_fewer_nodes_than_their_jobs_had_says_how_many_of_how_many():
    full, short = summary(1.0e12), summary(1.1e12)
    full["devices"] = {"nodes": 4, "planned_nodes": 4, "trained_nodes": 4}
    short["devices"] = {"nodes": 3, "planned_nodes": 4, "trained_nodes": 3}
    r = combine_runs("pkg", "sys", "smoke", [full, short], describe("Half Iron"), True)
    assert (r.nodes, r.planned_nodes, r.trained_nodes) == (4, 4, 3), "the fewest nodes any run trained on"
    assert "4 (trials on 3 of 4 planned)" in listing.format_table(rank_rows([r]), "ops")
    record = csv_records([r])[0]
    assert (record["planned_nodes"], record["trained_nodes"]) == (4, 3)
    plain = combine_runs("pkg", "sys", "smoke", [full], describe("Full"), True)
    assert "planned" not in listing.format_table(rank_rows([plain]), "ops"), "a full job needs no remark"
    unstated = combine_runs("pkg", "sys", "smoke", [summary(1e12)], describe("Lone"), True)
    assert (unstated.planned_nodes, unstated.trained_nodes) == (None, None)


def test_five_runs_give_the_olympic_mean():
    runs = [summary(v * 1e9) for v in (1, 2, 3, 4, 100)]
    r = combine_runs("pkg", "sys", "smoke", runs, {}, True)
    record = csv_records([r])[0]
    assert record["ops_per_s"] == 3e9 and record["ops_olympic_mean"] == pytest.approx(3e9)
    assert record["ops_min"] == 1e9 and record["ops_max"] == 1e11
    assert r.system == "sys" and r.submitter is None  # no system description: the package's name for it


def test_ops_per_watt_needs_every_run_metered():
    metered = summary(ops_per_watt=2e9)
    r = combine_runs("p", "s", "smoke", [metered, metered, summary()], {}, True)
    assert r.ops_per_watt is None and r.energy_level == "metered in 2 of 3 runs only"
    r = combine_runs("p", "s", "smoke", [summary()], {}, True)
    assert r.ops_per_watt is None and r.energy_level == "not measured"
    r = combine_runs("p", "s", "smoke", [summary(ops_per_watt=1e9, level=0, covers="CPU packages only")], {}, True)
    assert r.energy_level == "below level 1: CPU packages only"


@pytest.mark.parametrize("bad", ["fast", True, float("nan"), float("inf"), None, [1]])
def test_a_figure_of_the_wrong_type_is_unknown(bad):
    r = combine_runs("p", "s", "smoke", [summary(1e12), summary(bad)], {}, True)
    assert r.ops is None and r.value("ops") is None  # a median of the readable runs would flatter
    assert r.devices[0].ops_per_s is None


def test_a_summary_of_the_wrong_shape_is_unknown_figures_not_an_exception():
    for junk in ({}, {"score": [], "efficiency": "x", "energy": 3, "verdict": None, "precision": "bf16"}):
        r = combine_runs("p", "s", "smoke", [junk], {"top500": [], "system_name": 7}, True)
        assert r.ops is None and r.rpeak is None and r.official is None and r.system == "s"
        assert "-" in format_table(rank_rows([r]), "ops")


def language_summary(tokens_per_s: object, ops: float = 1e12) -> dict:
    """A language run's summary: an image run's parts, ``family`` and its ``language`` section (docs/llm.md)."""
    language = {"tokens": 1_000_000, "eval_tokens": 10_000, "tokens_per_s": tokens_per_s, "best_bits_per_byte": 2.5}
    return {**summary(ops), "family": "language", "language": language}


def _column(table: str, header: str, rows: int) -> list[str]:
    """The cells of one column of the plain table (its columns are padded to the width of the widest cell)."""
    lines = table.splitlines()
    start = lines[0].index(header)
    return [line[start:].split("  ")[0].strip() for line in lines[1 : 1 + rows]]


def test_language_entries_show_their_median_tokens_per_second_image_entries_a_dash():
    runs = [language_summary(1000.0), language_summary(3000.0), language_summary(2000.0)]
    lm = combine_runs("pkg-lm", "lm", "llm", runs, describe("lm"), True)
    image = row("img", 1e12)
    assert lm.tokens_per_s == 2000.0 and image.tokens_per_s is None
    unknown = combine_runs("p", "s", "llm", [language_summary(1000.0), language_summary("fast")], {}, True)
    assert unknown.tokens_per_s is None  # a median of the readable runs would flatter
    rows = rank_rows([lm, image])
    assert _column(format_table(rows, "ops"), "tokens/s", 2) == ["2 k tokens/s", "-"]
    md = format_markdown(rows, "ops").splitlines()
    column = [c.strip() for c in md[2].split("|")].index("tokens/s")
    assert [[c.strip() for c in line.split("|")][column] for line in md[4:6]] == ["2 k tokens/s", "-"]
    frame = pd.read_csv(io.StringIO(format_csv(rows)))
    assert list(frame["workload"]) == ["llm", "smoke"] and frame["tokens_per_s"][0] == 2000.0
    assert pd.isna(frame["tokens_per_s"][1])
    page = render_list_page(rows, "ops")
    heads = re.findall(r'<th data-key="([^"]*)"', page)
    cells = [re.findall(r"<td[^>]*>[^<]*</td>", tr) for tr in re.findall(r'<tr class="[a-z]+">(.*?)</tr>', page)]
    column = heads.index("tokens/s")
    assert [c[column] for c in cells] == [
        '<td class="num" data-value="2000.0">2 k tokens/s</td>', '<td class="num" data-value="">-</td>']  # fmt: skip


# --- ranking -----------------------------------------------------------------------------------


def test_accepted_rows_ranked_descending_ties_share_a_rank_unknown_and_rejected_below():
    rows = [row("b", 100.0), row("e", 1000.0, accepted=False), row("d", None), row("c", 300.0), row("a", 300.0)]
    ordered = rank_rows(rows, "ops")
    assert [(r.system, r.rank) for r in ordered] == [("a", 1), ("c", 1), ("b", 3), ("d", None), ("e", None)]
    assert ordered[3].note == "not ranked: OPS unknown"
    assert ordered[4].note == "rejected: e: the manifest does not match"  # its first finding, below all ranked rows
    table = format_table(ordered, "ops")
    assert "3 of 5 row(s) ranked by OPS" in table and "e (smoke): rejected: e: the manifest does not match" in table


def test_each_workload_is_ranked_apart_official_first():
    rows = [row("s1", 5.0), row("i1", 1.0, workload="imagenet"), row("s2", 9.0), row("i2", 2.0, workload="imagenet")]
    ordered = rank_rows(rows)
    assert [(r.workload, r.system, r.rank) for r in ordered] == [
        ("imagenet", "i2", 1), ("imagenet", "i1", 2), ("smoke", "s2", 1), ("smoke", "s1", 2)]  # fmt: skip


def test_rank_by_efficiency_regulated_and_ops_per_watt():
    rows = [
        row("fast", 4e12, rpeak=1e14, ops_per_watt=1e9),
        row("lean", 1e12, rpeak=1e13, ops_per_watt=5e9),
        row("unpeaked", 2e12, rpeak=None, regulated=9e12),
    ]
    assert [r.system for r in rank_rows(rows, "ops")] == ["fast", "unpeaked", "lean"]
    assert [r.system for r in rank_rows(rows, "regulated")] == ["unpeaked", "fast", "lean"]
    by_efficiency = rank_rows(rows, "efficiency")
    assert [(r.system, r.rank) for r in by_efficiency] == [("lean", 1), ("fast", 2), ("unpeaked", None)]
    assert by_efficiency[2].note == "not ranked: OPS / Rpeak unknown"
    by_watt = rank_rows(rows, "ops_per_watt")
    assert [(r.system, r.rank) for r in by_watt][:2] == [("lean", 1), ("fast", 2)]
    assert by_watt[2].note == "not ranked: OPS per watt unknown"


def test_runs_under_custom_rules_are_not_ranked():
    ordered = rank_rows([row("custom", 9e12, comparable=False), row("plain", 1e12)])
    assert [(r.system, r.rank, r.note) for r in ordered] == [
        ("plain", 1, None), ("custom", None, "not ranked: custom rules, not comparable")]  # fmt: skip


def test_the_cli_offers_every_ranking_key():
    assert tuple(cli.RANK_CHOICES) == RANK_KEYS
    with pytest.raises(ValueError):
        rank_rows([], "speed")


# --- packages on disk --------------------------------------------------------------------------


def test_rows_from_packages_and_folders_of_packages(tmp_path):
    subs = tmp_path / "subs"
    write_package(subs, "alpha", {("alpha-1", "smoke"): [summary(2e12), summary(2.2e12)],
                                  ("alpha-1", "imagenet"): [summary(1e12)]})  # fmt: skip
    write_package(subs, "beta", {("beta", "smoke"): [summary(3e12)]})
    write_package(subs, "gamma", {("gamma", "smoke"): [summary(9e12)]})
    (subs / "not-a-package").mkdir()
    rows = rank_rows(read_rows([subs, subs / "beta"], accept_all({"gamma": "gamma: run_1: audit failed"})))
    # beta, given twice, is listed once; the official workload first
    assert [(r.system, r.workload, r.rank, r.runs) for r in rows] == [
        ("alpha-1", "imagenet", 1, 1), ("beta", "smoke", 1, 1), ("alpha-1", "smoke", 2, 2),
        ("gamma", "smoke", None, 1)]  # fmt: skip
    assert rows[-1].note == "rejected: gamma: run_1: audit failed" and not rows[-1].accepted
    assert rows[-1].ops is not None  # a rejected package's figures are shown, never ranked


def test_an_unreadable_package_is_a_rejected_row_not_an_error(tmp_path):
    good = write_package(tmp_path, "good", {("good", "smoke"): [summary()]})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "package.json").write_text("{not json")
    empty = write_package(tmp_path, "empty", {})
    rows = rank_rows(read_rows([good, broken, empty], accept_all()))
    assert [(r.system, r.rank) for r in rows] == [("good", 1), ("broken", None), ("empty", None)]
    assert "not valid JSON" in (rows[1].note or "") and "lists nothing" in (rows[2].note or "")


def _row_of(pkg) -> Row:
    (r,) = read_rows([pkg], accept_all())
    return r


def test_files_are_bounded_before_reading(tmp_path, monkeypatch):
    pkg = write_package(tmp_path, "big", {("big", "smoke"): [summary()]})
    monkeypatch.setattr(listing, "MAX_SUMMARY_BYTES", 100)
    r = _row_of(pkg)
    assert not r.accepted and "summary.json is" in (r.finding or "") and "more than the 100 allowed" in r.finding


def test_paths_that_leave_the_package_are_not_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "summary.json").write_text(json.dumps(summary()))
    pkg = write_package(tmp_path, "p", {("p", "smoke"): [summary()]})
    index = json.loads((pkg / "package.json").read_text())
    for run in ("../outside", "/etc", "results/p/smoke/../../../../outside"):
        index["entries"][0]["runs"] = [run]
        (pkg / "package.json").write_text(json.dumps(index))
        r = _row_of(pkg)
        assert not r.accepted and "not a portable path inside the package" in (r.finding or ""), run
    index["entries"][0]["runs"] = ["results/p/smoke/run_1"]
    (pkg / "package.json").write_text(json.dumps(index))
    shutil.rmtree(pkg / "results" / "p" / "smoke")
    (pkg / "results" / "p" / "smoke").symlink_to(outside.parent)  # a folder linking out
    (outside.parent / "run_1").mkdir()
    (outside.parent / "run_1" / "summary.json").write_text(json.dumps(summary()))
    assert "leads out of the package" in (_row_of(pkg).finding or "")


def test_links_fifos_and_deep_json_are_findings(tmp_path):
    import os

    pkg = write_package(tmp_path, "p", {("p", "smoke"): [summary()]})
    target = pkg / "results" / "p" / "smoke" / "run_1" / "summary.json"
    target.unlink()
    target.symlink_to(pkg / "systems" / "p.json")
    assert "is not a regular file" in (_row_of(pkg).finding or "")
    target.unlink()
    os.mkfifo(target)  # would block a reader for ever
    assert "is not a regular file" in (_row_of(pkg).finding or "")
    target.unlink()
    target.write_text("[" * 100_000 + "]" * 100_000)
    assert "summary.json is not JSON" in (_row_of(pkg).finding or "")
    target.write_text("[1, 2]")
    assert "is not a JSON object" in (_row_of(pkg).finding or "")


def test_the_number_of_packages_is_bounded(tmp_path):
    for name in ("a", "b", "c"):
        write_package(tmp_path / "all", name, {(name, "smoke"): [summary()]})
    assert len(find_packages([tmp_path / "all"], limit=3)) == 3
    with pytest.raises(AiperfError, match="more than 2"):
        find_packages([tmp_path / "all"], limit=2)
    with pytest.raises(AiperfError, match="more than 2 packages"):
        find_packages([tmp_path / "all" / n for n in "abc"], limit=2)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    pkg = write_package(tmp_path, "p", {("p", "smoke"): [summary()]})
    for args, message in [
        ([str(tmp_path / "missing")], "is not a folder"),
        ([str(tmp_path / "file")], "is not a folder"),
        ([str(tmp_path / "empty")], "holds no package"),
        ([str(pkg), "--by", "speed"], "invalid choice"),
        ([], "the following arguments are required"),
    ]:
        assert cli.main(["list", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_the_cli_prints_the_table_and_writes_csv_markdown_and_html(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(listing, "checker_verdict", accept_all({"b": "b: MANIFEST.sha256: missing"}))
    write_package(tmp_path / "subs", "a", {("a", "smoke"): [summary(2e12), summary(3e12)]})
    write_package(tmp_path / "subs", "b", {("b", "smoke"): [summary(9e12)]})
    out = tmp_path / "out"
    out.mkdir()
    args = ["--by", "ops", "--csv", str(out / "l.csv"), "--md", str(out / "l.md"), "--html", str(out / "l.html")]
    assert cli.main(["list", str(tmp_path / "subs"), *args]) == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0]
    assert header.split()[:3] == ["rank", "workload", "system"] and "OPS/Rpeak" in header and "verdict" in header
    assert re.search(r"^1\s+smoke\s+a\s+.*2\.5 TOPS.*accepted$", table, re.M), table
    assert "b (smoke): rejected: b: MANIFEST.sha256: missing" in table
    frame = pd.read_csv(out / "l.csv")
    assert list(frame["system"]) == ["a", "b"] and frame["ops_per_s"][0] == 2.5e12 and frame["runs"][0] == 2
    assert list(frame["verdict"]) == ["accepted", "rejected"]
    md = (out / "l.md").read_text()
    assert md.count("\n| ") == 3 and "| 1 | smoke | a |" in md
    assert (out / "l.html").read_text().startswith("<!DOCTYPE html>")


def test_an_output_file_that_cannot_be_written_is_exit_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(listing, "checker_verdict", accept_all())
    pkg = write_package(tmp_path, "a", {("a", "smoke"): [summary()]})
    assert cli.main(["list", str(pkg), "--csv", str(tmp_path / "no" / "such" / "dir" / "l.csv")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err


# --- hostile strings ---------------------------------------------------------------------------

HOSTILE_NAME = "<script>document.documentElement.setAttribute('data-pwned','1')</script>"
HOSTILE_SUBMITTER = "\"><img src=x onerror=\"document.documentElement.setAttribute('data-pwned','2')\">"
HOSTILE_SITE = '=HYPERLINK("http://evil.example","x")\x1b[31m|`*_[x](http://evil.example)'
HOSTILE_DEVICE = "$\\frac{1}{0}$ _hidden\u202e"


def _hostile_rows():
    description = describe(HOSTILE_NAME, HOSTILE_SUBMITTER, HOSTILE_SITE)
    runs = [summary(2e12, device=HOSTILE_DEVICE), summary(2.1e12, device=HOSTILE_DEVICE)]
    hostile = combine_runs("pkg-<b>", "evil", "smoke", runs, description, True)
    rejected = combine_runs("pkg2", "bad", "smoke", [summary(5e12)], describe("Bad"), False, "<script>x</script>")
    return rank_rows([hostile, row("plain", 1e12, count=16), row("small", 5e11, count=2), rejected])


def test_hostile_strings_are_escaped_in_every_output():
    rows = _hostile_rows()
    page = render_list_page(rows, "ops", ["subs/<i>"])
    assert "<script>document" not in page and "<img src=x" not in page and "<b>" not in page and "<i>" not in page
    assert page.count("<script>") == 2  # the page's own: the error hook and the sort script
    assert "&lt;script&gt;document.documentElement" in page
    assert 'src="http' not in page and "href=" not in page and "<link" not in page and "url(" not in page
    assert page.count("<img ") == 2  # both plots drawn, the device name's "$" not read as mathematics
    table = format_table(rows, "ops")
    assert "\x1b" not in table and "\u202e" not in table
    md = format_markdown(rows, "ops")
    assert "<script>" not in md and "<img" not in md and "[x](" not in md and "\x1b" not in md
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 22 for line in md.splitlines()[2:8])  # 21 cells a row
    frame = pd.read_csv(io.StringIO(format_csv(rows)))
    assert frame["site"][0].startswith("'=HYPERLINK") and frame["submitter"][0].startswith('"><img')


# --- the page in a real browser ----------------------------------------------------------------

SORT_PROBE = """<script>
(function () {
  function column(key) {
    var heads = document.querySelectorAll('#list thead th'), i;
    for (i = 0; i < heads.length; i++) { if (heads[i].getAttribute('data-key') === key) { return i; } }
    return -1;
  }
  function read(col, attr) {
    return Array.prototype.map.call(document.querySelectorAll('#list tbody tr'), function (tr) {
      return attr ? tr.cells[col].getAttribute(attr) : tr.cells[col].textContent;
    }).join('|');
  }
  var system = column('system'), ops = column('OPS');
  document.querySelectorAll('#list thead th')[system].click();
  document.body.setAttribute('data-by-system', read(system));
  document.querySelectorAll('#list thead th')[ops].click();
  document.body.setAttribute('data-by-ops', read(ops, 'data-value'));
  document.querySelectorAll('#list thead th')[ops].click();
  document.body.setAttribute('data-by-ops-desc', read(ops, 'data-value'));
})();
</script></body>"""


def _dom_attribute(dom: str, name: str) -> list[str]:
    import html

    found = re.search(rf'{name}="([^"]*)"', dom)
    assert found, f"{name} not set: the probe did not run"
    return html.unescape(found.group(1)).split("|")


def test_chromium_renders_the_list_without_script_errors_and_sorts(tmp_path):
    page = tmp_path / "list.html"
    page.write_text(render_list_page(_hostile_rows(), "ops", ["subs"]))
    ready, images, caught, console_errors = page_health(page, tmp_path)
    assert caught is None, f"the page caught script errors: {caught}"
    assert not console_errors, console_errors
    assert ready and images == ("2", "2"), images
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", SORT_PROBE))
    proc, console_errors = render_in_chromium(probe, tmp_path, "--dump-dom")
    assert not console_errors, console_errors
    dom = proc.stdout
    assert 'data-pwned="' not in dom  # neither the hostile script nor the hostile image ran
    systems = _dom_attribute(dom, "data-by-system")
    assert len(systems) == 4 and [s for s in systems if s[0].isalpha()] == ["Bad", "plain", "small"], systems
    ops = [float(v) for v in _dom_attribute(dom, "data-by-ops")]
    assert ops == sorted(ops) and [float(v) for v in _dom_attribute(dom, "data-by-ops-desc")] == sorted(ops)[::-1]


# --- hostile descriptions (issue 45, cases 3, 4 and 14) --------------------------------------------


@pytest.mark.parametrize("nodes", ["²", "٣", "9" * 400, "1e3", "-1", " 4"])
def test_a_node_count_that_is_not_plain_digits_is_no_count(nodes):
    """ "²" and "٣" are digits to str.isdigit (float() refuses the first); 400 nines overflow int()."""
    description = {**describe("odd"), "number_of_nodes": nodes}
    assert combine_runs("pkg", "odd", "smoke", [{}], description, True).nodes is None
    assert combine_runs("pkg", "odd", "smoke", [{}], {**description, "number_of_nodes": "12"}, True).nodes == 12


HOSTILE_TEXT = "A\ud800B\x1b[2K\x1b]0;title\x07C\u202eD\rverified\u2028E"


def test_hostile_text_in_a_description_reaches_no_output_raw(tmp_path):
    """A lone surrogate (no encoding can write it: every format died), terminal escapes, BEL, a bidi
    override, CR and a line separator, in the names a package gives and in a package folder's own
    name (a path not in UTF-8 decodes to surrogates): each output is written, none holds them raw."""
    description = {**describe(HOSTILE_TEXT, submitter=HOSTILE_TEXT, site=HOSTILE_TEXT)}
    folder = "pkg-\udcff" + HOSTILE_TEXT
    rows = rank_rows([combine_runs(folder, "sys", "smoke", [summary()], description, True)], "ops")
    raw = ("\ud800", "\udcff", "\x1b", "\x07", "\u202e", "\r", "\u2028")
    outputs = {
        "csv": format_csv(rows),
        "md": listing.format_markdown(rows, "ops"),
        "html": render_list_page(rows, "ops", [folder]),
        "table": listing.format_table(rows, "ops"),
    }
    for name, text in outputs.items():
        assert not [c for c in raw if c in text], name
        listing.write_text(tmp_path / f"list.{name}", text)
    [record] = pd.read_csv(tmp_path / "list.csv").to_dict("records")
    assert record["system"] == "A\\ud800B\\x1b[2K\\x1b]0;title\\x07C\\u202eD\\rverified\\u2028E"  # shown, escaped


def test_runs_packaged_twice_rank_in_neither_package():
    """The same audited runs in two packages were both accepted and both ranked first (issue 45, case 11)."""

    def with_runs(system: str, ops: float, *run_ids: str) -> Row:
        runs = [{**summary(ops), "run_id": run_id} for run_id in run_ids]
        return combine_runs(f"pkg-{system}", system, "smoke", runs, describe(system), True)

    rows = rank_rows(
        [with_runs("a", 9e12, "r1", "r2"), with_runs("copy", 9e12, "r2", "r3"), with_runs("b", 1e12, "r4")], "ops"
    )
    assert [(r.system, r.rank) for r in rows] == [("b", 1), ("a", None), ("copy", None)]
    assert rows[1].note == "not ranked: run r2 is also in pkg-copy: a run counts once"
    assert rows[2].note == "not ranked: run r2 is also in pkg-a: a run counts once"
    assert [r.rank for r in rank_rows([with_runs("a", 9e12, "r1"), with_runs("b", 1e12, "r4")], "ops")] == [1, 2]


def test_a_summary_listing_thousands_of_devices_is_read_to_its_bound():
    """12,000 entries in `efficiency.by_device` took the list 153 s, quadratic in them (issue 45, case 5): the
    list reads the first MAX_DEVICE_KINDS, each once, and a device listed twice counts once."""
    from aiperf.submission.ranking import MAX_DEVICE_KINDS

    run = summary()
    first = run["efficiency"]["by_device"][0]
    run["efficiency"]["by_device"] = [first, *({**first, "device": f"NPU {i}"} for i in range(12_000))]
    row = combine_runs("pkg", "big", "smoke", [run, run], describe("big"), True)
    assert len(row.devices) == MAX_DEVICE_KINDS
    assert row.devices[0].device == H100 and row.devices[1].device == "NPU 0"
    duplicated = summary()
    duplicated["efficiency"]["by_device"] *= 2
    assert [p.device for p in combine_runs("pkg", "d", "smoke", [duplicated], describe("d"), True).devices] == [H100]


def test_energy_from_telemetry_the_ledger_does_not_bind_is_not_ranked():
    """Case 8: RAPL counters invented in telemetry.jsonl, the summary re-run, were ranked first by OPS per watt."""
    unbound = summary(ops_per_watt=9e12)
    del unbound["energy"]["bound"]  # a ledger from before 2026-12-07, or a run that did not end
    forged = summary(ops_per_watt=9e12)
    forged["energy"]["bound"] = False
    for run in (unbound, forged):
        r = combine_runs("pkg", "s", "smoke", [summary(ops_per_watt=2e9), run], describe("s"), True)
        assert r.ops_per_watt is None and r.energy_level == "not ranked: telemetry not bound by its ledger"
