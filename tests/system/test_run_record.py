"""What ``aiperf run`` records: the measured kinds in run_start (typed, under the chain) and each worker's ceiling."""

from __future__ import annotations

import pytest

from aiperf.cluster.plan import make_plan
from aiperf.cluster.resources import NodeInfo, probe_this_node
from aiperf.config import load_config
from aiperf.engine.assembly import system_description
from aiperf.ledger.schema import RunStartRecord, WorkerRecord, of_type
from aiperf.ledger.store import read_ledger


def test_the_probe_describes_this_node_without_importing_a_framework():
    import subprocess
    import sys

    from helpers import REPO, cli_env

    facts = probe_this_node("tensorflow")
    description = facts["description"]
    assert description["cpu"]["threads"] >= 1 and description["memory_bytes"] > 0
    assert description["software"]["backend"] == "tensorflow" and description["commit"]
    code = (
        "import sys; from aiperf.cluster.resources import probe_this_node; probe_this_node('tensorflow');"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def _node(node_id: str, description: dict) -> NodeInfo:
    return NodeInfo(node_id, "10.0.0.1", 16.0, 2.0, 2**36, hostname=node_id, description=description)


def test_run_start_holds_one_kind_per_configuration_with_usage_and_peaks():
    gpu = {
        "cpu": {"model": "Xeon", "cores": 16, "threads": 32, "max_mhz": 3000.0, "vector_isa": "avx512"},
        "memory_bytes": 2**36,
        "accelerators": [{"index": k, "name": "NVIDIA A100-SXM4-80GB"} for k in range(2)],
    }
    nodes = [_node("a", gpu), _node("b", gpu), _node("c", {**gpu, "accelerators": []})]
    nodes[2].gpus = 0.0
    cfg = load_config("smoke")
    plan = make_plan(nodes, cfg)
    system = system_description(nodes, plan, {"Xeon": {"float32": 1e11}})
    assert "description" not in system["nodes"][0]  # recorded once per kind, not per node
    start = RunStartRecord(run_id="r", system=system)  # typed: a wrong field would fail here
    kinds = start.system.kinds
    assert [(k.count, k.nodes, k.used_accelerators) for k in kinds] == [(2, ["a", "b"], 4), (1, ["c"], 0)]
    assert kinds[0].peaks.per_accelerator["bfloat16"].flops_per_s == pytest.approx(312e12)
    assert kinds[1].peaks.per_core["float32"].source == "declared"  # no cpufreq clock: the declared figure wins
    assert start.system.declared_peak == {"Xeon": {"float32": 1e11}}
    assert start.to_dict()["system"]["kinds"][0]["count"] == 2


@pytest.mark.slow
def test_a_real_run_records_its_system_and_ceilings_and_its_efficiency_is_a_fraction(smoke_run):
    run_dir, proc = smoke_run
    records = read_ledger(run_dir)
    start = records[0]
    assert isinstance(start, RunStartRecord)
    (kind,) = start.system.kinds
    assert kind.used_cores >= 1 and kind.peaks.per_core["float32"] is not None
    workers = of_type(records, WorkerRecord)
    assert workers and all(w.ceiling is not None and (w.ceiling.flops_per_s or 0) > 0 for w in workers)
    assert all(w.ceiling.seconds <= (w.init_s or 0) for w in workers if w.ceiling)
    # Ray's default would be 15, below every other program on the box: the trials train at the user's priority.
    assert [w.niceness for w in workers] == [0] * len(workers)
    import json

    efficiency = json.loads((run_dir / "summary.json").read_text())["efficiency"]
    assert 0 < efficiency["ops_over_rpeak"] <= 1 and 0 < efficiency["ops_over_ceiling"] <= 1
    assert "  efficiency           " in proc.stdout
