"""The host CPU as the kernel describes it: model, topology, clocks, vector ISA and caches.

Everything comes from text files (``/proc/cpuinfo``, ``/sys/devices/system/cpu``), read
through a root directory a test can replace, so the parsing is tested on other machines'
files. A field the kernel does not expose (clocks in most virtual machines, caches on some
ARM boards) is ``None``, never a guess; where a figure falls back to a weaker source, the
record names it (``clock_source``), because Rpeak is computed from it.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

# Flags worth recording: the vector and matrix extensions that decide FLOPs per cycle.
VECTOR_FLAGS = (
    "sse2",
    "avx",
    "fma",
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "sme",
)


class CacheLevelDict(TypedDict, total=False):
    """A :class:`CacheLevel` as a description holds it."""

    level: int
    type: str
    size_bytes: int
    instances: int


class CpuDescriptionDict(TypedDict, total=False):
    """:meth:`CpuDescription.to_dict` as it is read back (a description from another version may lack a key)."""

    model: str
    vendor: str
    architecture: str
    family: int | None
    sockets: int
    cores: int
    threads: int
    base_mhz: float | None
    max_mhz: float | None
    clock_source: str
    vector_isa: str
    flags: list[str]
    sve_vector_bits: int | None
    caches: list[CacheLevelDict]


@dataclass
class CacheLevel:
    """One cache level and type: its size per instance and how many instances the node has."""

    level: int
    type: str  # Data, Instruction, Unified
    size_bytes: int
    instances: int

    @property
    def name(self) -> str:
        suffix = {"Data": "d", "Instruction": "i"}.get(self.type, "")
        return f"L{self.level}{suffix}"


@dataclass
class CpuDescription:
    """One node's CPUs (all sockets); counts are of the whole node, clocks in MHz."""

    model: str
    vendor: str = ""
    architecture: str = ""  # platform.machine(): x86_64, aarch64, ...
    family: int | None = None  # x86 CPU family (AMD 25: Zen 3/4, 26: Zen 5)
    sockets: int = 1
    cores: int = 1  # physical cores, all sockets
    threads: int = 1  # logical CPUs the kernel runs (cores x SMT)
    base_mhz: float | None = None
    max_mhz: float | None = None
    clock_source: str = ""  # where max_mhz came from (cpufreq, the model name, the current clock)
    vector_isa: str = ""  # the widest vector ISA: avx512, avx2, avx, sse2, sve, neon, or "" (unknown)
    flags: list[str] = field(default_factory=list)  # the VECTOR_FLAGS the CPU has
    sve_vector_bits: int | None = None  # ARM SVE's default vector length
    caches: list[CacheLevel] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuDescription:
        """The description :meth:`to_dict` wrote (fields it does not know are left out).

        Untyped values: the known fields go to the constructor as they were decoded.
        """
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known and k != "caches"}
        caches = [CacheLevel(**c) for c in data.get("caches") or [] if isinstance(c, dict)]
        return cls(**values, caches=caches)


def _blocks(cpuinfo: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one key -> value mapping per processor (ARM adds a trailing global block)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip().lower()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip(), 0)
    except (TypeError, ValueError):
        return None


