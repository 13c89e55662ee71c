"""Text from a ledger or a config is shown inert (issue 23, "bounded by construction").

A ledger's run id, a host name, a worker name or a config's run name is written by whoever
wrote the file. Printed raw, an escape sequence erases a line, a carriage return goes back to
its start and a bidi override reverses what follows -- ``x\\x1b[2K\\rFAKE LINE: verified``
reads as a verdict of aiperf's own -- and a ``$...$`` in a name made matplotlib's mathtext fail
the report. Here a real (simulated) run is given such names, its chain rebuilt, and ``summary``,
``verify`` and ``report`` must show them as visible escapes, drawn literally.
"""

from __future__ import annotations

import io
import json
import logging
import shutil

import pandas as pd
import pytest
from helpers import rehash, run_cli_bounded

from aiperf.engine.output import Output
from aiperf.engine.progress import Progress
from aiperf.ledger.inert import escape_char, inert, inert_lines, inert_tree
from aiperf.ledger.store import canonical
from aiperf.results import plots

FAKE = "x\x1b[2K\rFAKE LINE: verified"
HOSTS = {"sim-node-0": "\u202eevil", "sim-node-1": "$\\frac{a}{b$ host"}  # the second fails mathtext
WORKERS = {"w00000": "$x_$\u2066w", "w00001": "_w\x1b[1m"}  # tick labels; "_" would hide a legend entry
NAME = "name\nFAKE LINE: verified\u2028"
RAW = ("\x1b", "\r", "\u202e", "\u2066", "\u2028", "\x9b", "\u200f")  # none of these may reach a terminal


# --- the function ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("line\r\nnext\ttab", "line\\r\\nnext\\ttab"),
        ("\x00\x07\x7f", "\\x00\\x07\\x7f"),
        ("c1 \x85 \x9b", "c1 \\x85 \\x9b"),  # C1: NEL and CSI
        ("\u202eevil\u202c", "\\u202eevil\\u202c"),
        ("\u2066\u2067\u2068\u2069\u200e\u200f\u061c", "\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f\\u061c"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("para\u2028line\u2029", "para\\u2028line\\u2029"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("lone \ud800", "lone \\ud800"),
    ],
)
def test_inert_escapes_controls_and_format_characters(text, shown):
    assert inert(text) == shown
    assert inert(inert(text)) == inert(text), "escaping twice changes nothing"


@pytest.mark.parametrize(
    "text",
    ["plain", "café Zürich", "東京大学 ノード", "ñandú — “quotes” … π≥3", "emoji 🚀", "nbsp\u00a0x", "C:\\runs\\a", ""],
)
def test_inert_keeps_ordinary_unicode(text):
    assert inert(text) == text


def test_inert_lines_keeps_only_line_feeds_and_tabs():
    assert inert_lines("a\tb\nc\rd\x1b[K\u202e") == "a\tb\nc\\rd\\x1b[K\\u202e"
    assert inert(None) == "" and inert(3) == "3"
    assert escape_char("\x1b") == "\\x1b" and escape_char("\u202e") == "\\u202e"


def test_inert_tree_escapes_every_string_and_keeps_numbers():
    tree = {"run\x1b": ["a\nb", 1, 2.5, None, True, ("\u202e",)], "n": {"k": "v\r"}}
    assert inert_tree(tree) == {"run\\x1b": ["a\\nb", 1, 2.5, None, True, ("\\u202e",)], "n": {"k": "v\\r"}}


# --- the streams aiperf prints through ---------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_output_stream_and_progress_line_are_inert():
    term = _Terminal()
    progress = Progress(1.0, 60.0, term)
    progress.note(f"worker on {FAKE} failed to start")
    progress.trial_failed("t0\u202e", "boom\nFAKE LINE: verified")
    progress.maybe_print(5.0, running=1)
    print(f"aiperf result: run {FAKE}", file=progress.stream)
    text = term.getvalue()
    assert "\r\x1b[K[0:00:05" in text, "the redraw aiperf sends on purpose still works"
    assert text.count("\x1b") == 1 and text.count("\r") == 1 and "\u202e" not in text
    assert "worker on x\\x1b[2K\\rFAKE LINE: verified failed to start" in text
    assert "trial t0\\u202e failed: boom\\nFAKE LINE: verified" in text
    assert not any(line.startswith("FAKE LINE") for line in text.replace("\r", "\n").splitlines())
    assert Output(io.StringIO()).write("a\x1b") == 2, "write reports what it was given"


def test_log_lines_are_inert():
    from aiperf.logs import TerminalHandler

    handler = TerminalHandler(logging.DEBUG)
    for level in (logging.WARNING, logging.INFO):
        record = logging.LogRecord("aiperf.engine.master", level, __file__, 1, "worker %s lost", (FAKE,), None)
        line = handler.format(record)
        assert "\n" not in line and "\x1b" not in line and "\r" not in line
        assert line.endswith("worker x\\x1b[2K\\rFAKE LINE: verified lost")


