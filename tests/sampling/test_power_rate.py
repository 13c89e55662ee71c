"""Power at >= 1 Hz (issue 52, item 5): each node reads its power sources on a thread of its own and hands the
readings over with its telemetry sample; energy integrates them, per run and per trial, and states the rate."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from helpers import REPO, aiperf_cmd, cli_env, two_trial_smoke_run

from aiperf.results.summary import format_summary
from aiperf.sampling.energy import energy_by_trial, expand_power, power_sampling, summarize_energy
from aiperf.sampling.telemetry import NodeSampler, read_telemetry

WATTS = {"command": "echo 150 W", "scope": "node", "reading": "watts", "covers": ["compute_nodes"], "timeout_s": 2.0}


def test_a_node_reads_its_power_on_its_own_thread_and_hands_every_reading_over_once(tmp_path):
    sampler = NodeSampler(meter=WATTS, powercap=str(tmp_path / "no-powercap"), power_interval_s=0.05)
    try:
        time.sleep(0.6)
        first = sampler.sample()
        time.sleep(0.3)
        second = sampler.sample()
    finally:
        sampler.close()
    assert len(first["power"]) >= 6 and len(second["power"]) >= 3
    walls = [r["node_wall"] for r in first["power"] + second["power"]]
    assert walls == sorted(walls) and len(set(walls)) == len(walls), "each reading handed over once, in order"
    assert all(r["meter"]["power_w"] == 150.0 and r["meter"]["scope"] == "node" for r in first["power"])
    assert "meter" not in first, "the meter is read by the power thread alone"
    assert second["power_cpu_s"] >= first["power_cpu_s"] > 0


def test_without_a_power_thread_the_sample_reads_the_meter_itself(tmp_path):
    sample = NodeSampler(meter=WATTS, powercap=str(tmp_path / "no-powercap")).sample()
    assert sample["meter"]["power_w"] == 150.0 and "power" not in sample


def _line(wall: float, node_wall: float, readings: list[tuple[float, float]], cpu: float = 0.01) -> dict:
    """A telemetry line of node n1 whose power thread read a node meter at the given (node_wall, watts)."""
    return {
        "wall": wall, "node_wall": node_wall, "node": "n1", "hostname": "h1", "accelerators": [], "rapl": [],
        "power": [{"node_wall": w, "accelerators": [], "rapl": [],
                   "meter": {"source": "echo", "scope": "node", "reading": "watts", "covers": ["compute_nodes"],
                             "power_w": p}} for w, p in readings],
        "power_cpu_s": cpu,
    }  # fmt: skip


def test_readings_are_put_on_the_master_s_clock_and_two_a_second_reach_the_methodology_s_rate():
    # the node's clock runs 3 s behind the master's; readings every 0.5 s for 20 s at 100 W
    lines = []
    for k in range(4):
        node_wall = 997.0 + 5 * k
        lines.append(_line(1000.0 + 5 * k, node_wall, [(node_wall - 5 + 0.5 * i, 100.0) for i in range(1, 11)]))
    expanded = expand_power(lines)
    assert len(expanded) == 4 + 40
    assert {e["wall"] for e in expanded if "power" not in e} >= {1000.0 + 0.5 * i for i in range(-9, 30)} - {1000.0}
    rate, cpu = power_sampling(lines)
    assert rate == pytest.approx(2.0, rel=0.05) and cpu == pytest.approx(0.01)
    out = summarize_energy(lines, ops_per_s=1e12, wall_s=20.0, run_start_wall=995.0)
    assert out["measured"] and out["power_w"] == pytest.approx(100.0)
    assert out["aspects"]["granularity"]["level"] == 2, out["aspects"]["granularity"]
    assert out["readings_per_s"] == pytest.approx(2.0, rel=0.05)


def test_a_nodes_energy_is_shared_among_the_trials_training_on_it_at_each_moment():
    readings = [(1000.0 + 0.5 * i, 100.0) for i in range(0, 41)]  # 100 W for 20 s
    lines = [_line(1020.0, 1020.0, readings)]
    spans = [
        {"trial": "a", "node": "n1", "start": 1000.0, "end": 1010.0},
        {"trial": "b", "node": "n1", "start": 1005.0, "end": 1015.0},
        {"trial": "elsewhere", "node": "n2", "start": 1000.0, "end": 1020.0},
    ]
    out = energy_by_trial(lines, spans)
    assert out is not None and out["trials"] == 2
    assert out["by_trial"] == {"a": pytest.approx(750.0), "b": pytest.approx(750.0)}  # alone 5 s, shared 5 s
    assert out["energy_j"] == pytest.approx(1500.0) and out["mean_j"] == pytest.approx(750.0)


def test_a_hostile_power_list_is_cleaned_like_the_rest_of_a_sample(tmp_path):
    line = _line(1000.0, 1000.0, [(999.5, 100.0)])
    line["power"] += [{"node_wall": "soon"}, "not a reading", {"node_wall": 999.9, "meter": {"scope": "node",
                      "power_w": "lots"}, "accelerators": [{"index": 0, "power_w": "HUGE"}]}]  # fmt: skip
    text = json.dumps(line).replace('"HUGE"', "1e400")  # a number JSON reads as infinity
    (tmp_path / "telemetry.jsonl").write_text(text + "\n")
    (sample,) = read_telemetry(tmp_path)
    assert [r["node_wall"] for r in sample["power"]] == [999.5, 999.9]
    assert sample["power"][1]["meter"]["power_w"] is None and sample["power"][1]["accelerators"][0]["power_w"] is None


@pytest.mark.slow
def test_a_run_with_a_site_meter_records_two_readings_a_second_and_each_trial_s_energy(tmp_path):
    settings = ["run.power_meter.command=echo 150 W", "run.power_interval_s=0.5", "run.telemetry_interval_s=2"]
    run = two_trial_smoke_run(tmp_path, *settings)
    summary = json.loads((run / "summary.json").read_text())
    energy = summary["energy"]
    assert energy["measured"] and energy["readings_per_s"] >= 1.0, energy
    assert energy["aspects"]["granularity"]["level"] >= 1
    assert energy["sampler_cpu_s"] is not None
    assert sorted(energy["trials"]["by_trial"]) == ["t00000", "t00001"]
    assert all(j > 0 for j in energy["trials"]["by_trial"].values())
    printed = format_summary(summary, run)
    assert "power read" in printed and "per trial on average" in printed
    verify = subprocess.run(aiperf_cmd("verify", str(run)), capture_output=True, text=True, env=cli_env(), cwd=REPO)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert energy["bound"] is True
    # The readings edited (150 W read as 15 W: ten times the OPS per watt) and the summary made again: the
    # ledger's run_stop binds the file as the run left it, so the forged readings reach no figure.
    telemetry = run / "telemetry.jsonl"
    telemetry.write_text(telemetry.read_text().replace('"power_w": 150.0', '"power_w": 15.0'))
    again = subprocess.run(aiperf_cmd("summary", str(run)), capture_output=True, text=True, env=cli_env(), cwd=REPO)
    assert again.returncode == 0, again.stdout + again.stderr
    forged = json.loads((run / "summary.json").read_text())["energy"]
    assert forged["measured"] is False and forged["bound"] is False and forged["ops_per_watt"] is None
    assert "is not what the ledger's run_stop binds" in forged["headline"]
