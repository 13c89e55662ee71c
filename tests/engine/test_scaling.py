"""`aiperf scaling`: simulated weak-scaling study, its table and plot, and the real mode's preconditions."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from aiperf.cli import main
from aiperf.engine.scaling import scaling_command, scaling_table
from aiperf.errors import AiperfError
from aiperf.ledger.store import read_raw_ledger
from aiperf.results.verify import verify_run

pytestmark = pytest.mark.slow  # whole simulated and real scaling studies


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling") / "study"
    text = scaling_command([2, 1], simulate=True, config="smoke", overrides=["run.time_budget_s=100"], address=None,
                           output=str(out))  # fmt: skip
    return out, text


def test_each_size_is_a_verifiable_run_on_exactly_that_many_nodes(study):
    out, _ = study
    for n in (1, 2):
        run_dir = out / f"nodes-{n:04d}"
        ok, message = verify_run(run_dir)
        assert ok, message
        records = read_raw_ledger(run_dir)
        plan = records[0]["plan"]
        assert len(plan["nodes"]) == n
        assert plan["concurrency"] == 8 * n  # the same workers per node at every size: weak scaling
        used = {r["node"] for r in records if r["type"] == "epoch"}
        assert used == {f"sim-node-{k}" for k in range(n)}, "every node did counted work"
        assert (run_dir / "mllog.txt").exists()


def test_the_table_holds_score_per_node_and_efficiency_against_the_smallest_size(study):
    out, text = study
    table = pd.read_csv(out / "scaling.csv")
    assert list(table["nodes"]) == [1, 2]
    assert list(table["workers"]) == [8, 16]
    assert table["efficiency"].iloc[0] == pytest.approx(1.0)
    per_node = table["ops_per_s"] / table["nodes"]
    assert list(table["ops_per_s_per_node"]) == pytest.approx(list(per_node))
    assert table["efficiency"].iloc[1] == pytest.approx(per_node.iloc[1] / per_node.iloc[0])
    assert (table["ops_per_s"] > 0).all() and (table["busy_fraction"] > 0.5).all()
    markdown = (out / "scaling.md").read_text()
    assert markdown in text and "| 2 | 16 |" in markdown and "100.0%" in markdown
    assert (out / "scaling.png").read_bytes().startswith(b"\x89PNG")


def test_efficiency_is_relative_to_the_smallest_size():
    rows = [
        {"nodes": 4, "workers": 4, "trials": 1, "epochs": 1, "total_ops": 1.0, "wall_s": 1.0, "ops_per_s": 300.0,
         "regulated": 600.0, "best_val_acc": 0.9, "busy_fraction": 0.9, "run_dir": "c"},
        {"nodes": 1, "workers": 1, "trials": 1, "epochs": 1, "total_ops": 1.0, "wall_s": 1.0, "ops_per_s": 100.0,
         "regulated": 200.0, "best_val_acc": 0.9, "busy_fraction": 0.9, "run_dir": "a"},
        {"nodes": 2, "workers": 2, "trials": 1, "epochs": 1, "total_ops": 1.0, "wall_s": 1.0, "ops_per_s": 200.0,
         "regulated": 400.0, "best_val_acc": 0.9, "busy_fraction": 0.9, "run_dir": "b"},
    ]  # fmt: skip
    table = scaling_table(rows)
    assert list(table["nodes"]) == [1, 2, 4]
    assert list(table["efficiency"]) == pytest.approx([1.0, 1.0, 0.75])
    assert list(table["regulated_per_node"]) == pytest.approx([200.0, 200.0, 150.0])
    rows[1]["ops_per_s"] = 0.0  # nothing counted at the smallest size: no meaningful efficiency
    assert all(math.isnan(e) for e in scaling_table(rows)["efficiency"])


def test_an_existing_output_is_not_overwritten(study):
    out, _ = study
    with pytest.raises(AiperfError, match="already exists"):
        scaling_command([1], simulate=True, config="smoke", overrides=[], address=None, output=str(out))


def test_real_mode_explains_what_it_needs(tmp_path, capsys):
    args = ["scaling", "--nodes", "1,64", "--config", "smoke", "--output", str(tmp_path / "s")]
    assert main(args) == 2  # a local one-node Ray cluster cannot hold 64 nodes
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "64 nodes" in err[0] and "alive node" in err[0]
    assert not (tmp_path / "s").exists()
