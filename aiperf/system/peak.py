"""Rpeak: what a device could compute per second at a precision, by the vendor's book or by formula.

Accelerators come from a table of vendors' *dense* figures (never the "with sparsity" ones),
at the arithmetic a framework uses for that precision by default: on NVIDIA GPUs since
Ampere a float32 matrix multiply runs on TF32 tensor cores in TensorFlow and JAX, so the
float32 figure there is TF32's. CPUs are cores x max clock x FLOPs per cycle of their
widest vector ISA, assuming every core issues two full-width FMAs per cycle: an upper
bound, as Rpeak is (docs/system.md lists each assumption and each table entry's source).
A device the table does not know has no Rpeak unless the submitter declares one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from aiperf.system.cpu import CpuDescription
from aiperf.system.node import NodeDescriptionDict

PRECISIONS = ("float32", "bfloat16", "float16")  # what a run's dtype policy computes in
TERA = 1e12


def arithmetic_of(policy: str) -> str:
    """The compute dtype of a Keras dtype policy: ``mixed_bfloat16`` -> ``bfloat16``."""
    return policy.removeprefix("mixed_")


@dataclass(frozen=True)
class PeakFigure:
    """One device's peak at one precision: FLOP/s, the arithmetic it assumes, and where it comes from."""

    flops_per_s: float
    arithmetic: str  # e.g. "TF32 tensor core, dense", "2 x 512-bit FMA per cycle"
    source: str  # "table", "formula" or "declared"
    reference: str  # the vendor document, the formula with its numbers, or who declared it

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class AcceleratorPeak:
    """One row of the table: a model, the names drivers report for it, and its dense peaks in TFLOP/s."""

    model: str
    pattern: str  # regular expression matched (case-insensitively) against the reported name
    tflops: dict[str, tuple[float, str]]  # precision -> (dense TFLOP/s, arithmetic)
    reference: str


