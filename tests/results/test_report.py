"""`aiperf report`: one self-contained page with the run's figures, rendered for real in headless Chromium."""

from __future__ import annotations

import base64
import json
import re

import pytest
from helpers import page_health, render_in_chromium, simulated_run
from PIL import Image

from aiperf.cli import main
from aiperf.errors import AiperfError
from aiperf.ledger.store import read_ledger
from aiperf.results.report import REPORT_NAME, write_report
from aiperf.sampling.telemetry import TELEMETRY_NAME

IMG = re.compile(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


@pytest.fixture(scope="module")
def report_run(tmp_path_factory):
    """A simulated run of its own, with telemetry as a GPU node would have recorded it, and its report."""
    run_dir = simulated_run(tmp_path_factory.mktemp("report") / "run")
    records = read_ledger(run_dir)
    walls = [r.wall for r in records]  # telemetry as a GPU node would have recorded it
    lines = []
    for k in range(12):
        wall = walls[0] + (walls[-1] - walls[0]) * k / 11
        lines.append(
            json.dumps(
                {
                    "wall": wall,
                    "node": "sim-node-0",
                    "hostname": "sim-node-0",
                    "cpu_percent": 30.0,
                    "host_mem_used_bytes": 1,
                    "host_mem_total_bytes": 2,
                    "accelerators": [
                        {
                            "index": 0,
                            "name": "GPU",
                            "util_percent": 50.0 + 4 * k,
                            "mem_used_bytes": 1,
                            "mem_total_bytes": 2,
                            "power_w": 200.0,
                        }
                    ],
                }
            )
        )
    (run_dir / TELEMETRY_NAME).write_text("\n".join(lines) + "\n")  # fmt: skip
    write_report(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def page(report_run):
    return (report_run / REPORT_NAME).read_text()


def test_the_page_is_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert "<link" not in page and "@import" not in page and "url(" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)


def test_every_figure_is_a_real_png(page):
    figures = dict(IMG.findall(page))
    expected = {"score over time", "best validation error", "OPS per node", "busy fraction", "utilisation",
                "architecture lineage"}  # fmt: skip
    assert set(figures) == expected
    for alt, data in figures.items():
        png = base64.b64decode(data)
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), alt
        assert len(png) > 5000, f"{alt} is suspiciously small"


def test_the_page_states_the_score_verdict_top_architectures_and_system(report_run, page):
    summary = json.loads((report_run / "summary.json").read_text())
    assert summary["score"]["regulated_human"] in page
    assert summary["score"]["ops_human"] in page
    assert json.dumps(summary["verdict"]["headline"])[1:-1].replace("<", "&lt;") in page
    best = summary["best"]
    top_table = page[page.index("Top architectures") :]
    first_row = top_table[top_table.index("<tbody>") :].split("</tr>")[0]
    assert f"{best['val_acc']:.4f}" in first_row  # ranked by accuracy (trials may tie on it)
    assert f"<td>{best['trial']}</td>" in top_table[: top_table.index("</table>")]
    for fact in ("sim-node-0", "sim-node-1", "digits-sim", "Rules in force", "min_accuracy", summary["run_id"]):
        assert fact in page, fact
    assert summary["ledger"]["last_hash"] in page


