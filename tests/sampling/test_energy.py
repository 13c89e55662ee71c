"""Energy by the book (issue 21, item 3): RAPL against a fake powercap tree, NVML's energy counter against
a fake pynvml, a site meter as a real command (good, hung, garbage), the figure, its sources and its level."""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap
import time
import types

import psutil
import pytest

from aiperf.config import load_config
from aiperf.errors import AiperfError
from aiperf.ledger.schema import Record
from aiperf.ledger.store import LedgerWriter, read_ledger
from aiperf.results.report import _energy_section
from aiperf.results.summary import build_summary, format_summary
from aiperf.sampling.energy import (
    METER_MAX_FAILURES,
    METER_OUTPUT_BYTES,
    RAPL_NOT_READABLE,
    PowercapZones,
    SiteMeter,
    format_energy,
    parse_meter_output,
    run_meter,
    summarize_energy,
)
from aiperf.sampling.telemetry import TELEMETRY_NAME, NodeSampler, TelemetryRecorder, read_telemetry

TOP = 262_143_328_850  # a real package zone's max_energy_range_uj


# --- a fake powercap tree --------------------------------------------------------------------


def _zone(root: pathlib.Path, entry: str, name: str, energy: int | None, top: int | None = TOP) -> None:
    zone = root / entry
    zone.mkdir(parents=True)
    (zone / "name").write_text(name + "\n")
    if energy is not None:
        (zone / "energy_uj").write_text(f"{energy}\n")
    if top is not None:
        (zone / "max_energy_range_uj").write_text(f"{top}\n")


@pytest.fixture
def powercap(tmp_path, monkeypatch):
    """package-0 (near its wrap), its dram zone readable by root only, a core subzone, package-1,
    and an MMIO duplicate of package-0 that must be left out."""
    root = tmp_path / "powercap"
    _zone(root, "intel-rapl:0", "package-0", TOP - 250_000_000)
    _zone(root, "intel-rapl:0:0", "dram", 5)
    _zone(root, "intel-rapl:0:1", "core", 1_000)
    _zone(root, "intel-rapl:1", "package-1", 10_000_000)
    _zone(root, "intel-rapl-mmio:0", "package-0", 0)
    unreadable = root / "intel-rapl:0:0" / "energy_uj"
    unreadable.chmod(0)
    real_read_text = pathlib.Path.read_text

    def read_text(self, *args, **kwargs):
        if self == unreadable:  # tests run as root here, where chmod alone does not stop a read
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    return root


def _advance(root: pathlib.Path, entry: str, value: int) -> None:
    (root / entry / "energy_uj").write_text(f"{value}\n")


def test_rapl_zones_are_read_raw_and_an_unreadable_counter_is_named(powercap):
    zones = PowercapZones(powercap).read()
    assert [z["zone"] for z in zones] == ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:1"]
    package, dram, core, package1 = zones
    assert package == {"zone": "intel-rapl:0", "name": "package-0", "energy_uj": TOP - 250_000_000,
                       "max_energy_range_uj": TOP}  # fmt: skip
    assert dram == {"zone": "intel-rapl:0:0", "name": "dram", "error": RAPL_NOT_READABLE}
    assert "CVE-2020-8694" in RAPL_NOT_READABLE
    assert core["name"] == "core" and package1["energy_uj"] == 10_000_000
    assert PowercapZones(powercap / "absent").read() == []  # no powercap interface at all


# --- a fake NVML -------------------------------------------------------------------------------


class _NVMLError(Exception):
    pass


