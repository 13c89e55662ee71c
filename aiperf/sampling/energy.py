"""Energy by the book: every source a node has, one figure with its sources, and its methodology level.

Sources, read by each node's telemetry sampler (:class:`aiperf.sampling.telemetry.NodeSampler`):

* accelerators: NVML's energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the
  driver loaded) where the device has one, else its board power sampled and integrated;
* CPU packages and DRAM: Linux powercap/RAPL counters (``/sys/class/powercap/intel-rapl:*``,
  also the interface AMD processors expose), read raw with their wrap-around range;
* a site meter the user configures (``run.power_meter``): a command that prints watts (or an
  energy counter in joules), e.g. a BMC or PDU reading, per node or for the whole system.

The counters are written raw to ``telemetry.jsonl`` and turned into energy only here, from the
file, so a summary can always be recomputed. :func:`summarize_energy` picks the figure that
covers the most of the machine (a system meter, else node meters, else the sum of the
components), states what it covers, and rates it against the EEHPC working group's power
measurement methodology (levels 1 to 3, as the Green500 uses them) from what was actually
metered, conservatively: what cannot be shown from the samples is not granted. The level's
rules and their reasons are in docs/results.md, "Energy".
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NotRequired, Required, TypedDict

from aiperf.metrics.score import format_ops

logger = logging.getLogger(__name__)

POWERCAP_ROOT = "/sys/class/powercap"
_RAPL_ZONE = re.compile(r"intel-rapl:\d+(?::\d+)*")  # not intel-rapl-mmio:*, which repeats a package zone
RAPL_NOT_READABLE = "energy_uj readable by root only (Linux restricts RAPL since CVE-2020-8694)"
# A RAPL zone drawing this much could wrap its counter more than once between two samples
# when the interval is longer than range / power; one wrap is corrected, more cannot be seen.
RAPL_PLAUSIBLE_MAX_W = 1000.0
METER_OUTPUT_BYTES = 4096  # a reading is one number; a meter printing more is broken
METER_MAX_FAILURES = 3  # failures in a row after which a node stops asking its meter
METER_MAX_W = 1e9  # a gigawatt: more is a parse error, not a machine
_METER_NUMBER = re.compile(r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)(?:[ \t]*([A-Za-z]+))?")
_METER_UNITS = {"watts": ("W", "w", "watt", "watts"), "joules": ("J", "j", "joule", "joules")}

# The methodology's thresholds (EEHPC WG, "Energy Efficient High Performance Computing Power
# Measurement Methodology", v2.0 RC 1.0): the instrumented share of the compute nodes.
LEVEL1_FRACTION, LEVEL1_MIN_W = 1 / 10, 2_000.0
LEVEL2_FRACTION, LEVEL2_MIN_W = 1 / 8, 10_000.0
MAX_SAMPLE_S_SAMPLED_POWER = 1.0  # levels 1 and 2: at least one power reading per second
WHOLE_RUN_SLACK_INTERVALS = 2  # metering starts just after the run and reads last up to one interval before its end
WHOLE_RUN_SLACK_S = 5.0  # the samplers' start

SUBSYSTEM_NAMES = {
    "accelerators": "accelerators",
    "cpu_packages": "CPU packages",
    "dram": "DRAM",
    "compute_nodes": "whole compute nodes",
    "interconnect": "interconnect",
    "storage": "storage",
}


class MeterSpec(TypedDict):
    """``run.power_meter`` as the samplers get it (the telemetry layer does not import the config)."""

    command: str
    scope: Literal["node", "system"]
    reading: Literal["watts", "joules"]
    covers: list[str]
    timeout_s: float


class RaplZone(TypedDict):
    """One powercap RAPL zone as :meth:`PowercapZones.read` gives it: its raw counters, or why they are unread.

    Read back from ``telemetry.jsonl`` a counter that is not a number is None.
    """

    zone: str
    name: str | None
    energy_uj: NotRequired[int | None]
    max_energy_range_uj: NotRequired[int | None]
    error: NotRequired[str]


class MeterReading(TypedDict, total=False):
    """One reading of the site meter (:meth:`SiteMeter.read`): ``power_w`` or ``energy_j``, else ``error``.

    The meter fills ``source``, ``scope``, ``reading`` and ``covers`` every time; read back, a number that
    is not one is None.
    """

    source: str
    scope: str  # node or system
    reading: str  # watts or joules
    covers: list[str]
    power_w: float | None
    energy_j: float | None
    error: str


class AcceleratorReading(TypedDict, total=False):
    """An accelerator of a sample as read back (``telemetry.AcceleratorSample``, a malformed number None)."""

    index: int | None
    name: str | None
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    outside_util_percent: float | None
    energy_mj: int | None


class PowerSample(TypedDict, total=False):
    """A node's power-thread reading inside a sample, as read back (``telemetry.PowerReading``)."""

    node_wall: Required[float]
    accelerators: list[AcceleratorReading]
    rapl: list[RaplZone]
    meter: MeterReading


class TelemetrySample(TypedDict, total=False):
    """A line of ``telemetry.jsonl`` as :func:`aiperf.sampling.telemetry.read_telemetry` gives it back.

    A node's sample (``telemetry.NodeSample`` with the recorder's ``node`` and ``wall``), every
    number a reader uses checked (a malformed one None), or a sampler's ``error``. A key absent
    from an older file is absent here too. :func:`expand_power` makes one of each power reading.
    """

    node: Required[str]
    wall: Required[float]
    error: str
    node_wall: float | None
    hostname: str | None
    cpu_percent: float | None
    cpus: int | None
    cpu_busy_s: float | None
    run_cpu_s: float | None
    host_mem_used_bytes: int | None
    host_mem_total_bytes: int | None
    power_cpu_s: float | None
    accelerators: list[AcceleratorReading]
    rapl: list[RaplZone]
    meter: MeterReading
    power: list[PowerSample]


