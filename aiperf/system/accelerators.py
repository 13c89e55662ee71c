"""A node's accelerators as the driver reports them: model, memory, clocks, links and topology.

NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package) is asked first: it tells clocks,
PCIe links, NVLinks and how each pair of GPUs is connected. Without it the description falls
back to ``nvidia-smi`` (model, memory, driver); without either the node has no accelerators.
Every query may fail on its own (a board without power management, a driver without NVLink):
that field is ``None`` and the rest stands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import TypedDict, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# NVML's names for nvmlDeviceGetTopologyCommonAncestor levels (nvml.h, nvmlGpuTopologyLevel_t).
TOPOLOGY_LEVELS = {
    0: "same board",
    10: "single PCIe switch",
    20: "multiple PCIe switches",
    30: "PCIe host bridge",
    40: "NUMA node",
    50: "system (across sockets)",
}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS in recent drivers (Hopper has 18)


class AcceleratorDescriptionDict(TypedDict, total=False):
    """:meth:`AcceleratorDescription.to_dict` as it is read back (a description may lack a key)."""

    index: int
    name: str
    memory_bytes: int
    driver: str | None
    cuda_driver: str | None
    compute_capability: list[int] | None
    max_sm_mhz: int | None
    max_memory_mhz: int | None
    memory_bus_bits: int | None
    pci_bus_id: str | None
    pcie_generation: int | None
    pcie_width: int | None
    nvlinks_active: int | None
    nvlink_version: int | None
    power_limit_w: float | None
    source: str


@dataclass
class AcceleratorDescription:
    """One accelerator; clocks in MHz."""

    index: int
    name: str
    memory_bytes: int = 0
    driver: str | None = None
    cuda_driver: str | None = None  # the CUDA version the driver supports (e.g. "12.4")
    compute_capability: list[int] | None = None
    max_sm_mhz: int | None = None
    max_memory_mhz: int | None = None
    memory_bus_bits: int | None = None
    pci_bus_id: str | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    nvlinks_active: int | None = None
    nvlink_version: int | None = None
    power_limit_w: float | None = None
    source: str = "nvml"  # nvml or nvidia-smi

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class AcceleratorSet:
    """All accelerators of a node and how each pair is connected (``"0-1": "NVLink x18"``)."""

    devices: list[AcceleratorDescription] = field(default_factory=list)
    topology: dict[str, str] = field(default_factory=dict)


def _load_nvml() -> ModuleType | None:
    """The initialised ``pynvml`` module, or None (not installed, no driver, no device)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver or a library mismatch: NVML has nothing to say here
        logger.debug("NVML unavailable: %s", exc)
        return None
    return pynvml


def _ask(call: Callable[..., T], *args: object) -> T | None:
    """One NVML query, ``None`` when the device does not support it or it fails."""
    try:
        return call(*args)
    except Exception:  # pynvml raises NVMLError subclasses per missing feature: "unknown"
        return None


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int | None) -> str | None:
    """NVML's 12040 -> "12.4"."""
    return f"{value // 1000}.{value % 1000 // 10}" if isinstance(value, int) and value > 0 else None


def _nvlinks(nvml: ModuleType, handle: object) -> tuple[int | None, int | None]:
    """(active NVLinks, their version); (None, None) when the device has no NVLink query."""
    active, version = 0, None
    answered = False
    for link in range(NVLINK_MAX_LINKS):
        state = _ask(nvml.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            continue
        answered = True
        if state:
            active += 1
            version = version or _ask(nvml.nvmlDeviceGetNvLinkVersion, handle, link)
    return (active, version) if answered else (None, None)


def read_nvml(nvml: ModuleType) -> AcceleratorSet:
    """Every device NVML lists (the whole node, whatever CUDA_VISIBLE_DEVICES says)."""
    driver = _text(_ask(nvml.nvmlSystemGetDriverVersion))
    cuda = _cuda_version(_ask(nvml.nvmlSystemGetCudaDriverVersion))
    count = _ask(nvml.nvmlDeviceGetCount) or 0
    handles = [_ask(nvml.nvmlDeviceGetHandleByIndex, k) for k in range(count)]
    sm, mem = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    devices = []
    for k, handle in enumerate(handles):
        if handle is None:
            continue
        memory = _ask(nvml.nvmlDeviceGetMemoryInfo, handle)
        capability = _ask(nvml.nvmlDeviceGetCudaComputeCapability, handle)
        pci = _ask(nvml.nvmlDeviceGetPciInfo, handle)
        power_mw = _ask(nvml.nvmlDeviceGetPowerManagementLimit, handle)
        links, link_version = _nvlinks(nvml, handle)
        devices.append(
            AcceleratorDescription(
                index=k,
                name=_text(_ask(nvml.nvmlDeviceGetName, handle)) or "unknown",
                memory_bytes=int(getattr(memory, "total", 0) or 0),
                driver=driver,
                cuda_driver=cuda,
                compute_capability=[int(x) for x in capability] if capability else None,
                max_sm_mhz=_ask(nvml.nvmlDeviceGetMaxClockInfo, handle, sm),
                max_memory_mhz=_ask(nvml.nvmlDeviceGetMaxClockInfo, handle, mem),
                memory_bus_bits=_ask(nvml.nvmlDeviceGetMemoryBusWidth, handle),
                pci_bus_id=_text(getattr(pci, "busId", None)),
                pcie_generation=_ask(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                pcie_width=_ask(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                nvlinks_active=links,
                nvlink_version=link_version,
                power_limit_w=power_mw / 1000 if power_mw else None,
            )
        )
    return AcceleratorSet(devices, _topology(nvml, handles, devices))


def _topology(nvml: ModuleType, handles: list[object], devices: list[AcceleratorDescription]) -> dict[str, str]:
    """How each pair of devices is connected: NVLink where both have active links, else the PCIe path."""
    topology: dict[str, str] = {}
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            level = _ask(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a.index], handles[b.index])
            path = TOPOLOGY_LEVELS.get(level, f"level {level}") if isinstance(level, int) else None
            nvlink = _ask(nvml.nvmlDeviceGetP2PStatus, handles[a.index], handles[b.index], 3)  # NVLINK caps index
            link = "NVLink" if nvlink == 0 else None  # NVML_P2P_STATUS_OK
            text = ", ".join(x for x in (link, path) if x)
            if text:
                topology[f"{a.index}-{b.index}"] = text
    return topology


def read_accelerators() -> AcceleratorSet:
    """This node's accelerators: NVML, else nvidia-smi's basics, else none."""
    nvml = _load_nvml()
    if nvml is not None:
        try:
            return read_nvml(nvml)
        finally:
            _ask(nvml.nvmlShutdown)
    from aiperf.training.backend import nvidia_gpus

    return AcceleratorSet(
        [
            AcceleratorDescription(
                index=g["index"],
                name=g["name"],
                memory_bytes=g["memory_bytes"],
                driver=g["driver"],
                compute_capability=list(g["compute_capability"]) if g["compute_capability"] else None,
                source="nvidia-smi",
            )
            for g in nvidia_gpus()
        ]
    )
