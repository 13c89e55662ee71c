"""``aiperf run --repeat N``: N ordinary runs with distinct seeds, their spread printed and recorded.

The runs also follow a size schedule (``search.size_growth``), so this is where a real run
shows that no trial was proposed above the band of its moment (docs/search.md).
"""

from __future__ import annotations

import json
import statistics

import pytest
from helpers import run_cli

from aiperf.ledger.schema import RunStartRecord, TrialStartRecord, of_type
from aiperf.ledger.store import read_ledger
from nas.schedule import SizeSchedule

# The runs end on their trial count (each about 20 s on 2 idle cores): the budget is where the schedule's
# band is read from, and long enough that a loaded box still completes epochs.
BUDGET_S = 90


@pytest.mark.slow
def test_repeat_runs_distinct_seeds_and_states_their_spread(tmp_path):
    proc = run_cli(
        "run",
        "--config",
        "smoke",
        "--repeat",
        "2",
        "--set",
        "run.seed=7",
        "--set",
        "run.max_trials=6",
        "--set",
        f"run.time_budget_s={BUDGET_S}",
        "--set",
        "search.size_growth=4",
        "--set",
        "search.size_band=1.4",
        "--set",
        "cluster.max_concurrent_trials=1",  # a TensorFlow start-up less per run: the runs' bookkeeping is under test
        "--set",
        f"run.results_dir={tmp_path}",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(runs) == 2
    seeds = sorted(of_type(read_ledger(r), RunStartRecord)[0].config.run.seed for r in runs)
    assert seeds == [7, 8]
    [record] = tmp_path.glob("repeat-*.json")
    document = json.loads(record.read_text())
    assert [r["seed"] for r in document["runs"]] == [7, 8]
    assert {r["run_dir"] for r in document["runs"]} == {str(r) for r in runs}
    ops = [r["ops_per_s"] for r in document["runs"]]
    s = document["spread"]["ops_per_s"]
    assert s["runs"] == 2 and s["median"] == pytest.approx(statistics.median(ops))
    assert s["cv"] == pytest.approx(statistics.stdev(ops) / statistics.fmean(ops))
    assert (s["min"], s["max"]) == (min(ops), max(ops))
    assert "2 run(s) of smoke, seeds 7, 8:" in proc.stdout
    for label in ("OPS", "regulated", "best val acc"):
        lines = [line.strip() for line in proc.stdout.splitlines()]
        assert any(line.startswith(label) and "median" in line and "CV" in line for line in lines)
    for run in runs:
        starts = of_type(read_ledger(run), TrialStartRecord)
        first = {s.trial: s for s in reversed(starts)}  # a retried trial keeps its first start
        [seed] = [s for s in first.values() if s.kind == "seed"]
        f0 = float(seed.flops.train_per_image)
        schedule = SizeSchedule(f0, 4 * f0, 1.4)
        for start in first.values():
            # Proposed for the band of the moment its training was expected to end, which it records.
            flops = float(start.flops.train_per_image) * (1 - 1e-3)  # counted at the trial's batch, not the plan's
            assert start.aimed_at is not None, start.trial
            assert schedule.admits(flops, start.aimed_at), start.trial
        assert max(float(s.flops.train_per_image) for s in first.values()) > f0  # the networks did grow
