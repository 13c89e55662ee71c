"""The system description file (``aiperf system -o system.json``): measured kinds of node plus the site file.

Three parts side by side in one JSON object, so each audience reads its own names:

* MLCommons' system description fields at the top level, all strings as MLCommons' files
  have them, so ``python -m mlperf_logging.system_desc_checker system.json training 4.0.0``
  accepts the file;
* ``top500``: TOP500's submission fields (site, location, year, manufacturer, segment,
  cores, processor, accelerator, interconnect, Rpeak);
* ``aiperf``: everything measured, node kind by node kind, with each device's peaks, so a
  checker can compare the description with what a run's ledger recorded.

A heterogeneous cluster's per-node MLCommons fields read ``"2 node(s): A; 6 node(s): B"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypedDict

from aiperf.system.accelerators import AcceleratorDescriptionDict
from aiperf.system.cpu import CpuDescriptionDict
from aiperf.system.kinds import NodeKind
from aiperf.system.node import NodeDescriptionDict
from aiperf.system.peak import PRECISIONS
from aiperf.system.site import SiteFile

FORMAT = "aiperf-system-1"
NOT_APPLICABLE = "N/A"


class RpeakFigure(TypedDict):
    """The whole system's Rpeak at one precision (None where any kind's devices have no figure), and its sources."""

    flops_per_s: float | None
    sources: list[str]


def _gib(value: float | int | None) -> str:
    return f"{(value or 0) / 2**30:.0f} GiB" if value else ""


def _size(value: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} B"


def _per_kind(kinds: list[NodeKind], field: Callable[[NodeDescriptionDict], str]) -> str:
    """One value when every kind agrees, else each kind's value with its node count."""
    values = [field(k.description) for k in kinds]
    if len(set(values)) <= 1:
        return values[0] if values else ""
    return "; ".join(f"{k.count} node(s): {v}" for k, v in zip(kinds, values, strict=True))


def _cpu(d: NodeDescriptionDict) -> CpuDescriptionDict:
    return d.get("cpu") or {}


def _accelerators(d: NodeDescriptionDict) -> list[AcceleratorDescriptionDict]:
    return d.get("accelerators") or []


def _first_accelerator(d: NodeDescriptionDict) -> AcceleratorDescriptionDict:
    return (_accelerators(d) or [{}])[0]


def _frequency(d: NodeDescriptionDict) -> str:
    cpu = _cpu(d)
    parts = []
    if cpu.get("base_mhz"):
        parts.append(f"{cpu['base_mhz']:.0f} MHz base")
    if cpu.get("max_mhz") and cpu.get("max_mhz") != cpu.get("base_mhz"):
        kernel_max = str(cpu.get("clock_source", "")).startswith("cpufreq")
        parts.append(f"{cpu['max_mhz']:.0f} MHz {'max' if kernel_max else '(maximum not reported by the kernel)'}")
    return ", ".join(parts)


def _caches(d: NodeDescriptionDict) -> str:
    names = {"Data": "d", "Instruction": "i"}
    return ", ".join(
        f"L{c['level']}{names.get(c['type'], '')} {_size(int(c['size_bytes']))} x {c['instances']}"
        for c in _cpu(d).get("caches") or []
    )