HostEnergy = dict[str, str | float | dict[str, float]]
"""One host's line of ``energy.by_host``: ``host``, joules per subsystem (``dram_j``), ``other_zones_j``."""


# --- reading, on each node --------------------------------------------------------------------


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class PowercapZones:
    """The RAPL zones of this host, found once; :meth:`read` gives their raw counters.

    Every zone is reported, readable or not: ``{"zone", "name", "energy_uj", "max_energy_range_uj"}``
    or ``{"zone", "name", "error"}``. No powercap interface at all is an empty list.
    """

    def __init__(self, root: str | Path = POWERCAP_ROOT) -> None:
        self.root = Path(root)
        self.zones: list[tuple[str, str | None, int | None]] = []  # (directory, name, max range in uJ)
        try:
            entries = sorted((e for e in os.listdir(self.root) if _RAPL_ZONE.fullmatch(e)), key=_natural)
        except OSError:
            entries = []
        for entry in entries:
            name = _read_text(self.root / entry / "name")
            max_range = _read_int(self.root / entry / "max_energy_range_uj")
            self.zones.append((entry, name, max_range))

    def read(self) -> list[RaplZone]:
        out: list[RaplZone] = []
        for entry, name, max_range in self.zones:
            zone: RaplZone = {"zone": entry, "name": name}
            try:
                zone["energy_uj"] = int((self.root / entry / "energy_uj").read_text().strip())
                zone["max_energy_range_uj"] = max_range
            except PermissionError:
                zone["error"] = RAPL_NOT_READABLE
            except OSError as exc:
                zone["error"] = f"energy_uj cannot be read ({exc.strerror or exc})"
            except ValueError:
                zone["error"] = "energy_uj is not a number"
            out.append(zone)
        return out


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()[:64] or None
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return int(text) if text is not None and text.isdigit() else None


def parse_meter_output(data: bytes, reading: str) -> float:
    """The one number a meter printed, strictly: digits, an optional unit matching ``reading``; else ValueError."""
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError("printed something that is not ASCII text") from None
    match = _METER_NUMBER.fullmatch(text)
    if match is None:
        shown = text[:40] + ("..." if len(text) > 40 else "")
        raise ValueError(f"printed {shown!r}, not one number" if text else "printed nothing")
    value, unit = float(match.group(1)), match.group(2)
    if unit is not None and unit not in _METER_UNITS[reading]:
        raise ValueError(f"printed a reading in {unit!r}, but run.power_meter.reading is {reading}")
    if not math.isfinite(value) or value > (METER_MAX_W if reading == "watts" else 1e18):
        raise ValueError(f"printed {value:g}, out of range")
    if reading == "watts" and value <= 0:
        raise ValueError("printed 0 W: a meter of a running machine reads more")
    return value


def run_meter(argv: Sequence[str], timeout_s: float, reading: str) -> float:
    """Run the meter command once and parse what it printed; ValueError saying why not.

    No shell: ``argv`` is the configured command split with :func:`shlex.split`. The command
    runs in a session of its own so that, past ``timeout_s`` or past ``METER_OUTPUT_BYTES`` of
    output, it and its children are killed; its output is read up to that bound only.
    """
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise ValueError(f"cannot start {Path(argv[0]).name} ({exc.strerror or exc})") from None
    assert proc.stdout is not None
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read(METER_OUTPUT_BYTES + 1)), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        status: int | None = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        status = None
    finally:
        # Its whole session, every time: a child it left running in the background ("echo 100;
        # sleep 301 &") would hold the pipe open, and outlive the run as an orphan.
        _kill_session(proc)
        reader.join(1.0)
        proc.stdout.close()
    data = chunks[0] if chunks else b""
    if len(data) > METER_OUTPUT_BYTES:
        raise ValueError(f"printed more than {METER_OUTPUT_BYTES} bytes")
    if status is None:
        raise ValueError(f"did not exit within {timeout_s:g} s")
    if status != 0:
        raise ValueError(f"exited with status {status}")
    return parse_meter_output(data, reading)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """Kill the meter and whatever it started (its own session, so nothing else); none left is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(2.0)
    except subprocess.TimeoutExpired:
        logger.warning("power meter process %d did not exit after SIGKILL", proc.pid)


class SiteMeter:
    """The configured meter on one node; after ``METER_MAX_FAILURES`` failures in a row it is not asked again."""

    def __init__(self, spec: MeterSpec) -> None:
        self.spec = spec
        self.argv = shlex.split(spec["command"])
        self.failures = 0
        self.disabled: str | None = None

    def read(self) -> MeterReading:
        """``{"source", "scope", "reading", "covers", "power_w"|"energy_j"|"error"}`` for a sample."""
        spec = self.spec
        out: MeterReading = {
            "source": Path(self.argv[0]).name,  # the program only: arguments may hold a host or a password
            "scope": spec["scope"],
            "reading": spec["reading"],
            "covers": list(spec["covers"]),
        }
        if self.disabled is not None:
            out["error"] = self.disabled
            return out
        try:
            value = run_meter(self.argv, spec["timeout_s"], spec["reading"])
        except ValueError as exc:
            self.failures += 1
            out["error"] = str(exc)
            if self.failures >= METER_MAX_FAILURES:
                self.disabled = f"not asked any more after {self.failures} failures in a row; the last: {exc}"
                logger.warning("power meter %s: %s", out["source"], self.disabled)
            return out
        self.failures = 0
        if spec["reading"] == "watts":
            out["power_w"] = value
        else:
            out["energy_j"] = value
        return out


# --- summarising, from telemetry.jsonl ----------------------------------------------------------


class SourceFigure(TypedDict):
    """One subsystem's energy, summed over the hosts that metered it."""

    energy_j: float
    power_w: float
    hosts: int
    series: int
    kind: str  # "integrated counter", "sampled power" or "mixed"
    source: str


