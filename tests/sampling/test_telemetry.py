"""Telemetry: the NVML path against a fake pynvml, host counters, energy from power samples, the summary section."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import types

import pytest

from aiperf.errors import AiperfError
from aiperf.ledger.schema import Record
from aiperf.ledger.store import LedgerWriter
from aiperf.results.summary import build_summary, format_summary
from aiperf.sampling.energy import summarize_energy
from aiperf.sampling.telemetry import (
    TELEMETRY_NAME,
    NodeSampler,
    TelemetryRecorder,
    read_telemetry,
    summarize_telemetry,
)


class _NVMLError(Exception):
    pass


def _fake_pynvml(power_mw=(250_000, None), init_fails=False):
    """A stand-in for nvidia-ml-py with two devices; ``None`` power means the board does not report it."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _NVMLError
    mod.shutdown_calls = 0

    def init():
        if init_fails:
            raise _NVMLError("Driver Not Loaded")

    def power(handle):
        if power_mw[handle] is None:
            raise _NVMLError("Not Supported")
        return power_mw[handle]

    def shutdown():
        mod.shutdown_calls += 1

    mod.nvmlInit = init
    mod.nvmlShutdown = shutdown
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda k: k
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=[97, 12][h], memory=40)
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=[60, 2][h] * 2**30, total=80 * 2**30)
    mod.nvmlDeviceGetPowerUsage = power
    mod.process_samples = {0: [(os.getpid(), 30), (os.getppid(), 20)]}  # device 1: not supported

    def process_utilization(handle, last_seen):
        if handle not in mod.process_samples:
            raise _NVMLError("Not Supported")
        return [types.SimpleNamespace(pid=pid, smUtil=util, memUtil=0, timeStamp=last_seen + 1)
                for pid, util in mod.process_samples[handle]]  # fmt: skip

    mod.nvmlDeviceGetProcessUtilization = process_utilization
    return mod


def test_nvml_devices_are_sampled_with_utilisation_memory_and_power(monkeypatch):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = NodeSampler()
    sample = sampler.sample()
    first, second = sample["accelerators"]
    assert first == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_percent": 97.0,
                     "mem_used_bytes": 60 * 2**30, "mem_total_bytes": 80 * 2**30, "power_w": 250.0,
                     "outside_util_percent": 50.0, "energy_mj": None}  # fmt: skip
    assert second["util_percent"] == 12.0 and second["power_w"] is None  # power not supported: unknown, not 0
    assert second["outside_util_percent"] is None  # no per-process figures: unknown, not 0
    assert 0.0 <= sample["cpu_percent"] <= 100.0
    assert 0 < sample["host_mem_used_bytes"] <= sample["host_mem_total_bytes"]
    json.dumps(sample)  # a sample crosses the Ray boundary and lands in a JSON line
    sampler.close()
    assert fake.shutdown_calls == 1


def test_a_node_without_a_working_nvml_reports_host_counters_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_fails=True))
    assert NodeSampler().sample()["accelerators"] == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import raises ImportError
    sample = NodeSampler().sample()
    assert sample["accelerators"] == [] and sample["host_mem_total_bytes"] > 0


def _sample(wall, node="n1", watts=(100.0, 200.0), util=(50.0, 70.0), cpu=40.0):
    return {"wall": wall, "node": node, "cpu_percent": cpu, "host_mem_used_bytes": 5, "host_mem_total_bytes": 10,
            "accelerators": [{"index": k, "util_percent": u, "mem_used_bytes": 7, "mem_total_bytes": 8, "power_w": w}
                             for k, (w, u) in enumerate(zip(watts, util, strict=True))]}  # fmt: skip


def test_energy_is_power_integrated_over_time_and_gives_ops_per_watt():
    samples = [_sample(1000.0), _sample(1005.0), _sample(1010.0, watts=(300.0, 200.0))]
    out = summarize_energy(samples, ops_per_s=1e11, wall_s=10.0, interval_s=5.0)
    # device 0: 5 s at 100 W + 5 s ramping 100 -> 300 W = 500 + 1000 J; device 1: 10 s at 200 W = 2000 J
    assert out["energy_j"] == pytest.approx(3500.0)
    assert out["power_w"] == pytest.approx(350.0)
    assert out["ops_per_watt"] == pytest.approx(1e11 / 350.0)
    tel = summarize_telemetry(samples, interval_s=5.0)
    assert tel["accelerator_util_mean_percent"] == pytest.approx(60.0)
    assert tel["cpu_util_mean_percent"] == pytest.approx(40.0)
    assert tel["samples"] == 3 and tel["nodes"] == 1 and tel["accelerators"] == 2
    assert tel["span_s"] == pytest.approx(10.0)