_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet (dense: half the 'with sparsity' figures)"
_NV_H200 = "NVIDIA H200 Tensor Core GPU datasheet (dense: half the 'with sparsity' figures)"
ACCELERATORS: tuple[AcceleratorPeak, ...] = (
    AcceleratorPeak(
        "NVIDIA GH200",
        r"GH200",
        {"float32": (494.5, "TF32 tensor core"), "bfloat16": (989.5, "BF16 tensor core"), "float16": (989.5, "FP16")},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (H100 GPU; dense figures)",
    ),
    AcceleratorPeak(
        "NVIDIA H200 NVL",
        r"H200\s*NVL",
        {"float32": (417.5, "TF32 tensor core"), "bfloat16": (835.5, "BF16 tensor core"), "float16": (835.5, "FP16")},
        _NV_H200,
    ),
    AcceleratorPeak(
        "NVIDIA H200 SXM",
        r"H200",
        {"float32": (494.5, "TF32 tensor core"), "bfloat16": (989.5, "BF16 tensor core"), "float16": (989.5, "FP16")},
        _NV_H200,
    ),
    AcceleratorPeak(
        "NVIDIA H100 NVL",
        r"H100\s*NVL",
        {"float32": (417.5, "TF32 tensor core"), "bfloat16": (835.5, "BF16 tensor core"), "float16": (835.5, "FP16")},
        _NV_H100,
    ),
    AcceleratorPeak(
        "NVIDIA H100 PCIe",
        r"H100.*PCIe",
        {"float32": (378.0, "TF32 tensor core"), "bfloat16": (756.5, "BF16 tensor core"), "float16": (756.5, "FP16")},
        _NV_H100,
    ),
    AcceleratorPeak(
        "NVIDIA H100 SXM",
        r"H100",
        {"float32": (494.5, "TF32 tensor core"), "bfloat16": (989.5, "BF16 tensor core"), "float16": (989.5, "FP16")},
        _NV_H100,
    ),
    AcceleratorPeak(
        "NVIDIA A100",
        r"A100",
        {"float32": (156.0, "TF32 tensor core"), "bfloat16": (312.0, "BF16 tensor core"), "float16": (312.0, "FP16")},
        "NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe, 40 and 80 GB; dense figures)",
    ),
    AcceleratorPeak(
        "NVIDIA L40S",
        r"L40S",
        {"float32": (183.0, "TF32 tensor core"), "bfloat16": (362.05, "BF16 tensor core"), "float16": (362.05, "FP16")},
        "NVIDIA L40S datasheet (dense: half the 'with sparsity' figures)",
    ),
    AcceleratorPeak(
        "NVIDIA L4",
        r"\bL4\b",
        {"float32": (60.0, "TF32 tensor core"), "bfloat16": (121.0, "BF16 tensor core"), "float16": (121.0, "FP16")},
        "NVIDIA L4 Tensor Core GPU datasheet (dense: half the 'with sparsity' figures)",
    ),
    AcceleratorPeak(
        "NVIDIA A10",
        r"\bA10\b",
        {"float32": (62.5, "TF32 tensor core"), "bfloat16": (125.0, "BF16 tensor core"), "float16": (125.0, "FP16")},
        "NVIDIA A10 Tensor Core GPU datasheet (dense figures)",
    ),
    AcceleratorPeak(
        "NVIDIA V100S PCIe",
        r"V100S",
        {"float32": (16.4, "FP32 CUDA cores (no TF32)"), "float16": (130.0, "FP16 tensor core")},
        "NVIDIA V100 Tensor Core GPU datasheet",
    ),
    AcceleratorPeak(
        "NVIDIA V100 PCIe",
        r"V100.*PCIE",
        {"float32": (14.0, "FP32 CUDA cores (no TF32)"), "float16": (112.0, "FP16 tensor core")},
        "NVIDIA V100 Tensor Core GPU datasheet",
    ),
    AcceleratorPeak(
        "NVIDIA V100 SXM2",
        r"V100",
        {"float32": (15.7, "FP32 CUDA cores (no TF32)"), "float16": (125.0, "FP16 tensor core")},
        "NVIDIA V100 Tensor Core GPU datasheet",
    ),
    AcceleratorPeak(
        "NVIDIA T4",
        r"\bT4\b",
        {"float32": (8.1, "FP32 CUDA cores (no TF32)"), "float16": (65.0, "FP16 tensor core, FP32 accumulate")},
        "NVIDIA T4 Tensor Core GPU datasheet",
    ),
    AcceleratorPeak(
        "AMD Instinct MI300X",
        r"MI300X",
        {"float32": (163.4, "FP32 matrix core"), "bfloat16": (1307.4, "BF16 matrix core"), "float16": (1307.4, "FP16")},
        "AMD Instinct MI300X data sheet (dense figures; TF32's 653.7 TFLOP/s is not what frameworks use by default)",
    ),
    AcceleratorPeak(
        "AMD Instinct MI250X",
        r"MI250X",
        {"float32": (95.7, "FP32 matrix core"), "bfloat16": (383.0, "BF16 matrix core"), "float16": (383.0, "FP16")},
        "AMD Instinct MI250X data sheet",
    ),
)


def accelerator_entry(name: str) -> AcceleratorPeak | None:
    """The table's row for a device name as the driver reports it (first match), or None."""
    return next((row for row in ACCELERATORS if re.search(row.pattern, name, re.IGNORECASE)), None)


def accelerator_peak(name: str, precision: str, declared: dict[str, float] | None = None) -> PeakFigure | None:
    """One accelerator's dense peak at ``precision``; the submitter's declared figure where the table has none."""
    row = accelerator_entry(name)
    arithmetic = arithmetic_of(precision)
    if row is not None and arithmetic in row.tflops:
        tflops, how = row.tflops[arithmetic]
        return PeakFigure(tflops * TERA, f"{how}, dense", "table", f"{row.model}: {row.reference}")
    return _declared(declared, arithmetic)


def _declared(declared: dict[str, float] | None, arithmetic: str) -> PeakFigure | None:
    value = (declared or {}).get(arithmetic)
    if value is None or value <= 0:
        return None
    return PeakFigure(float(value), arithmetic, "declared", "declared by the submitter (site file)")