class Aspect(TypedDict):
    level: int
    why: str


class EnergySummary(TypedDict):
    """The summary's ``energy`` section (docs/results.md, "Energy")."""

    measured: bool
    headline: str
    ops_per_watt: float | None
    joules_per_op: float | None
    power_w: float | None
    power_metered_w: float | None
    energy_j: float | None
    span_s: float | None
    run_fraction: float | None
    covers: list[str]
    covers_text: str | None
    sources: list[str]
    meter_kind: str | None
    hosts: int
    hosts_metered: int
    extrapolated: bool
    level: int | None
    level_text: str | None
    aspects: dict[str, Aspect]
    by_subsystem: dict[str, SourceFigure]
    by_host: list[HostEnergy]
    not_available: dict[str, str]
    notes: list[str]
    # Power readings a second of the slowest node's power thread (None: read only with the telemetry samples),
    # and what reading them cost the nodes' CPUs (run.power_interval_s; absent before 2026-12-07).
    readings_per_s: NotRequired[float | None]
    sampler_cpu_s: NotRequired[float | None]
    trials: NotRequired[TrialEnergy]  # each trial's share of its node's energy (where the nodes' power was read)
    # Whether telemetry.jsonl is what the ledger's run_stop binds (absent: it binds none, as before 2026-12-07).
    bound: NotRequired[bool]


class _Series:
    """One counter or power reading over time: its energy, the time it covers and how it was metered."""

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.covered_s = 0.0
        self.counted = 0  # intervals from an energy counter
        self.sampled = 0  # intervals from two power readings
        self.first: float | None = None
        self.last: float | None = None

    def add(self, t0: float, t1: float, joules: float, counter: bool) -> None:
        self.energy_j += joules
        self.covered_s += t1 - t0
        self.first = t0 if self.first is None else min(self.first, t0)
        self.last = t1 if self.last is None else max(self.last, t1)
        if counter:
            self.counted += 1
        else:
            self.sampled += 1

    @property
    def used(self) -> bool:
        return self.counted + self.sampled > 0 and self.covered_s > 0

    @property
    def power_w(self) -> float:
        return self.energy_j / self.covered_s if self.covered_s > 0 else 0.0

    @property
    def kind(self) -> str:
        return _kind(self.counted, self.sampled)

    @property
    def mean_step_s(self) -> float:
        return self.covered_s / max(1, self.counted + self.sampled)


def _kind(counted: int, sampled: int) -> str:
    if counted and sampled:
        return "mixed"
    return "integrated counter" if counted else "sampled power"