def test_error_line_is_inert(capsys):
    from aiperf.cli import _error, _note

    _error(f"aiperf: error: {FAKE} \u202eevil")
    _note(f"the run is still going (pid 1 on {FAKE})")
    err = capsys.readouterr().err
    assert not any(c in err for c in RAW)
    assert "aiperf: error: x\\x1b[2K\\rFAKE LINE: verified \\u202eevil" in err
    assert not any(line.startswith("FAKE LINE") for line in err.splitlines())


def test_check_result_lines_are_inert(tmp_path):
    from aiperf.submission.check import CheckResult, Finding

    result = CheckResult(findings=[Finding(f"run {FAKE}: not verified")], notes=[f"\u202e{FAKE}"])
    text = result.format(tmp_path / "pkg\x1b[2K")
    assert not any(c in text for c in RAW)
    assert not any(line.startswith("FAKE LINE") for line in text.splitlines())


# --- figures: names drawn literally --------------------------------------------------------------


def test_figures_draw_names_literally():
    epochs = pd.DataFrame(
        {
            "t": [1.0, 2.0, 3.0],
            "node": ["a", "a", "b"],
            "ops": [1e9, 2e9, 3e9],
            "train_s": [0.5] * 3,
            "eval_s": [0.1] * 3,
        }
    )
    workers = pd.DataFrame({"worker": ["$x_$", "_w"], "node": ["a", "b"], "busy_fraction": [0.5, 0.7]})
    with pytest.raises(ValueError):  # what the report died of: mathtext parses a $...$ name
        plots.ops_per_node.__wrapped__(epochs, {"a": "$x_$", "b": "b"})
    assert plots.ops_per_node(epochs, {"a": "$\\frac{a}{b$ host", "b": "\u202e_b"}).startswith(b"\x89PNG")
    assert plots.busy_fraction(workers).startswith(b"\x89PNG")
    assert plots.label("_hidden") == " _hidden", "a legend leaves out labels starting with _"
    assert plots.label("\u202eevil\x1b") == "\\u202eevil\\x1b"
    assert len(plots.label("h" * 500)) == plots.MAX_LABEL_CHARS


# --- a real run with hostile names, through the CLI ----------------------------------------------


@pytest.fixture(scope="module")
def hostile_run(sim_run, tmp_path_factory):
    """The simulated run with a hostile run id, config name, host names and worker names, chain rebuilt."""
    run_dir = tmp_path_factory.mktemp("hostile") / "run"
    shutil.copytree(sim_run, run_dir)
    records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    for rec in records:
        if rec["type"] == "run_start":
            rec["run_id"] = FAKE
            rec["config"]["run"]["name"] = NAME
            for node in rec["plan"]["nodes"]:
                node["hostname"] = HOSTS[node["node_id"]]
        if "hostname" in rec:
            rec["hostname"] = HOSTS[rec["node"]]
        if rec.get("worker") in WORKERS:
            rec["worker"] = WORKERS[rec["worker"]]
    rehash(records)
    (run_dir / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in records))
    (run_dir / "summary.json").unlink()  # `aiperf summary` writes the one verify compares with
    return run_dir


def _assert_inert(proc) -> None:
    for stream in (proc.stdout, proc.stderr):
        assert not any(c in stream for c in RAW), stream[-2000:]
        assert not any(line.lstrip().startswith("FAKE LINE") for line in stream.splitlines()), stream[-2000:]
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr, proc.stderr[-2000:]


def test_summary_and_verify_show_hostile_names_as_escapes(hostile_run):
    summary = run_cli_bounded("summary", str(hostile_run), timeout=120)
    assert summary.returncode == 0, summary.stderr[-2000:]
    _assert_inert(summary)
    assert "aiperf result: run x\\x1b[2K\\rFAKE LINE: verified (name\\nFAKE LINE: verified\\u2028)" in summary.stdout
    assert json.loads((hostile_run / "summary.json").read_text())["run_id"] == FAKE, "the file keeps the ledger's text"

    verify = run_cli_bounded("verify", str(hostile_run), timeout=120)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    _assert_inert(verify)
    assert verify.stdout.startswith("verified: run x\\x1b[2K\\rFAKE LINE: verified: ")


def test_report_draws_hostile_names_and_escapes_them_in_the_page(hostile_run, tmp_path):
    out = tmp_path / "report.html"
    report = run_cli_bounded("report", str(hostile_run), "-o", str(out), timeout=180)
    assert report.returncode == 0, report.stderr[-2000:]
    _assert_inert(report)
    assert report.stdout.strip() == str(out)
    page = out.read_text()
    assert page.count("data:image/png;base64,") >= 4, "the figures with host and worker names were drawn"
    assert not any(c in page for c in RAW), "no raw control or bidi character in the page either"
    assert "<h1>aiperf run x\\x1b[2K\\rFAKE LINE: verified</h1>" in page