def test_without_power_there_is_no_energy_and_no_ops_per_watt():
    samples = [_sample(0.0, watts=(None, None)), _sample(5.0, watts=(None, None)),
               {"wall": 6.0, "node": "n2", "error": "ActorDiedError: the node died"}]  # fmt: skip
    energy = summarize_energy(samples, ops_per_s=1e12, wall_s=5.0)
    assert energy["energy_j"] is None and energy["ops_per_watt"] is None and energy["power_w"] is None
    assert (
        energy["not_available"]["accelerators"]
        == "NVML reports neither an energy counter nor power for the accelerators"
    )
    out = summarize_telemetry(samples)
    assert out["nodes_lost"] == ["n2"]
    assert out["samples"] == 2


def test_the_summary_gains_a_telemetry_section_only_when_samples_exist(tmp_path):
    with LedgerWriter(tmp_path) as ledger:
        config = {"run": {"name": "x", "telemetry_interval_s": 5.0}}
        ledger.append(Record(type="run_start", t=0.0, run_id="r", config=config, plan={},
                             dataset={"split": {"disjoint": True}}, rules={}))  # fmt: skip
        ledger.append(
            Record(type="trial_start", trial="t0", kind="seed", arch_id="a", params=1, flops={"train_per_image": 1.0})
        )
        ledger.append(Record(type="epoch", t=10.0, trial="t0", epoch=1, ops=7e12, train_ops=6e12, eval_ops=1e12,
                             aiperf_ops=7e12, val_acc=0.9, precision="float32"))  # fmt: skip
        ledger.append(Record(type="run_stop", status="completed", reason=""))
    assert "telemetry" not in build_summary(tmp_path)
    lines = [json.dumps(_sample(100.0)), json.dumps(_sample(110.0)), '{"wall": 1']  # the last line was torn
    (tmp_path / TELEMETRY_NAME).write_text("\n".join(lines))
    assert len(read_telemetry(tmp_path)) == 2
    summary = build_summary(tmp_path)
    tel, energy = summary["telemetry"], summary["energy"]
    assert tel["interval_s"] == 5.0 and energy["energy_j"] == pytest.approx(3000.0)
    assert energy["ops_per_watt"] == pytest.approx(summary["score"]["ops_per_s"] / 300.0)
    lines = format_summary(summary, tmp_path).splitlines()
    assert "accelerators 60% busy" in next(x for x in lines if "telemetry" in x)
    assert "OPS/W, below level 1: accelerators only" in next(x for x in lines if x.startswith("  energy"))


def test_a_non_positive_interval_is_refused(tmp_path):
    with pytest.raises(AiperfError, match="telemetry interval"):
        TelemetryRecorder(tmp_path, 0)