def fp32_flops_per_cycle(cpu: CpuDescription) -> tuple[float, str] | None:
    """Single-precision FLOPs per cycle per core from the vector ISA, and the assumption behind it."""
    isa = cpu.vector_isa
    if isa == "avx512":
        if cpu.vendor == "AuthenticAMD" and cpu.family == 25:  # Zen 4 splits 512-bit ops into two 256-bit halves
            return 32, "AVX-512 on Zen 4: 2 x 256-bit FMA per cycle"
        return 64, "AVX-512: 2 x 512-bit FMA per cycle"
    if isa == "avx2":
        return 32, "AVX2: 2 x 256-bit FMA per cycle"
    if isa == "avx":
        return 16, "AVX: one 256-bit add and one 256-bit multiply per cycle"
    if isa == "sse2":
        return 8, "SSE2: one 128-bit add and one 128-bit multiply per cycle"
    if isa == "sve":
        bits = max(512, 2 * (cpu.sve_vector_bits or 128))  # Neoverse V1: 2 x 256, V2: 4 x 128, A64FX: 2 x 512
        return bits / 32 * 2, f"SVE: {bits} bits of FMA per cycle"
    if isa == "neon":
        return 16, "NEON: 2 x 128-bit FMA per cycle"
    return None


def _low_precision_per_cycle(cpu: CpuDescription, arithmetic: str, fp32: float) -> tuple[float, str]:
    """bf16/fp16 FLOPs per cycle: AMX tiles, native 16-bit vector instructions, else the fp32 rate."""
    flags = set(cpu.flags)
    short = "bf16" if arithmetic == "bfloat16" else "fp16"
    if f"amx_{short}" in flags:
        return 1024, f"AMX-{short.upper()}: 1024 FLOPs per cycle"
    native = {"bfloat16": ("avx512_bf16", "bf16"), "float16": ("avx512_fp16", "asimdhp")}[arithmetic]
    if flags & set(native):
        return 2 * fp32, f"native {short} vector instructions: twice the fp32 rate"
    return fp32, f"no native {short} arithmetic: the fp32 rate"


def cpu_peak(
    cpu: CpuDescription, cores: int, precision: str, declared: dict[str, float] | None = None
) -> PeakFigure | None:
    """``cores`` x max clock x FLOPs per cycle at ``precision``; the declared figure when the ISA is unknown
    or the kernel does not tell the maximum clock (a virtual machine without cpufreq).

    The figure is for ``cores`` physical cores together (a declared one is per core, like a table's per device).
    """
    arithmetic = arithmetic_of(precision)
    per_cycle = fp32_flops_per_cycle(cpu)
    weak_clock = not cpu.clock_source.startswith("cpufreq")  # no max clock from the kernel: a declared figure wins
    figure = _declared(declared, arithmetic)
    if figure is not None and (per_cycle is None or not cpu.max_mhz or weak_clock):
        return replace(figure, flops_per_s=figure.flops_per_s * cores)
    if per_cycle is None or not cpu.max_mhz or arithmetic not in PRECISIONS:
        return None
    flops, how = per_cycle
    if arithmetic != "float32":
        flops, how = _low_precision_per_cycle(cpu, arithmetic, flops)
    formula = f"{cores} core(s) x {cpu.max_mhz:g} MHz ({cpu.clock_source}) x {flops:g} FLOP/cycle"
    return PeakFigure(cores * cpu.max_mhz * 1e6 * flops, how, "formula", formula)


def device_peaks(
    description: NodeDescriptionDict, declared: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, Any]:
    """A node description's peaks at every precision: per accelerator (its first model) and per CPU core.

    Untyped values: it becomes a :class:`~aiperf.system.kinds.NodeKind`'s ``peaks``, which its readers index
    by a computed key (``per_accelerator`` or ``per_core``).

    ``declared``: the site file's ``declared_peak``, device model -> precision -> FLOP/s.
    """
    declared = declared or {}
    accelerators = description.get("accelerators") or []
    name = str(accelerators[0].get("name", "")) if accelerators else None
    cpu = CpuDescription.from_dict(description.get("cpu") or {"model": ""})
    per_accelerator: dict[str, dict[str, object] | None] = {}
    per_core: dict[str, dict[str, object] | None] = {}
    for precision in PRECISIONS:
        if name is not None:
            figure = accelerator_peak(name, precision, dict(declared.get(name, {})))
            per_accelerator[precision] = figure.to_dict() if figure else None
        core = cpu_peak(cpu, 1, precision, dict(declared.get(cpu.model, {})))
        per_core[precision] = core.to_dict() if core else None
    return {"accelerator": name, "per_accelerator": per_accelerator, "cpu": cpu.model, "per_core": per_core}
