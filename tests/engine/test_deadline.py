"""``aiperf run --must-end-by T``: a run that cannot end before its batch job does is refused before it starts."""

from __future__ import annotations

import shutil
import time

import pytest
from helpers import run_cli

from aiperf.engine.deadline import STOP_MARGIN_S, check_fits
from aiperf.errors import AiperfError

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def test_a_run_that_fits_with_its_stop_margin_passes():
    check_fits(NOW + 3600 + STOP_MARGIN_S, 3600, now=NOW)
    check_fits(NOW + 3 * (600 + STOP_MARGIN_S), 600, runs=3, now=NOW)
    check_fits(NOW + 100 + STOP_MARGIN_S, 3600, elapsed_s=3500, now=NOW)  # a resumed run: what is left of it


@pytest.mark.parametrize(
    ("deadline", "budget", "runs", "elapsed", "needs", "advice"),
    [
        (NOW + 3600, 3600, 1, 0.0, "needs 3660 s (3600 s of budget + 60 s", "at most 3540"),
        (NOW + 7200, 3600, 2, 0.0, "needs 7320 s (2 runs x 3600 s of budget", "at most 3540"),
        (NOW + 30, 60, 1, 0.0, "needs 120 s", "the job has no time left for a run"),
        (NOW + 100, 3600, 1, 3550.0, "needs 110 s (50 s of budget", "at most 3590"),
        (NOW - 10, 60, 1, 0.0, "is 0 s away", "no time left"),
    ],
)
def test_a_run_that_does_not_fit_is_refused_with_the_numbers(deadline, budget, runs, elapsed, needs, advice):
    with pytest.raises(AiperfError) as info:
        check_fits(deadline, budget, runs=runs, elapsed_s=elapsed, now=NOW)
    message = str(info.value)
    assert message.startswith("--must-end-by 20") and "UTC" in message
    assert needs in message and advice in message and "\n" not in message


def test_the_cli_refuses_a_run_past_the_job_s_end_before_anything_is_written(tmp_path):
    results = tmp_path / "results"
    deadline = time.time() + 90  # the smoke run's 30 s budget + 60 s stop margin do not fit in 90 s from later
    proc = run_cli(
        "run", "--config", "smoke", "--set", f"run.results_dir={results}", "--set", "run.time_budget_s=60",
        "--must-end-by", f"{deadline:.0f}",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs 120 s (60 s of budget + 60 s to stop" in lines[0], lines
    assert not results.exists(), "nothing was started, nothing written"


@pytest.mark.parametrize("value", ["nan", "-1", "1e12", "tomorrow", "9" * 80])
def test_a_deadline_that_is_no_time_is_a_one_line_error(value):
    proc = run_cli("run", "--config", "smoke", "--must-end-by", value)
    assert proc.returncode == 2 and "--must-end-by must be a number from 0 to" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_resumed_run_is_checked_for_what_is_left_of_its_budget(sim_run, tmp_path):
    run = shutil.copytree(sim_run, tmp_path / "run")
    proc = run_cli("run", "--resume", str(run), "--must-end-by", f"{time.time() + 20:.0f}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"s of budget + {STOP_MARGIN_S:g} s to stop" in proc.stderr
    assert (run / "ledger.jsonl").read_bytes() == (sim_run / "ledger.jsonl").read_bytes(), "nothing appended"
