"""Accelerators from a fake NVML (two NVLinked H100s, one query unsupported), and the fallbacks without it."""

from __future__ import annotations

from types import SimpleNamespace

from aiperf.system import accelerators
from aiperf.system.accelerators import read_accelerators, read_nvml


class NVMLError(Exception):
    pass


class FakeNvml:
    """The pynvml calls the description makes, for two H100 SXM boards joined by NVLink."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"  # old bindings return bytes

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, k: int) -> str:
        return f"h{k}"

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, used=0, free=80 * 2**30)

    def nvmlDeviceGetCudaComputeCapability(self, h: str) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int:
        return {1: 1980, 2: 2619}[kind]

    def nvmlDeviceGetMemoryBusWidth(self, h: str) -> int:
        return 5120

    def nvmlDeviceGetPciInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{18 + int(h[1:])}:00.0")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetPowerManagementLimit(self, h: str) -> int:
        raise NVMLError("Not Supported")

    def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
        return 1 if link < 18 else 0

    def nvmlDeviceGetNvLinkVersion(self, h: str, link: int) -> int:
        return 4

    def nvmlDeviceGetTopologyCommonAncestor(self, a: str, b: str) -> int:
        return 50

    def nvmlDeviceGetP2PStatus(self, a: str, b: str, index: int) -> int:
        return 0 if index == 3 else 1


def test_nvml_describes_every_device_and_how_the_pair_is_connected():
    found = read_nvml(FakeNvml())
    assert [d.index for d in found.devices] == [0, 1]
    d = found.devices[0]
    assert (d.name, d.memory_bytes, d.driver, d.cuda_driver) == (
        "NVIDIA H100 80GB HBM3",
        80 * 2**30,
        "550.54.15",
        "12.4",
    )
    assert (d.compute_capability, d.max_sm_mhz, d.max_memory_mhz, d.memory_bus_bits) == ([9, 0], 1980, 2619, 5120)
    assert (d.pcie_generation, d.pcie_width, d.pci_bus_id) == (5, 16, "00000000:18:00.0")
    assert (d.nvlinks_active, d.nvlink_version) == (18, 4)
    assert d.power_limit_w is None  # unsupported on this board: unknown, the rest stands
    assert found.topology == {"0-1": "NVLink, system (across sockets)"}


def test_a_device_without_nvlink_queries_reports_none_not_zero():
    class NoLinks(FakeNvml):
        def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
            raise NVMLError("Not Supported")

        def nvmlDeviceGetP2PStatus(self, a: str, b: str, index: int) -> int:
            return 1

    found = read_nvml(NoLinks())
    assert found.devices[0].nvlinks_active is None
    assert found.topology == {"0-1": "system (across sockets)"}


def test_read_accelerators_uses_nvml_and_shuts_it_down(monkeypatch):
    fake = FakeNvml(count=1)
    monkeypatch.setattr(accelerators, "_load_nvml", lambda: fake)
    found = read_accelerators()
    assert [d.source for d in found.devices] == ["nvml"] and found.topology == {}
    assert fake.shut


def test_without_nvml_the_basics_come_from_nvidia_smi(monkeypatch):
    import aiperf.training.backend as backend

    monkeypatch.setattr(accelerators, "_load_nvml", lambda: None)
    monkeypatch.setattr(
        backend,
        "nvidia_gpus",
        lambda: [
            {"index": 0, "name": "Tesla T4", "memory_bytes": 16 * 2**30, "compute_capability": (7, 5), "driver": "535"}
        ],
    )
    found = read_accelerators()
    d = found.devices[0]
    assert (d.name, d.source, d.compute_capability, d.max_sm_mhz) == ("Tesla T4", "nvidia-smi", [7, 5], None)


def test_without_nvml_or_a_driver_there_are_no_accelerators(monkeypatch):
    import aiperf.training.backend as backend

    monkeypatch.setattr(accelerators, "_load_nvml", lambda: None)
    monkeypatch.setattr(backend, "nvidia_gpus", lambda: [])
    assert read_accelerators().devices == []


def test_an_nvml_that_cannot_initialise_is_absent(monkeypatch):
    import sys

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise NVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    assert accelerators._load_nvml() is None