def _num(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def _power_series(points: list[tuple[float, float | None, float | None]], scale: float) -> _Series:
    """Points of (time, counter, watts): counter deltas (x ``scale`` to joules) where both ends have one,
    else the trapezoid of the two power readings; a counter that went back (a driver reload) falls back too."""
    series = _Series()
    for (t0, e0, p0), (t1, e1, p1) in itertools.pairwise(sorted(points, key=lambda p: p[0])):
        if t1 <= t0:
            continue
        if e0 is not None and e1 is not None and e1 >= e0:
            series.add(t0, t1, (e1 - e0) * scale, counter=True)
        elif p0 is not None and p1 is not None:
            series.add(t0, t1, (t1 - t0) * (p0 + p1) / 2, counter=False)
    return series


def _rapl_series(points: list[tuple[float, int, int | None]]) -> tuple[_Series, bool]:
    """A RAPL counter's energy with one wrap-around per interval corrected; True when an interval was long
    enough to hide a second wrap at ``RAPL_PLAUSIBLE_MAX_W``."""
    series, doubtful = _Series(), False
    for (t0, e0, _), (t1, e1, top) in itertools.pairwise(sorted(points, key=lambda p: p[0])):
        if t1 <= t0:
            continue
        delta = e1 - e0
        if delta < 0:
            if not top:
                continue  # wrapped with no known range: that interval is lost
            delta += top
        if delta < 0 or (top and delta > top):
            continue
        if top and (t1 - t0) * RAPL_PLAUSIBLE_MAX_W * 1e6 >= top:
            doubtful = True
        series.add(t0, t1, delta / 1e6, counter=True)
    return series, doubtful


def _rapl_subsystem(name: object) -> str | None:
    """Which figure a zone adds to: packages and DRAM; core and uncore are inside a package, psys overlaps it."""
    if not isinstance(name, str):
        return None
    if name.startswith("package"):
        return "cpu_packages"
    if name.startswith("dram"):
        return "dram"
    return None


def _host_rounds(samples: list[TelemetrySample]) -> dict[tuple[str, str], list[TelemetrySample]]:
    """Each host's samples, one per polling round, split where the sampling node changes (a resumed run).

    Several Ray nodes on one host (a simulated cluster) read the same counters: the node with
    the smallest id speaks for the host in each round, so nothing is counted twice.
    """
    chosen: dict[tuple[str, float], TelemetrySample] = {}
    for s in samples:
        key = (s.get("hostname") or s["node"], s["wall"])
        if key not in chosen or s["node"] < chosen[key]["node"]:
            chosen[key] = s
    out: dict[tuple[str, str], list[TelemetrySample]] = {}
    for (host, _), s in sorted(chosen.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.setdefault((host, s["node"]), []).append(s)
    return out


def _not_available_accelerators(samples: list[TelemetrySample]) -> str:
    devices = [a for s in samples for a in s.get("accelerators") or []]
    if not devices:
        return "no accelerators seen through NVML"
    return "NVML reports neither an energy counter nor power for the accelerators"


def _not_available_rapl(samples: list[TelemetrySample], subsystem: str) -> str:
    if not any("rapl" in s for s in samples):
        return "not recorded (telemetry written before RAPL was read)"
    zones = [z for s in samples for z in s.get("rapl") or []]
    if not zones:
        return f"no powercap RAPL zones ({POWERCAP_ROOT})"
    mine = [z for z in zones if _rapl_subsystem(z.get("name")) == subsystem]
    if not mine:
        return "no RAPL zone for it" if subsystem == "dram" else "no RAPL package zone"
    errors = sorted({str(z["error"]) for z in mine if z.get("error")})
    return "; ".join(errors) if errors else "RAPL counters never advanced twice"


_Points = list[tuple[float, float | None, float | None]]  # (wall, counter, watts)


def _host_series(rounds: list[TelemetrySample]) -> tuple[dict[str, list[_Series]], dict[str, float], bool]:
    """One host's series per subsystem, its RAPL zones outside the figure (core, uncore, psys) and whether
    a RAPL interval was long enough to hide a second wrap."""
    devices: dict[object, _Points] = {}
    zones: dict[str, list[tuple[float, int, int | None]]] = {}
    zone_names: dict[str, str | None] = {}
    meter: _Points = []
    for s in rounds:
        for a in s.get("accelerators") or []:
            energy_mj, watts = _num(a.get("energy_mj")), _num(a.get("power_w"))
            if energy_mj is not None or watts is not None:
                devices.setdefault(a.get("index"), []).append((s["wall"], energy_mj, watts))
        for z in s.get("rapl") or []:
            counter = _num(z.get("energy_uj"))
            if counter is not None and isinstance(z.get("zone"), str):
                top = _num(z.get("max_energy_range_uj"))
                zones.setdefault(z["zone"], []).append((s["wall"], int(counter), int(top) if top else None))
                zone_names[z["zone"]] = z.get("name") if isinstance(z.get("name"), str) else None
        m = s.get("meter")
        if isinstance(m, dict) and m.get("scope") == "node" and "error" not in m:
            meter.append((s["wall"], _num(m.get("energy_j")), _num(m.get("power_w"))))
    out: dict[str, list[_Series]] = {}
    other: dict[str, float] = {}
    doubtful = False
    for device in devices.values():
        out.setdefault("accelerators", []).append(_power_series(device, 1e-3))
    for zone, points in zones.items():
        series, wraps = _rapl_series(points)
        doubtful |= wraps and series.used
        subsystem = _rapl_subsystem(zone_names.get(zone))
        if subsystem is not None:
            out.setdefault(subsystem, []).append(series)
        elif series.used:
            label = zone_names.get(zone) or zone
            other[label] = other.get(label, 0.0) + series.energy_j
    if meter:
        out.setdefault("node_meter", []).append(_power_series(meter, 1.0))
    return out, other, doubtful


class _SiteReadings(TypedDict):
    spec: MeterReading  # the first reading: source, scope, reading, covers
    errors: list[str]
    system: _Series | None


def _site_meter(good: list[TelemetrySample]) -> _SiteReadings:
    """The site meter's failures and its system-scope series (node-scope readings are in each host's series)."""
    spec: MeterReading = {}
    errors: list[str] = []
    points: _Points = []
    for s in good:
        m = s.get("meter")
        if not isinstance(m, dict):
            continue
        spec = spec or m
        if "error" in m:
            errors.append(str(m["error"]))
        elif m.get("scope") == "system":
            spec = m
            points.append((s["wall"], _num(m.get("energy_j")), _num(m.get("power_w"))))
    system = _power_series(points, 1.0) if points else None
    return {"spec": spec, "errors": errors, "system": system if system is not None and system.used else None}


def _subsystem_figures(
    used: dict[str, dict[str, list[_Series]]], site: _SiteReadings, hosts: int, interval_s: float | None
) -> dict[str, SourceFigure]:
    out: dict[str, SourceFigure] = {}
    source = str(site["spec"].get("source") or "site meter")
    for subsystem in ("accelerators", "cpu_packages", "dram", "node_meter"):
        series = [x for subs in used.values() for x in subs.get(subsystem, [])]
        if series:
            out[subsystem] = _figure(
                subsystem, series, sum(subsystem in subs for subs in used.values()), source, interval_s
            )
    if site["system"] is not None:
        out["system_meter"] = _figure("system_meter", [site["system"]], hosts, source, interval_s)
    return out


def _figure(subsystem: str, series: list[_Series], hosts: int, meter: str, interval_s: float | None) -> SourceFigure:
    counted, sampled = sum(x.counted for x in series), sum(x.sampled for x in series)
    return {
        "energy_j": sum(x.energy_j for x in series),
        "power_w": sum(x.power_w for x in series),
        "hosts": hosts,
        "series": len(series),
        "kind": _kind(counted, sampled),
        "source": _source_text(subsystem, counted, sampled, meter, interval_s),
    }


def _not_available(
    good: list[TelemetrySample], figures: dict[str, SourceFigure], site: _SiteReadings
) -> dict[str, str]:
    """Each source the run lacks, and why."""
    out: dict[str, str] = {}
    if "accelerators" not in figures:
        out["accelerators"] = _not_available_accelerators(good)
    for subsystem in ("cpu_packages", "dram"):
        if subsystem not in figures:
            out[subsystem] = _not_available_rapl(good, subsystem)
    if not site["spec"]:
        out["site_meter"] = "none configured (run.power_meter.command)"
    elif "node_meter" not in figures and "system_meter" not in figures:
        last = site["errors"][-1] if site["errors"] else "no two readings"
        out["site_meter"] = f"{site['spec'].get('source') or 'site meter'}: {last}"
    return out


def _choice(
    figures: dict[str, SourceFigure], used: dict[str, dict[str, list[_Series]]], site: _SiteReadings, hosts: int
) -> tuple[list[str], list[_Series], list[str], int]:
    """The figure's parts: (kinds, series, subsystems covered, hosts metered). A system meter, else node
    meters, else the sum of the components (each host's accelerators, CPU packages and DRAM)."""
    if site["system"] is not None:
        covers = [str(c) for c in site["spec"].get("covers") or ["compute_nodes"]]
        return ["system_meter"], [site["system"]], covers, hosts
    if "node_meter" in figures:
        series = [x for subs in used.values() for x in subs.get("node_meter", [])]
        return ["node_meter"], series, ["compute_nodes"], sum("node_meter" in subs for subs in used.values())
    kinds: list[str] = [k for k in ("accelerators", "cpu_packages", "dram") if k in figures]
    series = [x for subs in used.values() for k in kinds for x in subs.get(k, [])]
    return kinds, series, kinds, sum(any(k in subs for k in kinds) for subs in used.values())


def expand_power(samples: Sequence[TelemetrySample]) -> list[TelemetrySample]:
    """The samples with each node's power-thread readings (``power``) as samples of their own.

    A reading carries the node's clock (``node_wall``); it is placed on the master's clock, as
    its sample is, by the sample's offset (``wall - node_wall``), and inherits the sample's node
    and host. Samples without readings (older files, ``run.power_interval_s: 0``) come through
    as they are.
    """
    out: list[TelemetrySample] = []
    for s in samples:
        out.append(s)
        readings = s.get("power")
        if not readings or "error" in s:
            continue
        node_wall = _num(s.get("node_wall"))
        offset = s["wall"] - node_wall if node_wall is not None else 0.0
        for r in readings:
            reading: TelemetrySample = {
                "wall": round(r["node_wall"] + offset, 3),
                "node": s["node"],
                "hostname": s.get("hostname"),
            }
            reading["accelerators"] = r.get("accelerators") or []
            if "rapl" in r:
                reading["rapl"] = r["rapl"]
            if isinstance(r.get("meter"), dict):
                reading["meter"] = r["meter"]
            out.append(reading)
    return out


def power_sampling(samples: Sequence[TelemetrySample]) -> tuple[float | None, float | None]:
    """(power readings a second per node over the span they cover, the CPU seconds the readings cost in all).

    None where no node's power thread ran (readings only with each telemetry sample).
    """
    spans: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    cpu: dict[str, float] = {}
    for s in samples:
        readings = s.get("power")
        if not readings or "error" in s:
            continue
        node = s["node"]
        walls = [r["node_wall"] for r in readings]
        span = spans.setdefault(node, [min(walls), max(walls)])
        span[0], span[1] = min(span[0], *walls), max(span[1], *walls)
        counts[node] = counts.get(node, 0) + len(readings)
        cost = _num(s.get("power_cpu_s"))
        if cost is not None:
            cpu[node] = max(cpu.get(node, 0.0), cost)  # cumulative on the node
    rates = [(counts[n] - 1) / (b - a) for n, (a, b) in spans.items() if b > a and counts[n] > 1]
    return (min(rates) if rates else None), (sum(cpu.values()) if cpu else None)


def summarize_energy(
    samples: Sequence[TelemetrySample],
    *,
    ops_per_s: float,
    wall_s: float,
    run_hosts: int = 0,
    interval_s: float | None = None,
    run_start_wall: float | None = None,
) -> EnergySummary:
    """The run's energy figure from its telemetry samples (:func:`aiperf.sampling.telemetry.read_telemetry`).

    ``run_hosts`` is how many hosts the run's plan used: the machine the figure must cover
    (at least the hosts that answered the samplers). ``run_start_wall`` is the run's start on the
    master's Unix clock (the ledger's ``run_start.wall``, the clock of the samples' ``wall``):
    with it, the share of the run metered is the overlap of the metered span with the scored
    time, ``[start, start + wall_s]``; without it, their lengths are compared. OPS per watt is the score's OPS over
    the mean power of what was metered (each series' energy over the time it covers), so
    idle moments inside the run cost efficiency and a metered span a little shorter than the
    run does not inflate it.
    """
    readings_per_s, sampler_cpu_s = power_sampling(samples)
    good = [s for s in expand_power(samples) if "error" not in s]
    if not good:
        return not_measured("no node answered the telemetry samplers")
    hosts_seen = sorted({s.get("hostname") or s["node"] for s in good})
    hosts = max(run_hosts, len(hosts_seen))
    used: dict[str, dict[str, list[_Series]]] = {}  # host -> subsystem -> series with energy
    others: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    for (host, _node), rounds in _host_rounds(good).items():  # a resumed run: a host's second segment
        series, other, doubtful = _host_series(rounds)
        subs = used.setdefault(host, {})
        for subsystem, parts in series.items():
            subs.setdefault(subsystem, []).extend(x for x in parts if x.used)
        for zone, joules in other.items():
            others.setdefault(host, {})[zone] = others.get(host, {}).get(zone, 0.0) + joules
        if doubtful and not notes:
            notes.append(
                f"RAPL counters were read less often than they can wrap at {RAPL_PLAUSIBLE_MAX_W:.0f} W per zone:"
                " energy may be missing (lower run.telemetry_interval_s)"
            )
    used = {host: {k: v for k, v in subs.items() if v} for host, subs in used.items()}
    by_host: list[HostEnergy] = []
    for host, subs in sorted(used.items()):
        entry: HostEnergy = {"host": host, **{f"{k}_j": sum(x.energy_j for x in v) for k, v in subs.items()}}
        if host in others:
            entry["other_zones_j"] = others[host]  # core, uncore (inside a package), psys (overlaps): not added
        by_host.append(entry)
    site = _site_meter(good)
    if site["errors"]:
        source = site["spec"].get("source") or "site meter"
        notes.append(f"site meter {source} failed {len(site['errors'])} time(s); the last: {site['errors'][-1]}")
    figures = _subsystem_figures(used, site, hosts, interval_s)
    not_available = _not_available(good, figures, site)
    kinds, primary, covers, metered = _choice(figures, used, site, hosts)
    if not primary:
        reasons = "; ".join(f"{SUBSYSTEM_NAMES.get(k, k.replace('_', ' '))}: {v}" for k, v in not_available.items())
        return _not_measured(reasons or "no telemetry", hosts, not_available, by_host, notes)

    power_metered = sum(x.power_w for x in primary)
    extrapolated = 0 < metered < hosts
    power = power_metered * hosts / metered if extrapolated else power_metered
    covered = min(x.covered_s for x in primary)
    in_run = min(_overlap(x, run_start_wall, wall_s) for x in primary)
    run_fraction = min(1.0, in_run / wall_s) if wall_s > 0 else None
    aspects = _aspects(
        primary,
        kinds,
        covers,
        covered=in_run,
        wall_s=wall_s,
        interval_s=interval_s,
        hosts=hosts,
        metered=metered,
        power_metered=power_metered,
    )
    level = min(a["level"] for a in aspects.values())
    level_text = f"level {level}" if level else "below level 1"
    covers_text = _covers_text(covers, kinds, figures, hosts)
    sources = [figures[k]["source"] for k in kinds]
    ops_per_watt = ops_per_s / power if power > 0 else None
    machine = f"{metered} of {hosts} node(s)" + (", extrapolated to all" if extrapolated else "")
    span = "whole run" if aspects["timespan"]["level"] else f"{100 * (run_fraction or 0):.0f} % of the run"
    headline = (
        f"{format_ops(ops_per_watt, 'OPS/W') if ops_per_watt is not None else '- OPS/W'}, {level_text}:"
        f" {covers_text} ({'; '.join(sources)}), {machine}, {span}"
    )
    return {
        "measured": True,
        "headline": headline,
        "ops_per_watt": ops_per_watt,
        "joules_per_op": power / ops_per_s if ops_per_s > 0 else None,
        "power_w": power,
        "power_metered_w": power_metered,
        "energy_j": sum(x.energy_j for x in primary),
        "span_s": covered,
        "run_fraction": run_fraction,
        "covers": covers,
        "covers_text": covers_text,
        "sources": sources,
        "meter_kind": _kind(sum(x.counted for x in primary), sum(x.sampled for x in primary)),
        "hosts": hosts,
        "hosts_metered": metered,
        "extrapolated": extrapolated,
        "level": level,
        "level_text": level_text,
        "aspects": aspects,
        "by_subsystem": figures,
        "by_host": by_host,
        "not_available": not_available,
        "notes": notes,
        "readings_per_s": readings_per_s,
        "sampler_cpu_s": sampler_cpu_s,
    }


def _overlap(series: _Series, start: float | None, wall_s: float) -> float:
    """Seconds of the scored time ``[start, start + wall_s]`` the series covers (its length without ``start``)."""
    if start is None or series.first is None or series.last is None:
        return series.covered_s
    return min(series.covered_s, max(0.0, min(series.last, start + wall_s) - max(series.first, start)))


def _not_measured(
    reasons: str, hosts: int, not_available: dict[str, str], by_host: list[HostEnergy], notes: list[str]
) -> EnergySummary:
    return {
        "measured": False,
        "headline": f"energy: not measured ({reasons})",
        "ops_per_watt": None,
        "joules_per_op": None,
        "power_w": None,
        "power_metered_w": None,
        "energy_j": None,
        "span_s": None,
        "run_fraction": None,
        "covers": [],
        "covers_text": None,
        "sources": [],
        "meter_kind": None,
        "hosts": hosts,
        "hosts_metered": 0,
        "extrapolated": False,
        "level": None,
        "level_text": None,
        "aspects": {},
        "by_subsystem": {},
        "by_host": by_host,
        "not_available": not_available,
        "notes": notes,
    }


def not_measured(why: str) -> EnergySummary:
    """The ``energy`` section of a run without telemetry."""
    return _not_measured(why, 0, {}, [], [])


def _source_text(subsystem: str, counted: int, sampled: int, meter: str, interval_s: float | None) -> str:
    every = f" every {interval_s:g} s" if interval_s else ""
    if subsystem == "accelerators":
        if not sampled:
            return "NVML energy counter"
        what = f"NVML power sampled{every}"
        return f"NVML energy counter and {what}" if counted else what
    if subsystem in ("cpu_packages", "dram"):
        return f"RAPL {'package' if subsystem == 'cpu_packages' else 'DRAM'} counters (powercap)"
    what = "node meter" if subsystem == "node_meter" else "system meter"
    how = "energy counter" if not sampled else f"watts sampled{every}"
    return f"site {what} {meter} ({how})"


def _covers_text(covers: list[str], kinds: list[str], by_subsystem: dict[str, SourceFigure], hosts: int) -> str:
    names = [SUBSYSTEM_NAMES.get(c, c) for c in covers]
    text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    if kinds[0] not in ("system_meter", "node_meter"):
        partial = [
            f"{SUBSYSTEM_NAMES[k]} on {by_subsystem[k]['hosts']} of {hosts} node(s)"
            for k in kinds
            if by_subsystem[k]["hosts"] < hosts
        ]
        text += " only" + (f" ({', '.join(partial)})" if partial else "")
    return text


def _aspects(
    primary: list[_Series],
    kinds: list[str],
    covers: list[str],
    *,
    covered: float,
    wall_s: float,
    interval_s: float | None,
    hosts: int,
    metered: int,
    power_metered: float,
) -> dict[str, Aspect]:
    """The four aspects of the methodology, each with the highest level the samples show, and why."""
    counted = all(not x.sampled for x in primary)
    step = max(x.mean_step_s for x in primary)
    if counted:
        granularity: Aspect = {"level": 3, "why": "integrated energy counters"}
    elif step <= MAX_SAMPLE_S_SAMPLED_POWER * 1.05:
        granularity = {"level": 2, "why": f"power read every {step:.2g} s (levels 1-2 need >= 1 per second)"}
    else:
        granularity = {"level": 0, "why": f"power read every {step:.2g} s; levels 1-2 need >= 1 reading per second"}
    slack = WHOLE_RUN_SLACK_INTERVALS * (interval_s or 0.0) + WHOLE_RUN_SLACK_S
    if wall_s > 0 and covered >= wall_s - slack:
        timespan: Aspect = {"level": 3, "why": f"metered {covered:.0f} s of the run's {wall_s:.0f} s"}
    else:
        timespan = {"level": 0, "why": f"metered {covered:.0f} s of the run's {wall_s:.0f} s: not the whole run"}
    fraction = metered / hosts if hosts else 0.0
    if metered >= hosts:
        machine: Aspect = {"level": 3, "why": f"all {hosts} node(s)"}
    elif fraction >= LEVEL2_FRACTION and power_metered >= LEVEL2_MIN_W:
        machine = {"level": 2, "why": f"{metered} of {hosts} nodes, {power_metered / 1e3:.1f} kW metered"}
    elif fraction >= LEVEL1_FRACTION and power_metered >= LEVEL1_MIN_W:
        machine = {"level": 1, "why": f"{metered} of {hosts} nodes, {power_metered / 1e3:.1f} kW metered"}
    else:
        machine = {
            "level": 0,
            "why": f"{metered} of {hosts} nodes, {power_metered / 1e3:.2f} kW metered: less than the larger of"
            f" 1/10 of the nodes and {LEVEL1_MIN_W / 1e3:.0f} kW",
        }
    if kinds[0] in ("system_meter", "node_meter"):
        needed = {"compute_nodes"} | ({"interconnect", "storage"} if hosts > 1 else set())
        missing = sorted(needed - set(covers))
        if not missing:
            subsystems: Aspect = {"level": 3, "why": "every subsystem the run uses, measured: " + ", ".join(covers)}
        else:
            subsystems = {"level": 1, "why": "compute nodes only; not metered: " + ", ".join(missing)}
        location: Aspect = {
            "level": 3,
            "why": "site meter: where it reads (upstream of power conversion) and its accuracy are the site's to state",
        }
    else:
        subsystems = {
            "level": 0,
            "why": "components only (" + ", ".join(SUBSYSTEM_NAMES[k] for k in kinds) + "): not whole compute"
            " nodes (fans, power supplies, boards, disks and network cards are not metered)",
        }
        location = {"level": 0, "why": "on-chip sensors, after the power supplies and regulators; losses not measured"}
    return {
        "granularity": granularity,
        "timespan": timespan,
        "machine_fraction": machine,
        "subsystems": subsystems,
        "location": location,
    }


def joules_text(joules: float) -> str:
    """``0.81 nJ``: an energy per operation with an SI prefix below one joule."""
    for factor, prefix in ((1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n"), (1e-12, "p"), (1e-15, "f")):
        if joules >= factor:
            return f"{joules / factor:.3g} {prefix}J"
    return f"{joules:.3g} J"


def format_energy(e: EnergySummary) -> str:
    """One line for the result block: OPS per watt with its level and what it covers, or why not measured."""
    if not e.get("measured"):
        return str(e.get("headline") or "energy: not measured").removeprefix("energy: ")
    parts = [str(e["headline"])]
    per_op = e.get("joules_per_op")
    if per_op is not None:
        parts.append(f"{joules_text(per_op)} per counted operation")
    if e.get("power_w") is not None:
        parts.append(f"mean {e['power_w']:.0f} W")
    rate = e.get("readings_per_s")
    if rate is not None:
        cost = e.get("sampler_cpu_s")
        parts.append(
            f"power read {rate:.1f} times a second" + (f" ({cost:.2f} CPU-s in all)" if cost is not None else "")
        )
    trials = e.get("trials")
    mean_j = trials["mean_j"] if trials is not None else None
    if trials is not None and mean_j is not None:
        parts.append(f"{joules_text(mean_j)} per trial on average ({trials['trials']} trials)")
    return "; ".join(parts + list(e.get("notes") or []))


# --- energy per trial --------------------------------------------------------------------------

MAX_TRIALS_WITH_ENERGY = 10_000  # a summary lists each trial's energy up to this many trials (its mean beyond)


class TrialSpan(TypedDict):
    """Where and when one attempt of a trial trained, on the master's Unix clock (the ledger's ``wall``)."""

    trial: str
    node: str
    start: float
    end: float


class TrialEnergy(TypedDict):
    """The summary's ``energy.trials``: each trial's share of its node's metered energy."""

    trials: int
    energy_j: float
    mean_j: float | None
    by_trial: dict[str, float] | None  # None beyond MAX_TRIALS_WITH_ENERGY trials


def _node_power(samples: list[TelemetrySample]) -> dict[str, list[tuple[float, float, float]]]:
    """Each node's metered power between consecutive readings: ``(t0, t1, watts)``.

    Per interval the node's power is what its readings tell, summed over its sources: an
    accelerator's energy counter (else its power, averaged over the two readings), its RAPL
    package and DRAM counters, its node-scope site meter. A system-scope meter is the whole
    machine's and is not a node's.
    """
    by_node: dict[str, list[TelemetrySample]] = {}
    for s in samples:
        if "error" not in s:
            by_node.setdefault(s["node"], []).append(s)
    out: dict[str, list[tuple[float, float, float]]] = {}
    for node, readings in by_node.items():
        readings.sort(key=lambda r: r["wall"])
        segments = []
        for a, b in itertools.pairwise(readings):
            dt = b["wall"] - a["wall"]
            if dt <= 0:
                continue
            joules = _interval_joules(a, b, dt)
            if joules is not None:
                segments.append((a["wall"], b["wall"], joules / dt))
        out[node] = segments
    return out


def _interval_joules(a: TelemetrySample, b: TelemetrySample, dt: float) -> float | None:
    total, seen = 0.0, False
    devices_a = {d.get("index"): d for d in a.get("accelerators") or []}
    for d in b.get("accelerators") or []:
        prev = devices_a.get(d.get("index"))
        if prev is None:
            continue
        e0, e1 = _num(prev.get("energy_mj")), _num(d.get("energy_mj"))
        w0, w1 = _num(prev.get("power_w")), _num(d.get("power_w"))
        if e0 is not None and e1 is not None and e1 >= e0:
            total, seen = total + (e1 - e0) / 1000.0, True
        elif w0 is not None and w1 is not None:
            total, seen = total + (w0 + w1) / 2 * dt, True
    zones_a = {z.get("zone"): z for z in a.get("rapl") or []}
    for z in b.get("rapl") or []:
        prev_zone = zones_a.get(z.get("zone"))
        if prev_zone is None or _rapl_subsystem(z.get("name")) is None:
            continue
        c0, c1, top = _num(prev_zone.get("energy_uj")), _num(z.get("energy_uj")), _num(z.get("max_energy_range_uj"))
        if c0 is None or c1 is None:
            continue
        delta = c1 - c0 if c1 >= c0 else (c1 + top - c0 if top else None)
        if delta is not None:
            total, seen = total + delta / 1e6, True
    ma, mb = a.get("meter"), b.get("meter")
    if isinstance(ma, dict) and isinstance(mb, dict) and mb.get("scope") == "node" and "error" not in mb:
        j0, j1 = _num(ma.get("energy_j")), _num(mb.get("energy_j"))
        w0, w1 = _num(ma.get("power_w")), _num(mb.get("power_w"))
        if j0 is not None and j1 is not None and j1 >= j0:
            total, seen = total + j1 - j0, True
        elif w0 is not None and w1 is not None:
            total, seen = total + (w0 + w1) / 2 * dt, True
    return total if seen else None


def energy_by_trial(samples: Sequence[TelemetrySample], spans: list[TrialSpan]) -> TrialEnergy | None:
    """Each trial's energy: its node's metered power over the trial's attempts, shared evenly at each moment
    among the trials training on that node then (None when no node's power was metered)."""
    power = _node_power(expand_power(samples))
    if not any(power.values()):
        return None
    by_trial: dict[str, float] = {}
    spans_by_node: dict[str, list[TrialSpan]] = {}
    for span in spans:
        spans_by_node.setdefault(span["node"], []).append(span)
    for node, mine in spans_by_node.items():
        mine.sort(key=lambda s: s["start"])
        active: list[TrialSpan] = []
        upcoming = 0
        for t0, t1, watts in power.get(node, []):  # in time order: a sweep over the node's trials
            while upcoming < len(mine) and mine[upcoming]["start"] < t1:
                active.append(mine[upcoming])
                upcoming += 1
            active = [s for s in active if s["end"] > t0]
            running = [s for s in active if s["start"] < t1]
            for s in running:
                overlap = min(t1, s["end"]) - max(t0, s["start"])
                by_trial[s["trial"]] = by_trial.get(s["trial"], 0.0) + watts * overlap / len(running)
    total = sum(by_trial.values())
    return {
        "trials": len(by_trial),
        "energy_j": total,
        "mean_j": total / len(by_trial) if by_trial else None,
        "by_trial": dict(sorted(by_trial.items())) if len(by_trial) <= MAX_TRIALS_WITH_ENERGY else None,
    }