def _per_socket(d: NodeDescriptionDict, key: Literal["cores", "threads"]) -> str:
    cpu = _cpu(d)
    return str(max(1, int(cpu.get(key) or 1) // max(1, int(cpu.get("sockets") or 1))))


def _accelerator_clock(d: NodeDescriptionDict) -> str:
    if not _accelerators(d):
        return NOT_APPLICABLE
    mhz = _first_accelerator(d).get("max_sm_mhz")
    return f"{mhz} MHz max" if mhz else ""


def _host_link(d: NodeDescriptionDict) -> str:
    a = _first_accelerator(d)
    if not a:
        return NOT_APPLICABLE
    if a.get("pcie_generation") and a.get("pcie_width"):
        return f"PCIe Gen{a['pcie_generation']} x{a['pcie_width']}"
    return ""


def _accelerator_links(d: NodeDescriptionDict) -> str:
    a = _first_accelerator(d)
    if not a:
        return NOT_APPLICABLE
    if a.get("nvlinks_active"):
        version = f" {a['nvlink_version']}" if a.get("nvlink_version") else ""
        return f"NVLink{version}, {a['nvlinks_active']} links per accelerator"
    return "PCIe" if len(_accelerators(d)) > 1 else NOT_APPLICABLE


def _topology(d: NodeDescriptionDict) -> str:
    if not _accelerators(d):
        return NOT_APPLICABLE
    return "; ".join(sorted(set((d.get("accelerator_topology") or {}).values())))


def _memory_configuration(d: NodeDescriptionDict) -> str:
    a = _first_accelerator(d)
    if not a:
        return NOT_APPLICABLE
    parts = [
        f"{a['memory_bus_bits']}-bit bus" if a.get("memory_bus_bits") else "",
        f"{a['max_memory_mhz']} MHz" if a.get("max_memory_mhz") else "",
    ]
    return ", ".join(p for p in parts if p)


def _framework(d: NodeDescriptionDict) -> str:
    sw = d.get("software") or {}
    backend = sw.get("backend") or "tensorflow"
    version = sw.get(backend)
    return f"Keras {sw.get('keras', '?')} on {backend} {version or '(not installed)'}"


def _other_software(d: NodeDescriptionDict) -> str:
    sw = d.get("software") or {}
    a = _first_accelerator(d)
    parts = [f"Python {sw.get('python', '?')}", f"Ray {sw.get('ray', '?')}", f"aiperf {sw.get('aiperf', '?')}"]
    parts[-1] += f" (commit {d.get('commit') or 'unknown'})"
    if a.get("driver"):
        parts.append(f"NVIDIA driver {a['driver']}")
    if a.get("cuda_driver"):
        parts.append(f"CUDA {a['cuda_driver']} (driver API)")
    parts += [
        f"{name.replace('_', ' ')} {sw[name]}" for name in ("cuda_runtime", "cudnn", "cublas", "nccl") if name in sw
    ]
    return ", ".join(parts)


def _operating_system(d: NodeDescriptionDict) -> str:
    kernel = d.get("kernel")
    return f"{d.get('operating_system', '')} (kernel {kernel})" if kernel else str(d.get("operating_system", ""))


def _devices_peak(kind: NodeKind, precision: str) -> tuple[float | None, str]:
    """All of a kind's compute devices at ``precision``: accelerators where it has them, else CPU cores."""
    peaks = kind.peaks or {}
    if peaks.get("accelerator") is not None:
        figure = (peaks.get("per_accelerator") or {}).get(precision)
        devices = len(kind.description.get("accelerators") or [])
    else:
        figure = (peaks.get("per_core") or {}).get(precision)
        devices = int(_cpu(kind.description).get("cores") or 0)
    if not figure:
        return None, "unknown"
    return kind.count * devices * float(figure["flops_per_s"]), str(figure["source"])


def system_rpeak(kinds: list[NodeKind]) -> dict[str, RpeakFigure]:
    """The whole system's Rpeak per precision (None where any kind's devices have no figure), and its sources."""
    out: dict[str, RpeakFigure] = {}
    for precision in PRECISIONS:
        parts = [_devices_peak(k, precision) for k in kinds]
        total = None if not parts or any(v is None for v, _ in parts) else sum(v or 0.0 for v, _ in parts)
        out[precision] = {"flops_per_s": total, "sources": sorted({s for _, s in parts})}
    return out


def build_description(kinds: list[NodeKind], site: SiteFile, measured_at: float | None = None) -> dict[str, object]:
    """The system.json object for ``kinds`` (each with its ``peaks``) and the submitter's ``site`` file."""

    def override(value: str | None, measured: Callable[[NodeDescriptionDict], str]) -> str:
        return value if value is not None else _per_kind(kinds, measured)

    nodes = sum(k.count for k in kinds)
    mlcommons = {
        "submitter": site.submitter,
        "division": site.division,
        "status": site.status,
        "system_name": site.system_name,
        "number_of_nodes": str(nodes),
        "host_processors_per_node": _per_kind(kinds, lambda d: str(_cpu(d).get("sockets") or 1)),
        "host_processor_model_name": _per_kind(kinds, lambda d: str(_cpu(d).get("model") or "")),
        "host_processor_core_count": _per_kind(kinds, lambda d: _per_socket(d, "cores")),
        "host_processor_vcpu_count": _per_kind(kinds, lambda d: _per_socket(d, "threads")),
        "host_processor_frequency": _per_kind(kinds, _frequency),
        "host_processor_caches": _per_kind(kinds, _caches),
        "host_processor_interconnect": site.host_processor_interconnect,
        "host_memory_capacity": _per_kind(kinds, lambda d: _gib(d.get("memory_bytes"))),
        "host_storage_type": site.host_storage_type,
        "host_storage_capacity": site.host_storage_capacity,
        "host_networking": site.host_networking,
        "host_networking_topology": site.host_networking_topology,
        "host_memory_configuration": site.host_memory_configuration,
        "accelerators_per_node": _per_kind(kinds, lambda d: str(len(_accelerators(d)))),
        "accelerator_model_name": _per_kind(kinds, lambda d: _first_accelerator(d).get("name") or NOT_APPLICABLE),
        "accelerator_host_interconnect": override(site.accelerator_host_interconnect, _host_link),
        "accelerator_frequency": _per_kind(kinds, _accelerator_clock),
        "accelerator_on-chip_memories": site.accelerator_on_chip_memories,
        "accelerator_memory_configuration": override(site.accelerator_memory_configuration, _memory_configuration),
        "accelerator_memory_capacity": _per_kind(
            kinds, lambda d: _gib(_first_accelerator(d).get("memory_bytes")) if _accelerators(d) else NOT_APPLICABLE
        ),
        "accelerator_interconnect": override(site.accelerator_interconnect, _accelerator_links),
        "accelerator_interconnect_topology": override(site.accelerator_interconnect_topology, _topology),
        "cooling": site.cooling,
        "hw_notes": site.hw_notes,
        "framework": _per_kind(kinds, _framework),
        "other_software_stack": _per_kind(kinds, _other_software),
        "operating_system": _per_kind(kinds, _operating_system),
        "sw_notes": site.sw_notes,
    }
    accelerators = [(k.count * len(_accelerators(k.description)), _first_accelerator(k.description)) for k in kinds]
    top500 = {
        "site": site.site,
        "location": site.location,
        "year": site.year,
        "manufacturer": site.manufacturer or "unknown",
        "segment": site.segment,
        "computer": site.system_name,
        "processor": mlcommons["host_processor_model_name"],
        "processor_speed_mhz": _per_kind(kinds, lambda d: f"{_cpu(d).get('max_mhz') or 0:.0f}"),
        "cores_per_socket": mlcommons["host_processor_core_count"],
        "total_cores": sum(k.count * int(_cpu(k.description).get("cores") or 0) for k in kinds),
        "accelerator": mlcommons["accelerator_model_name"],
        "accelerator_count": sum(n for n, _ in accelerators),
        "interconnect": site.host_networking,
        "operating_system": mlcommons["operating_system"],
        "rpeak": system_rpeak(kinds),
    }
    return {
        **mlcommons,
        "top500": top500,
        "aiperf": {
            "format": FORMAT,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(measured_at)),
            "node_kinds": [k.to_dict() for k in kinds],
            "declared_peak": site.declared_peak,
            "notes": site.notes,
        },
    }