def _float(text: str | None) -> float | None:
    try:
        value = float(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def vector_isa(flags: set[str]) -> str:
    """The widest vector ISA among ``flags`` (x86 and ARM names), or "" when none is known."""
    for isa, needs in (
        ("avx512", {"avx512f"}),
        ("avx2", {"avx2", "fma"}),
        ("avx", {"avx"}),
        ("sse2", {"sse2"}),
        ("sve", {"sve"}),
        ("neon", {"asimd"}),
    ):
        if needs <= flags:
            return isa
    return ""


def _model_name(blocks: list[dict[str, str]]) -> str:
    for block in blocks:
        for key in ("model name", "cpu model", "hardware"):
            if block.get(key):
                return block[key]
    return platform.processor() or platform.machine()


def _clock_from_name(model: str) -> float | None:
    """Intel names carry the base clock (``... @ 2.20GHz``)."""
    match = re.search(r"@\s*([\d.]+)\s*GHz", model)
    return float(match.group(1)) * 1000 if match else None


def _cpufreq_mhz(sys_cpu: Path, name: str) -> float | None:
    khz = _float(_read(sys_cpu / "cpu0" / "cpufreq" / name))
    return khz / 1000 if khz else None


def _topology(blocks: list[dict[str, str]], sys_cpu: Path) -> tuple[int, int, int]:
    """(sockets, physical cores, logical CPUs) from cpuinfo's ids, else sysfs topology, else the CPU count."""
    processors = [b for b in blocks if "processor" in b]
    threads = len(processors) or os.cpu_count() or 1
    packages = {b.get("physical id") for b in processors if "physical id" in b}
    cores = {(b.get("physical id"), b.get("core id")) for b in processors if "core id" in b}
    if packages and cores:
        return len(packages), len(cores), threads
    sys_packages: set[str] = set()
    sys_cores: set[tuple[str, str]] = set()
    for topo in sorted(sys_cpu.glob("cpu[0-9]*/topology")):
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if package is not None and core is not None:
            sys_packages.add(package.strip())
            sys_cores.add((package.strip(), core.strip()))
    if sys_cores:
        return len(sys_packages), len(sys_cores), max(threads, len(sys_cores))
    return 1, threads, threads


def _caches(sys_cpu: Path) -> list[CacheLevel]:
    """Cache sizes from cpu0's view; instances counted as distinct sharing sets over all CPUs."""
    found: dict[tuple[int, str], tuple[int, set[str]]] = {}
    for index in sorted(sys_cpu.glob("cpu[0-9]*/cache/index[0-9]*")):
        level, kind = _int(_read(index / "level")), (_read(index / "type") or "").strip()
        size_text, shared = (_read(index / "size") or "").strip(), (_read(index / "shared_cpu_list") or "").strip()
        match = re.fullmatch(r"(\d+)\s*([KMG]?)", size_text)
        if level is None or not kind or match is None:
            continue
        size = int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]
        _, sets = found.setdefault((level, kind), (size, set()))
        sets.add(shared or index.parent.parent.name)
    order = {"Data": 0, "Instruction": 1, "Unified": 2}
    return [
        CacheLevel(level, kind, size, len(sets))
        for (level, kind), (size, sets) in sorted(found.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 3)))
    ]


def parse_cpu(cpuinfo: str, sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> CpuDescription:
    """A :class:`CpuDescription` from ``/proc/cpuinfo``'s text and the sysfs tree under ``sys_root``."""
    sys_cpu = Path(sys_root) / "devices" / "system" / "cpu"
    blocks = _blocks(cpuinfo)
    first = next((b for b in blocks if "processor" in b), blocks[0] if blocks else {})
    flags = set((first.get("flags") or first.get("features") or "").split())
    model = _model_name(blocks)
    sockets, cores, threads = _topology(blocks, sys_cpu)
    base = _cpufreq_mhz(sys_cpu, "base_frequency") or _clock_from_name(model)
    top, source = _cpufreq_mhz(sys_cpu, "cpuinfo_max_freq"), "cpufreq cpuinfo_max_freq"
    if top is None and base is not None:
        top, source = base, "base clock (no cpufreq: turbo unknown)"
    if top is None:
        top, source = _float(first.get("cpu mhz")), "current clock in /proc/cpuinfo (no cpufreq)"
    if top is None:
        source = ""
    sve_bytes = _int(_read(Path(proc_root) / "sys" / "abi" / "sve_default_vector_length")) if "sve" in flags else None
    return CpuDescription(
        model=model,
        vendor=first.get("vendor_id") or first.get("cpu implementer", ""),
        architecture=platform.machine(),
        family=_int(first.get("cpu family")),
        sockets=max(1, sockets),
        cores=max(1, cores),
        threads=max(1, threads),
        base_mhz=base,
        max_mhz=top,
        clock_source=source,
        vector_isa=vector_isa(flags),
        flags=[f for f in VECTOR_FLAGS if f in flags],
        sve_vector_bits=sve_bytes * 8 if sve_bytes else None,
        caches=_caches(sys_cpu),
    )


def read_cpu(proc_root: str | Path = "/proc", sys_root: str | Path = "/sys") -> CpuDescription:
    """This node's CPUs (``platform`` alone where ``/proc/cpuinfo`` cannot be read)."""
    return parse_cpu(_read(Path(proc_root) / "cpuinfo") or "", sys_root, proc_root)
