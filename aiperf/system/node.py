"""One node measured from the inside: CPUs, memory, accelerators, operating system and software.

Runs on the node it describes (a Ray task pinned there, or in the calling process for a
single machine) and imports no deep-learning framework, so it takes milliseconds.
"""

from __future__ import annotations

import platform
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from aiperf.system.accelerators import AcceleratorDescription, AcceleratorDescriptionDict, read_accelerators
from aiperf.system.cpu import CpuDescription, CpuDescriptionDict, read_cpu
from aiperf.system.software import cuda_libraries, software_versions, source_commit


class NodeDescriptionDict(TypedDict, total=False):
    """:meth:`NodeDescription.to_dict` as it is read back: from a node over Ray, or a kind's (without ``hostname``)."""

    hostname: str
    cpu: CpuDescriptionDict
    memory_bytes: int
    accelerators: list[AcceleratorDescriptionDict]
    accelerator_topology: dict[str, str]
    operating_system: str
    kernel: str
    software: dict[str, str]
    commit: str


@dataclass
class NodeDescription:
    """What ``aiperf system`` and ``run_start.system.kinds`` say about one node."""

    hostname: str
    cpu: CpuDescription
    memory_bytes: int
    accelerators: list[AcceleratorDescription] = field(default_factory=list)
    accelerator_topology: dict[str, str] = field(default_factory=dict)
    operating_system: str = ""
    kernel: str = ""
    software: dict[str, str] = field(default_factory=dict)
    commit: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def operating_system(os_release: str | Path = "/etc/os-release") -> str:
    """The distribution's name and version (``PRETTY_NAME``), else the platform's system name."""
    try:
        for line in Path(os_release).read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "PRETTY_NAME" and value.strip():
                return value.strip().strip('"')
    except (OSError, UnicodeDecodeError):
        pass
    return f"{platform.system()} {platform.release()}".strip()


def host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def describe_node(backend: str = "") -> NodeDescription:
    """This node, as a :class:`NodeDescription` (``backend``: the Keras backend a run would use)."""
    accelerators = read_accelerators()
    return NodeDescription(
        hostname=socket.gethostname(),
        cpu=read_cpu(),
        memory_bytes=host_memory_bytes(),
        accelerators=accelerators.devices,
        accelerator_topology=accelerators.topology,
        operating_system=operating_system(),
        kernel=platform.release(),
        software=software_versions(backend) | cuda_libraries(),
        commit=source_commit(),
    )