def test_output_option_and_cli(report_run, tmp_path, capsys):
    target = tmp_path / "elsewhere" / "r.html"
    assert main(["report", str(report_run), "--output", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert target.read_text().startswith("<!DOCTYPE html>")


def test_a_directory_that_is_not_a_run_is_a_one_line_error(tmp_path):
    with pytest.raises(AiperfError, match="no ledger"):
        write_report(tmp_path)


# --- rendering in a real browser ---------------------------------------------------------------


def test_the_error_detector_sees_a_broken_page(tmp_path):
    """The check below must be able to fail: a page whose script throws is reported as broken."""
    bad = tmp_path / "bad.html"
    page = ("<!DOCTYPE html><html><head><script>window.addEventListener('error', function (e) "
            "{ document.documentElement.setAttribute('data-errors', String(e.message)); });</script></head>"
            "<body><p>x</p><script>undefinedFunction();</script></body></html>")  # fmt: skip
    bad.write_text(page)
    ready, _, caught, console_errors = page_health(bad, tmp_path)
    assert not ready
    assert caught and "undefinedFunction" in caught
    assert any("undefinedFunction" in line for line in console_errors)


def test_chromium_renders_the_report_without_script_errors(report_run, tmp_path):
    _renders_whole_in_chromium(report_run / REPORT_NAME, tmp_path)


def _renders_whole_in_chromium(html_path, tmp_path):
    """The page's script ran to its end with no error, every figure was shown, and a screenshot is not blank."""
    ready, images, caught, console_errors = page_health(html_path, tmp_path)
    assert caught is None, f"the page caught script errors: {caught}"
    assert not console_errors, console_errors
    assert ready, "the page's script did not run to its end"
    assert images is not None and images[0] == images[1] == str(html_path.read_text().count("<img ")), images
    shot = tmp_path / "report.png"
    proc, _ = render_in_chromium(html_path, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    assert shot.exists(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2400)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "the screenshot is (nearly) blank"
    background = max(colours)[0] / (1280 * 2400)
    assert background < 0.9, f"{background:.0%} of the screenshot is one colour"
    grey = image.convert("L")
    assert grey.getextrema()[0] < 60, "no dark text or lines were drawn"


@pytest.mark.slow
def test_the_real_smoke_run_got_its_report(smoke_run):
    run_dir, proc = smoke_run
    page = (run_dir / REPORT_NAME).read_text()
    assert f"aiperf: report {run_dir / REPORT_NAME}" in proc.stdout
    assert len(IMG.findall(page)) == 6  # with the real node's CPU telemetry
    assert "https://" not in page and "http://" not in page


@pytest.mark.slow
def test_the_real_smoke_run_s_report_renders_whole_in_chromium(smoke_run, tmp_path):
    _renders_whole_in_chromium(smoke_run[0] / REPORT_NAME, tmp_path)


def test_the_ops_per_node_plot_spreads_each_epoch_over_the_time_it_trained():
    import numpy as np
    import pandas as pd

    from aiperf.results.plots import _spread_ops

    epochs = pd.DataFrame({"t": [10.0, 20.0, 20.0], "train_s": [10.0, 9.0, 0.0], "eval_s": [0.0, 1.0, 0.0],
                           "ops": [100.0, 100.0, 50.0]})  # fmt: skip
    sums = _spread_ops(epochs, np.array([0.0, 5.0, 10.0, 15.0, 20.0]))
    assert list(sums) == [50.0, 50.0, 50.0, 100.0]  # the last epoch had no busy time: all of it where it ended
    assert sums.sum() == epochs["ops"].sum()


def test_the_ops_per_node_bins_span_the_whole_run_and_the_run_s_rate_is_read_from_its_summary():
    import pandas as pd

    from aiperf.results.plots import node_rates, ops_per_node
    from aiperf.results.report import run_rate

    epochs = pd.DataFrame({"t": [4.0, 6.0], "train_s": [2.0, 2.0], "eval_s": [0.0, 0.0], "ops": [40.0, 40.0],
                           "node": ["a", "b"]})  # fmt: skip
    edges, series = node_rates(epochs, bins=5, span_s=10.0)  # the run went on 4 s after its last epoch
    assert list(edges) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert list(series["a"]) == [0.0, 20.0, 0.0, 0.0, 0.0] and list(series["b"]) == [0.0, 0.0, 20.0, 0.0, 0.0]
    assert node_rates(epochs, bins=5)[0][-1] == 6.0  # without the run's span: to the last epoch's end
    summary = {"score": {"wall_s": 10.0, "ops_per_s": 8.0}, "devices": {"nodes": 2}}
    assert run_rate(summary) == (10.0, 8.0, 2)
    assert run_rate({"score": {"wall_s": None}, "devices": {"nodes": 2}}) is None  # a run with nothing counted
    assert run_rate({}) is None
    assert ops_per_node(epochs, {}, bins=5, run=(10.0, 8.0, 2)).startswith(b"\x89PNG")
