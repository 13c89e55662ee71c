"""The live progress line: what a person watching a run's first seconds is told (issue 45)."""

from __future__ import annotations

import io

from aiperf.engine.progress import WORKER_NOTES, Progress


def test_the_line_counts_workers_ready_while_they_start_and_says_each_start():
    out = io.StringIO()
    progress = Progress(1.0, 60.0, out, workers=2)
    assert "workers 0/2 ready (starting: Ray, framework, dataset, matmul ceiling)" in progress.line(5.0, 0, 2)
    progress.worker_ready("worker w0000 on node vm", 8.2)
    assert "workers 1/2 ready" in progress.line(9.0, 1, 1)
    progress.worker_ready("worker w0001 on node vm", 9.4)
    assert "ready" not in progress.line(10.0, 2, 2), "once every worker started the line is the run's again"
    said = out.getvalue().splitlines()
    assert said == [
        "worker w0000 on node vm ready at 8.2 s (1 of 2)",
        "worker w0001 on node vm ready at 9.4 s (2 of 2)",
    ]


def test_a_large_run_counts_its_workers_without_a_line_for_each():
    out = io.StringIO()
    progress = Progress(1.0, 60.0, out, workers=WORKER_NOTES + 1)
    for k in range(WORKER_NOTES + 1):
        progress.worker_ready(f"worker w{k:04d} on node n{k}", 3.0)
    assert out.getvalue() == "" and "ready" not in progress.line(4.0, 0)


def test_the_best_quality_shows_as_the_run_s_family_states_it():
    image, language = Progress(1.0, 60.0, io.StringIO()), Progress(1.0, 60.0, io.StringIO(), family="language")
    assert "best val acc -" in image.line(1.0, 0) and "best bits/byte -" in language.line(1.0, 0)
    for progress in (image, language):
        progress.epoch(1e9, 0.75, 2.0)
    assert "best val acc 0.7500" in image.line(3.0, 0)
    assert "best bits/byte 2.000" in language.line(3.0, 0)  # 8 x (1 - quality)
