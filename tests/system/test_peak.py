"""Rpeak: the accelerator table (dense figures, the right row for each name) and the CPU formula."""

from __future__ import annotations

import pytest

from aiperf.system.cpu import CpuDescription
from aiperf.system.peak import ACCELERATORS, accelerator_entry, accelerator_peak, cpu_peak, device_peaks

T = 1e12


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
        ("NVIDIA GH200 480GB", "NVIDIA GH200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("Tesla V100-SXM2-32GB", "NVIDIA V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "NVIDIA V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "NVIDIA V100S PCIe"),
        ("Tesla T4", "NVIDIA T4"),
        ("AMD Instinct MI250X", "AMD Instinct MI250X"),
        ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ],
)
def test_each_reported_name_finds_its_own_row(name, model):
    entry = accelerator_entry(name)
    assert entry is not None and entry.model == model


def test_figures_are_dense_and_float32_is_tf32_on_tensor_core_gpus():
    h100 = accelerator_peak("NVIDIA H100 80GB HBM3", "mixed_bfloat16")
    assert h100 is not None
    assert h100.flops_per_s == pytest.approx(989.5 * T)  # the datasheet's 1,979 is with sparsity
    assert (h100.source, h100.arithmetic) == ("table", "BF16 tensor core, dense")
    assert "H100" in h100.reference and "datasheet" in h100.reference
    a100 = accelerator_peak("NVIDIA A100-SXM4-40GB", "float32")
    assert a100 is not None and a100.flops_per_s == pytest.approx(156 * T) and "TF32" in a100.arithmetic
    v100 = accelerator_peak("Tesla V100-SXM2-16GB", "float32")
    assert v100 is not None and v100.flops_per_s == pytest.approx(15.7 * T)
    assert accelerator_peak("NVIDIA H100 PCIe", "mixed_float16").flops_per_s == pytest.approx(756.5 * T)


def test_every_row_has_a_source_and_no_figure_is_the_sparse_one():
    for row in ACCELERATORS:
        assert row.reference and "float32" in row.tflops
        assert all(0 < tflops < 2000 for tflops, _ in row.tflops.values())  # no 1,979 / 3,958 sparse figures


def test_an_unknown_device_has_no_rpeak_unless_declared():
    assert accelerator_peak("Imaginary NPU 9000", "float32") is None
    declared = accelerator_peak("Imaginary NPU 9000", "mixed_bfloat16", {"bfloat16": 5e14})
    assert declared is not None and declared.flops_per_s == 5e14 and declared.source == "declared"
    assert accelerator_peak("Tesla V100-SXM2-16GB", "mixed_bfloat16") is None  # no native bf16 on Volta
    assert accelerator_peak("NVIDIA A100-SXM4-40GB", "float32", {"float32": 1.0}).source == "table"  # the book wins


def _cpu(**kw) -> CpuDescription:
    base = {"model": "Test CPU", "vendor": "GenuineIntel", "family": 6, "cores": 8, "threads": 16}
    base.update(max_mhz=3000.0, clock_source="cpufreq cpuinfo_max_freq", vector_isa="avx512", flags=["avx512f"])
    return CpuDescription(**{**base, **kw})


@pytest.mark.parametrize(
    ("isa", "extra", "per_cycle"),
    [
        ("avx512", {}, 64),
        ("avx512", {"vendor": "AuthenticAMD", "family": 25}, 32),  # Zen 4: 512-bit ops on 256-bit units
        ("avx512", {"vendor": "AuthenticAMD", "family": 26}, 64),  # Zen 5: full-width
        ("avx2", {}, 32),
        ("avx", {}, 16),
        ("sse2", {}, 8),
        ("neon", {}, 16),
        ("sve", {"sve_vector_bits": 128}, 32),  # Neoverse V2: 4 x 128-bit
        ("sve", {"sve_vector_bits": 512}, 64),  # A64FX: 2 x 512-bit
    ],
)
def test_the_cpu_formula_is_cores_times_clock_times_flops_per_cycle(isa, extra, per_cycle):
    figure = cpu_peak(_cpu(vector_isa=isa, **extra), 8, "float32")
    assert figure is not None and figure.source == "formula"
    assert figure.flops_per_s == pytest.approx(8 * 3000e6 * per_cycle)
    assert f"{per_cycle:g} FLOP/cycle" in figure.reference and "8 core(s) x 3000 MHz" in figure.reference


def test_low_precision_on_cpus_counts_native_units_only():
    amx = _cpu(flags=["avx512f", "avx512_bf16", "amx_bf16"])
    assert cpu_peak(amx, 1, "mixed_bfloat16").flops_per_s == pytest.approx(3000e6 * 1024)
    assert cpu_peak(_cpu(flags=["avx512f", "avx512_bf16"]), 1, "bfloat16").flops_per_s == pytest.approx(3000e6 * 128)
    assert cpu_peak(_cpu(), 1, "mixed_bfloat16").flops_per_s == pytest.approx(3000e6 * 64)  # converted: fp32 rate


def test_a_cpu_without_isa_or_clock_has_none_and_a_weak_clock_yields_to_a_declared_figure():
    assert cpu_peak(_cpu(vector_isa=""), 4, "float32") is None
    assert cpu_peak(_cpu(max_mhz=None), 4, "float32") is None
    vm = _cpu(clock_source="current clock in /proc/cpuinfo (no cpufreq)")
    assert cpu_peak(vm, 4, "float32").source == "formula"
    declared = cpu_peak(vm, 4, "float32", {"float32": 2e11})
    assert declared.source == "declared" and declared.flops_per_s == pytest.approx(8e11)  # per core x cores
    assert cpu_peak(_cpu(), 4, "float32", {"float32": 2e11}).source == "formula"  # cpufreq's clock stands


def test_device_peaks_of_a_gpu_node_give_both_accelerator_and_core_figures():
    description = {"cpu": _cpu().to_dict(), "accelerators": [{"name": "NVIDIA H100 80GB HBM3"}]}
    peaks = device_peaks(description, {"Test CPU": {"float16": 1e11}})
    assert peaks["accelerator"] == "NVIDIA H100 80GB HBM3" and peaks["cpu"] == "Test CPU"
    assert peaks["per_accelerator"]["float32"]["flops_per_s"] == pytest.approx(494.5 * T)
    assert peaks["per_core"]["float32"]["flops_per_s"] == pytest.approx(3000e6 * 64)
    cpu_only = device_peaks({"cpu": _cpu(vector_isa="").to_dict()}, {"Test CPU": {"float16": 1e11}})
    assert cpu_only["accelerator"] is None and cpu_only["per_accelerator"] == {}
    assert cpu_only["per_core"] == {"float32": None, "bfloat16": None, "float16": cpu_only["per_core"]["float16"]}
    assert cpu_only["per_core"]["float16"]["source"] == "declared"