@pytest.mark.slow
def test_the_real_smoke_run_sampled_its_node(smoke_run):
    """The recorder ran as a Ray actor on the node during the real run and the summary used it."""
    run_dir, proc = smoke_run
    samples = read_telemetry(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    node = summary["devices"]["nodes"]
    assert len(samples) >= 2
    assert len({s["node"] for s in samples}) == node == 1
    assert all(0.0 <= s["cpu_percent"] <= 100.0 and s["host_mem_total_bytes"] > 0 for s in samples)
    walls = [s["wall"] for s in samples]
    assert walls == sorted(walls)
    assert summary["telemetry"]["samples"] == len(samples)
    assert "telemetry" in proc.stdout


def test_the_run_stop_binds_every_byte_of_telemetry_across_sessions(tmp_path):
    """telemetry.jsonl is outside the hash chain; the run_stop binds its size and SHA-256, what an earlier
    session wrote (a line a crash tore included) and this one's samples, so an edit reaches no figure."""

    from aiperf.sampling.telemetry import BoundTelemetry, TelemetryBinding, TelemetryRecorder, read_bound_telemetry

    path = tmp_path / "telemetry.jsonl"
    path.write_text('{"node": "n1", "wall": 1.0}\n{"node": "n1", "wa')  # the first session, killed mid-line
    recorder = TelemetryRecorder(tmp_path, 5.0)
    assert recorder.open()
    recorder.write({"wall": 3.0, "node": "n1", "cpu_percent": 50.0})
    recorder.stop()
    data = path.read_bytes()
    fields = recorder.run_stop_fields()
    assert fields == {"telemetry_bytes": len(data), "telemetry_sha256": hashlib.sha256(data).hexdigest()}
    binding = TelemetryBinding(fields["telemetry_bytes"], fields["telemetry_sha256"])
    bound = read_bound_telemetry(tmp_path, binding)
    assert bound.bound is True and [s["wall"] for s in bound.samples] == [1.0, 3.0]
    with open(path, "a") as fh:  # written after the run stopped: not what the ledger binds, not read
        fh.write('{"node": "n1", "wall": 4.0}\n')
    assert [s["wall"] for s in read_bound_telemetry(tmp_path, binding).samples] == [1.0, 3.0]
    path.write_bytes(data.replace(b'"cpu_percent": 50.0', b'"cpu_percent": 10.0'))  # an edited reading
    assert read_bound_telemetry(tmp_path, binding) == BoundTelemetry([], False)
    path.unlink()
    assert read_bound_telemetry(tmp_path, binding) == BoundTelemetry([], False)
    assert read_bound_telemetry(tmp_path, None) == BoundTelemetry([], None)  # a ledger that binds none


class _Sampler:
    """A node's sampler actor as the recorder calls it: ``sample.remote()`` gives what ``ray.get`` returns."""

    def __init__(self, node: str, alive: bool = True) -> None:
        self.node, self.alive = node, alive
        self.sample = types.SimpleNamespace(remote=lambda: self)


def _fake_ray() -> types.ModuleType:
    fake = types.ModuleType("ray")

    def get(sampler):
        if not sampler.alive:
            raise RuntimeError(f"the actor on {sampler.node} died unexpectedly")
        return {"wall": 1.0, "cpu_percent": 10.0}

    fake.wait = lambda refs, num_returns, timeout: (list(refs), [])
    fake.get = get
    return fake


def test_a_sampler_lost_mid_run_is_a_lost_node_and_one_lost_after_the_run_was_signalled_is_not(tmp_path, monkeypatch):
    from aiperf.sampling.telemetry import TelemetryRecorder

    monkeypatch.setitem(sys.modules, "ray", _fake_ray())
    recorder = TelemetryRecorder(tmp_path, 5.0)
    assert recorder.open()
    n2, n3 = _Sampler("n2"), _Sampler("n3")
    recorder._actors = {"n1": _Sampler("n1"), "n2": n2, "n3": n3}
    n2.alive = False  # dies while the run goes on
    recorder.sample_once()
    recorder.run_stopping()  # SIGTERM to the master: scancel or the job's time limit
    n3.alive = False  # the batch system stopped its node too
    recorder.sample_once()
    recorder.stop()
    samples = [json.loads(line) for line in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    out = summarize_telemetry(samples)
    assert out["nodes_lost"] == ["n2"], "only the node that died during the run"
    assert out["samples"] == 2 + 1 and out["nodes"] == 2  # n1 twice, n3 before the signal


def test_the_recorder_stops_within_seconds_when_ray_no_longer_answers_and_binds_what_it_wrote(tmp_path, monkeypatch):
    # scancel stops the job's Ray processes with the master: a round of samples waits on Ray and releasing a
    # sampler waits for a control plane that is gone. Slurm kills the master KillWait (30 s) after its SIGTERM,
    # so its run_stop, written after the recorder stops, must not wait on either.
    from aiperf.sampling.telemetry import TelemetryRecorder

    answer, released = threading.Event(), []
    fake = _fake_ray()
    fake.wait = lambda refs, num_returns, timeout: (answer.wait(timeout), (list(refs), []))[1]
    fake.kill = lambda actor: (time.sleep(60), released.append(actor.node))
    monkeypatch.setitem(sys.modules, "ray", fake)
    recorder = TelemetryRecorder(tmp_path, 0.05)
    assert recorder.open()
    recorder._actors = {"n1": _Sampler("n1")}
    recorder.sample_once()
    fake.wait = lambda refs, num_returns, timeout: (answer.wait(60), (list(refs), []))[1]  # Ray stops answering
    recorder._thread = threading.Thread(target=recorder._loop, daemon=True)
    recorder._thread.start()
    t0 = time.monotonic()
    recorder.stop()
    assert time.monotonic() - t0 < 10, "the run's end waited on Ray"
    answer.set()  # the round still waiting gets its answer after the run stopped: written nowhere
    time.sleep(0.2)
    data = (tmp_path / "telemetry.jsonl").read_bytes()
    assert data.count(b"\n") == 1 and recorder.samples == 1
    assert recorder.run_stop_fields() == {
        "telemetry_bytes": len(data),
        "telemetry_sha256": hashlib.sha256(data).hexdigest(),
    }