def _fake_pynvml(energy_mj: dict[int, int], power_mw: dict[int, int]):
    """Two devices; device 0 has the energy counter, device 1 (an older board) power only."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _NVMLError

    def energy(handle):
        if handle not in energy_mj:
            raise _NVMLError("Not Supported")
        return energy_mj[handle]

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda k: k
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H100"
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90, memory=40)
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30, total=2**34)
    mod.nvmlDeviceGetPowerUsage = lambda h: power_mw[h]
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    return mod


def _meter_script(tmp_path, body: str, name: str = "meter.py") -> str:
    path = tmp_path / name
    path.write_text("import sys, time, os\n" + textwrap.dedent(body))
    return f"{sys.executable} {path}"


def _spec(command: str, **kw) -> dict:
    return {"command": command, "scope": "node", "reading": "watts", "covers": ["compute_nodes"], "timeout_s": 2.0,
            **kw}  # fmt: skip


def test_the_sampler_reports_nvml_energy_rapl_counters_and_the_site_meter(powercap, tmp_path, monkeypatch):
    energy_mj, power_mw = {0: 5_000_000}, {0: 200_000, 1: 50_000}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(energy_mj, power_mw))
    meter = _spec(_meter_script(tmp_path, "print('702.5 W')"))
    sampler = NodeSampler(meter=meter, powercap=str(powercap))
    first = sampler.sample()
    assert [a["energy_mj"] for a in first["accelerators"]] == [5_000_000, None]  # device 1: no counter
    assert [a["power_w"] for a in first["accelerators"]] == [200.0, 50.0]
    assert [z.get("energy_uj") for z in first["rapl"]] == [TOP - 250_000_000, None, 1_000, 10_000_000]
    assert first["meter"] == {"source": pathlib.Path(sys.executable).name, "scope": "node",
                              "reading": "watts", "covers": ["compute_nodes"], "power_w": 702.5}  # fmt: skip
    assert "meter.py" not in json.dumps(first["meter"])  # only the program is recorded, never its arguments
    json.dumps(first)
    no_meter = NodeSampler(powercap=str(powercap)).sample()
    assert "meter" not in no_meter and len(no_meter["rapl"]) == 4


# --- the site meter command ------------------------------------------------------------------


def test_a_meter_reading_is_parsed_strictly():
    assert parse_meter_output(b"412.5\n", "watts") == 412.5
    assert parse_meter_output(b"  412 W\n", "watts") == 412.0
    assert parse_meter_output(b"1.5e6 J", "joules") == 1.5e6
    for bad, why in [(b"", "printed nothing"), (b"hello", "not one number"), (b"412\n413", "not one number"),
                     (b"nan", "not one number"), (b"-5", "not one number"), (b"0", "0 W"),
                     (b"12 kW", "'kW'"), (b"12 J", "'J'"), (b"\xff\xfe", "not ASCII"), (b"1e300", "out of range"),
                     (b"Power: 412 W", "not one number")]:  # fmt: skip
        with pytest.raises(ValueError, match=why):
            parse_meter_output(bad, "watts")


def test_a_meter_command_runs_without_a_shell(tmp_path):
    assert run_meter([sys.executable, "-c", "print(88)"], 2.0, "watts") == 88.0
    echo = _meter_script(tmp_path, "print(sys.argv[1])") + " '1; echo 5'"
    assert SiteMeter(_spec(echo)).read()["error"] == "printed '1; echo 5', not one number"  # one argument, no shell


def test_a_hung_meter_is_killed_at_its_timeout_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    command = _meter_script(
        tmp_path,
        f"""
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
        """,
    )
    started = time.monotonic()
    reading = SiteMeter(_spec(command, timeout_s=3.0)).read()  # long enough for a loaded box to start both
    assert time.monotonic() - started < 6.0
    assert reading["error"] == "did not exit within 3 s"
    for pid in map(int, pids.read_text().split()):
        assert _gone_within(pid, 5.0), f"process {pid} of the hung meter is still alive"


def test_a_meter_that_leaves_a_child_in_the_background_is_read_and_the_child_killed(tmp_path):
    """``echo 100; sleep 301 &``: the meter printed its reading and exited, but the child it left holds the
    pipe open. Its reading counts (it is the meter's), and the child does not outlive it (issue 45, case 12)."""
    pids = tmp_path / "pids"
    command = _meter_script(
        tmp_path,
        f"""
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(301)"])
        open({str(pids)!r}, "w").write(str(child.pid))
        print(100, flush=True)
        os._exit(0)
        """,
    )
    started = time.monotonic()
    assert SiteMeter(_spec(command, timeout_s=3.0)).read()["power_w"] == 100.0
    assert time.monotonic() - started < 3.0  # read when the meter exited, not at its timeout
    assert _gone_within(int(pids.read_text()), 5.0), "the meter's background child is still alive"


def _gone_within(pid: int, seconds: float) -> bool:
    """The process has exited (a zombie waiting for its parent counts) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("print('garbage')", "printed 'garbage', not one number"),
        ("sys.stdout.write('9' * 100000)", f"printed more than {METER_OUTPUT_BYTES} bytes"),
        ("print(300); sys.exit(3)", "exited with status 3"),
    ],
)
def test_a_failing_meter_is_reported_and_then_left_alone(tmp_path, body, why):
    meter = SiteMeter(_spec(_meter_script(tmp_path, body)))
    readings = [meter.read() for _ in range(METER_MAX_FAILURES + 1)]
    assert readings[0]["error"] == why
    assert "power_w" not in readings[0]
    assert readings[-1]["error"].startswith(f"not asked any more after {METER_MAX_FAILURES} failures in a row")


def test_a_missing_meter_program_is_a_failure_not_a_crash(tmp_path):
    reading = SiteMeter(_spec(str(tmp_path / "no-such-meter") + " --host bmc -P secret")).read()
    assert reading["error"].startswith("cannot start no-such-meter") and "secret" not in json.dumps(reading)


def test_the_meter_config_is_checked(tmp_path):
    cfg = load_config(None, ["run.power_meter.command=ipmi-watts --node 3"])
    assert cfg.run.power_meter.scope == "node" and cfg.run.power_meter.timeout_s == 2.0
    assert load_config().run.power_meter.command is None
    for override, key in [
        ("run.power_meter.command='unbalanced \"quote'", "run.power_meter.command"),
        ("run.power_meter.command=''", "run.power_meter.command"),
        ("run.power_meter.timeout_s=30", "run.power_meter.timeout_s"),
        ("run.power_meter.covers=[compute_nodes,interconnect]", "run.power_meter"),
        ("run.power_meter.covers=[cooling]", "run.power_meter.covers"),
    ]:
        with pytest.raises(AiperfError, match=key.replace(".", r"\.")):
            load_config(None, ["run.power_meter.command=x", override] if "command" not in override else [override])
    system = load_config(None, ["run.power_meter.command=pdu", "run.power_meter.scope=system",
                                "run.power_meter.covers=[compute_nodes,interconnect,storage]"])  # fmt: skip
    assert system.run.power_meter.covers == ["compute_nodes", "interconnect", "storage"]


def test_a_system_meter_is_read_by_the_head_and_a_node_meter_once_per_host(tmp_path):
    nodes = [types.SimpleNamespace(node_id=n, hostname=h, is_head=n == "b") for n, h in
             [("a", "h1"), ("b", "h1"), ("c", "h2")]]  # fmt: skip
    spec = _spec("watts")
    assert set(TelemetryRecorder(tmp_path, 1.0, spec).meters_for(nodes)) == {"a", "c"}
    assert set(TelemetryRecorder(tmp_path, 1.0, {**spec, "scope": "system"}).meters_for(nodes)) == {"b"}
    assert TelemetryRecorder(tmp_path, 1.0).meters_for(nodes) == {}


# --- the figure and its level --------------------------------------------------------------


def _sample(wall, node="n1", host="h1", accelerators=(), rapl=None, meter=None):
    s = {"wall": wall, "node_wall": wall, "node": node, "hostname": host, "cpu_percent": 50.0,
         "accelerators": [dict(a, index=k) for k, a in enumerate(accelerators)]}  # fmt: skip
    if rapl is not None:
        s["rapl"] = rapl
    if meter is not None:
        s["meter"] = meter
    return s


def _components_run(powercap, monkeypatch, start=1000.0):
    """Four samples 5 s apart through the real sampler: GPU 0 counts 1 kJ per 5 s (200 W), GPU 1 draws 50 W
    (power only), package-0 wraps in the first interval, 500 J per 5 s (100 W); package-1 idle, dram unreadable."""
    energy_mj, power_mw = {0: 5_000_000}, {0: 999_000, 1: 50_000}  # the counter, not the power reading, counts
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(energy_mj, power_mw))
    sampler = NodeSampler(powercap=str(powercap))
    samples, package = [], TOP - 250_000_000
    for k in range(4):
        samples.append({**sampler.sample(), "wall": start + 5 * k, "node": "n1"})
        energy_mj[0] += 1_000_000
        package = (package + 500_000_000) % TOP
        _advance(powercap, "intel-rapl:0", package)
    return samples


def test_components_sum_to_a_figure_that_names_its_sources_and_is_below_level_1(powercap, monkeypatch):
    samples = _components_run(powercap, monkeypatch)
    assert samples[1]["rapl"][0]["energy_uj"] < samples[0]["rapl"][0]["energy_uj"]  # it wrapped
    out = summarize_energy(samples, ops_per_s=1e12, wall_s=15.0, run_hosts=1, interval_s=5.0)
    parts = out["by_subsystem"]
    assert parts["accelerators"]["energy_j"] == pytest.approx(3000.0 + 750.0)  # 3 kJ counted + 50 W x 15 s
    assert parts["accelerators"]["kind"] == "mixed"
    assert parts["accelerators"]["source"] == "NVML energy counter and NVML power sampled every 5 s"
    assert parts["cpu_packages"]["energy_j"] == pytest.approx(1500.0)  # the wrap corrected
    assert parts["cpu_packages"]["power_w"] == pytest.approx(100.0)
    assert out["power_w"] == pytest.approx(200.0 + 50.0 + 100.0)
    assert out["ops_per_watt"] == pytest.approx(1e12 / 350.0)
    assert out["joules_per_op"] == pytest.approx(350.0 / 1e12)
    assert out["covers"] == ["accelerators", "cpu_packages"]
    assert out["covers_text"] == "accelerators and CPU packages only"
    assert out["not_available"]["dram"] == RAPL_NOT_READABLE
    assert out["not_available"]["site_meter"] == "none configured (run.power_meter.command)"
    assert out["by_host"][0]["other_zones_j"] == {"core": 0.0}  # inside the package: shown, not added
    assert out["level"] == 0 and out["level_text"] == "below level 1"
    assert out["aspects"]["subsystems"]["level"] == 0 and out["aspects"]["location"]["level"] == 0
    assert out["aspects"]["machine_fraction"]["level"] == 3 and out["aspects"]["timespan"]["level"] == 3
    line = format_energy(out)
    assert line.startswith("2.86 GOPS/W, below level 1: accelerators and CPU packages only")
    assert "350 pJ per counted operation" in line and "mean 350 W" in line


def test_accelerators_alone_say_so_and_a_counter_reset_falls_back_to_power():
    gpu = [{"energy_mj": 10_000_000, "power_w": 100.0}, {"energy_mj": 10_500_000, "power_w": 100.0},
           {"energy_mj": 1_000, "power_w": 300.0}]  # fmt: skip  # the driver reloaded: counter from 0
    samples = [_sample(100.0 + 5 * k, accelerators=[gpu[k]], rapl=[]) for k in range(3)]
    out = summarize_energy(samples, ops_per_s=5e11, wall_s=10.0, run_hosts=1, interval_s=5.0)
    assert out["energy_j"] == pytest.approx(500.0 + 1000.0)  # 500 J counted, then 5 s from 100 W to 300 W
    assert out["covers_text"] == "accelerators only" and out["meter_kind"] == "mixed"
    assert out["not_available"]["cpu_packages"] == "no powercap RAPL zones (/sys/class/powercap)"
    assert "accelerators only" in out["headline"] and "below level 1" in out["headline"]


def test_a_machine_with_no_source_says_energy_not_measured():
    samples = [_sample(100.0, rapl=[]), _sample(105.0, rapl=[])]
    out = summarize_energy(samples, ops_per_s=1e9, wall_s=5.0, run_hosts=1, interval_s=5.0)
    assert out["measured"] is False and out["ops_per_watt"] is None and out["level"] is None
    assert out["headline"].startswith("energy: not measured (accelerators: no accelerators seen through NVML;")
    assert "site meter: none configured" in out["headline"]
    assert format_energy(out).startswith("not measured (")
    old = summarize_energy([_sample(1.0), _sample(2.0)], ops_per_s=1.0, wall_s=1.0)  # a file from before RAPL
    assert old["not_available"]["cpu_packages"] == "not recorded (telemetry written before RAPL was read)"
    page = _energy_section({"energy": out})
    assert "Energy: not measured" in page and "no accelerators seen through NVML" in page


def _meter(power=None, energy=None, scope="node", covers=("compute_nodes",)):
    m = {"source": "bmc-watts", "scope": scope, "reading": "watts" if energy is None else "joules",
         "covers": list(covers)}  # fmt: skip
    m["power_w" if energy is None else "energy_j"] = power if energy is None else energy
    return m


def test_node_meters_on_every_node_read_each_second_are_level_2_and_joule_counters_level_3():
    watts = [_sample(100.0 + k, node=n, host=h, rapl=[], meter=_meter(power=500.0))
             for k in range(61) for n, h in (("a", "h1"), ("b", "h2"))]  # fmt: skip
    out = summarize_energy(watts, ops_per_s=1e12, wall_s=60.0, run_hosts=2, interval_s=1.0)
    assert out["covers"] == ["compute_nodes"] and out["power_w"] == pytest.approx(1000.0)
    assert out["sources"] == ["site node meter bmc-watts (watts sampled every 1 s)"]
    assert out["aspects"]["subsystems"]["level"] == 1  # two nodes: the interconnect and storage are not metered
    assert out["level"] == 1
    single = summarize_energy([s for s in watts if s["node"] == "a"], ops_per_s=1e12, wall_s=60.0, run_hosts=1,
                              interval_s=1.0)  # fmt: skip
    assert single["level"] == 2 and single["aspects"]["granularity"]["level"] == 2
    joules = [_sample(100.0 + 5 * k, rapl=[], meter=_meter(energy=1e6 + 2500.0 * k)) for k in range(13)]
    counted = summarize_energy(joules, ops_per_s=1e12, wall_s=60.0, run_hosts=1, interval_s=5.0)
    assert counted["level"] == 3 and counted["power_w"] == pytest.approx(500.0)
    assert counted["meter_kind"] == "integrated counter"
    slow = [_sample(100.0 + 5 * k, rapl=[], meter=_meter(power=500.0)) for k in range(13)]
    assert summarize_energy(slow, ops_per_s=1, wall_s=60.0, run_hosts=1, interval_s=5.0)["aspects"]["granularity"][
        "level"
    ] == 0  # fmt: skip


def test_a_system_meter_covers_what_it_declares_and_part_of_the_run_is_below_level_1():
    covers = ("compute_nodes", "interconnect", "storage")
    samples = [_sample(100.0 + 5 * k, node=n, host=h, rapl=[],
                       meter=_meter(energy=5000.0 * k, scope="system", covers=covers) if n == "a" else None)
               for k in range(13) for n, h in (("a", "h1"), ("b", "h2"))]  # fmt: skip
    out = summarize_energy(samples, ops_per_s=2e12, wall_s=60.0, run_hosts=2, interval_s=5.0)
    assert out["level"] == 3 and out["hosts_metered"] == 2 and out["power_w"] == pytest.approx(1000.0)
    assert out["covers_text"] == "whole compute nodes, interconnect and storage"
    half = summarize_energy(samples, ops_per_s=2e12, wall_s=120.0, run_hosts=2, interval_s=5.0)
    assert half["level"] == 0 and "50 % of the run" in half["headline"]


def test_one_node_of_many_metered_is_extrapolated_and_below_level_1_under_2_kw():
    samples = [_sample(100.0 + 5 * k, node="a", host="h1", accelerators=[{"energy_mj": 1_000_000 * k}], rapl=[])
               for k in range(13)]  # fmt: skip
    out = summarize_energy(samples, ops_per_s=1e12, wall_s=60.0, run_hosts=4, interval_s=5.0)
    assert out["power_metered_w"] == pytest.approx(200.0) and out["power_w"] == pytest.approx(800.0)
    assert out["extrapolated"] and "1 of 4 node(s), extrapolated to all" in out["headline"]
    assert out["aspects"]["machine_fraction"]["level"] == 0


def test_ray_nodes_sharing_a_host_count_its_counters_once():
    rounds = [_sample(100.0 + 5 * k, node=n, host="h1", accelerators=[{"energy_mj": 1_000_000 * k}], rapl=[])
              for k in range(3) for n in ("a", "b")]  # fmt: skip
    out = summarize_energy(rounds, ops_per_s=1.0, wall_s=10.0, run_hosts=1, interval_s=5.0)
    assert out["energy_j"] == pytest.approx(2000.0) and out["hosts"] == 1
    # the run was resumed an hour later: a new sampler (node c) on the same host; the hour between is not the run's
    resumed = [_sample(3700.0 + 5 * k, node="c", host="h1", accelerators=[{"energy_mj": 9e8 + 1e6 * k}], rapl=[])
               for k in range(3)]  # fmt: skip
    out = summarize_energy(rounds + resumed, ops_per_s=1.0, wall_s=20.0, run_hosts=1, interval_s=5.0)
    assert out["energy_j"] == pytest.approx(4000.0) and len(out["by_host"]) == 1


# --- through the summary ---------------------------------------------------------------------


def _ledger(tmp_path) -> float:
    """A one-epoch run of 15 s; returns its start on the master's Unix clock."""
    with LedgerWriter(tmp_path) as ledger:
        config = {"run": {"name": "x", "telemetry_interval_s": 5.0}}
        plan = {"nodes": [{"node_id": "n1", "hostname": "h1"}]}
        ledger.append(Record(type="run_start", t=0.0, run_id="r", config=config, plan=plan,
                             dataset={"split": {"disjoint": True}}, rules={}))  # fmt: skip
        ledger.append(
            Record(type="trial_start", trial="t0", kind="seed", arch_id="a", params=1, flops={"train_per_image": 1.0})
        )
        ledger.append(Record(type="epoch", t=15.0, trial="t0", epoch=1, ops=7e12, train_ops=6e12, eval_ops=1e12,
                             aiperf_ops=7e12, val_acc=0.9, precision="float32"))  # fmt: skip
        ledger.append(Record(type="run_stop", status="completed", reason=""))
    return read_ledger(tmp_path)[0].wall


def test_the_summary_and_its_result_block_state_energy(tmp_path, powercap, monkeypatch):
    start = _ledger(tmp_path)
    summary = build_summary(tmp_path)
    assert summary["energy"]["headline"] == "energy: not measured (no telemetry recorded)"
    assert "  energy               not measured (no telemetry recorded)" in format_summary(summary, tmp_path)
    samples = _components_run(powercap, monkeypatch, start)
    (tmp_path / TELEMETRY_NAME).write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert read_telemetry(tmp_path)[1]["rapl"][0]["energy_uj"] == samples[1]["rapl"][0]["energy_uj"]
    summary = build_summary(tmp_path)
    energy = summary["energy"]
    assert summary["score"]["wall_s"] == 15.0 and energy["run_fraction"] == 1.0
    assert energy["aspects"]["timespan"]["level"] == 3
    assert energy["ops_per_watt"] == pytest.approx(summary["score"]["ops_per_s"] / 350.0)
    assert "energy_j" not in summary["telemetry"]  # one place for energy
    line = next(x for x in format_summary(summary, tmp_path).splitlines() if x.startswith("  energy"))
    assert "below level 1: accelerators and CPU packages only" in line and "whole run" in line
    page = _energy_section(summary)
    assert "Energy: below level 1" in page and "RAPL package counters (powercap)" in page


def test_old_telemetry_files_still_read_and_give_accelerator_energy(tmp_path):
    _ledger(tmp_path)
    old = [{"wall": 100.0 + 5 * k, "node": "n1", "cpu_percent": 40.0, "host_mem_used_bytes": 5,
            "host_mem_total_bytes": 10, "accelerators": [{"index": 0, "util_percent": 50.0, "mem_used_bytes": 7,
                                                          "mem_total_bytes": 8, "power_w": 100.0}]}
           for k in range(4)]  # fmt: skip
    (tmp_path / TELEMETRY_NAME).write_text("\n".join(json.dumps(s) for s in old))
    energy = build_summary(tmp_path)["energy"]
    assert energy["energy_j"] == pytest.approx(1500.0) and energy["covers_text"] == "accelerators only"
    assert energy["sources"] == ["NVML power sampled every 5 s"]
    zones = [{"zone": "intel-rapl:0", "name": 5, "error": ["x"]}, {"zone": "intel-rapl:1", "name": "package-1",
             "energy_uj": "12", "max_energy_range_uj": -1}]  # fmt: skip
    malformed = [{**old[0], "rapl": "x", "meter": {"scope": "moon"}}, {**old[1], "rapl": [{"zone": 3}, 7]},
                 {**old[2], "rapl": zones, "meter": {"scope": "system", "covers": "all", "error": {}, "source": []}},
                 {**old[3], "rapl": zones, "meter": {"scope": "node", "power_w": "9", "energy_j": -4}}]  # fmt: skip
    (tmp_path / TELEMETRY_NAME).write_text("\n".join(json.dumps(s) for s in malformed))
    read = read_telemetry(tmp_path)
    assert read[0]["rapl"] == [] and "meter" not in read[0] and read[1]["rapl"] == []
    assert read[2]["meter"]["covers"] == [] and read[3]["meter"]["power_w"] is None
    assert read[3]["rapl"][1]["energy_uj"] is None and read[3]["rapl"][1]["max_energy_range_uj"] is None
    energy = build_summary(tmp_path)["energy"]  # no crash: the file is outside the hash chain
    assert energy["covers_text"] == "accelerators only" and "site meter" in energy["notes"][0]


def test_only_the_scored_time_counts_as_the_run():
    samples = [_sample(1000.0 + 5 * k, rapl=[], meter=_meter(energy=2500.0 * k)) for k in range(13)]  # 60 s metered
    whole = summarize_energy(samples, ops_per_s=1.0, wall_s=60.0, run_hosts=1, interval_s=5.0, run_start_wall=1000.0)
    assert whole["run_fraction"] == 1.0 and whole["level"] == 3
    late = summarize_energy(samples, ops_per_s=1.0, wall_s=60.0, run_hosts=1, interval_s=5.0, run_start_wall=970.0)
    assert late["run_fraction"] == 0.5 and late["level"] == 0  # metering began 30 s into the scored minute
    assert late["span_s"] == 60.0 and late["power_w"] == pytest.approx(500.0)
