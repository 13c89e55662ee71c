"""The CPU description from other machines' /proc/cpuinfo and sysfs trees (no access to this machine's)."""

from __future__ import annotations

from pathlib import Path

from aiperf.system.cpu import CpuDescription, parse_cpu, vector_isa

XEON_FLAGS = "fpu sse sse2 ssse3 fma avx avx2 avx512f avx512dq avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"


def _xeon_cpuinfo(sockets: int = 2, cores: int = 4, smt: int = 2) -> str:
    """A dual-socket Sapphire Rapids node, shrunk to ``cores`` cores per socket."""
    blocks = []
    processor = 0
    for _thread in range(smt):
        for socket in range(sockets):
            for core in range(cores):
                blocks.append(
                    f"processor\t: {processor}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
                    f"model name\t: Intel(R) Xeon(R) Platinum 8480+ @ 2.00GHz\ncpu MHz\t\t: 800.000\n"
                    f"physical id\t: {socket}\nsiblings\t: {cores * smt}\ncore id\t\t: {core}\n"
                    f"cpu cores\t: {cores}\nflags\t\t: {XEON_FLAGS}\n"
                )
                processor += 1
    return "\n".join(blocks) + "\n"


def _sysfs(root: Path, cpus: int, *, max_khz: int | None, base_khz: int | None) -> Path:
    base = root / "devices" / "system" / "cpu"
    for cpu in range(cpus):
        cache = base / f"cpu{cpu}" / "cache"
        for index, (level, kind, size, shared) in enumerate(
            [(1, "Data", "48K", str(cpu)), (1, "Instruction", "32K", str(cpu)), (2, "Unified", "2048K", str(cpu)),
             (3, "Unified", "105M", "0-7" if cpu < 8 else "8-15")]
        ):  # fmt: skip
            d = cache / f"index{index}"
            d.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (d / name).write_text(f"{value}\n")
    freq = base / "cpu0" / "cpufreq"
    freq.mkdir(parents=True)
    if max_khz:
        (freq / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
    if base_khz:
        (freq / "base_frequency").write_text(f"{base_khz}\n")
    return root


def test_a_dual_socket_xeon_with_smt_and_cpufreq(tmp_path):
    cpu = parse_cpu(_xeon_cpuinfo(), _sysfs(tmp_path, 16, max_khz=3_800_000, base_khz=2_000_000), tmp_path)
    assert (cpu.sockets, cpu.cores, cpu.threads) == (2, 8, 16)
    assert cpu.model.startswith("Intel(R) Xeon(R) Platinum 8480+")
    assert (cpu.base_mhz, cpu.max_mhz, cpu.clock_source) == (2000.0, 3800.0, "cpufreq cpuinfo_max_freq")
    assert cpu.vector_isa == "avx512"
    assert {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"} <= set(cpu.flags)
    assert "amx_int8" not in cpu.flags  # only the flags that decide FLOPs are recorded
    caches = {c.name: (c.size_bytes, c.instances) for c in cpu.caches}
    assert caches == {"L1d": (48 * 2**10, 16), "L1i": (32 * 2**10, 16), "L2": (2 * 2**20, 16), "L3": (105 * 2**20, 2)}


def test_without_cpufreq_the_base_clock_comes_from_the_model_name_and_says_so(tmp_path):
    cpu = parse_cpu(_xeon_cpuinfo(1, 2, 1), tmp_path, tmp_path)
    assert (cpu.base_mhz, cpu.max_mhz) == (2000.0, 2000.0)
    assert cpu.clock_source == "base clock (no cpufreq: turbo unknown)"
    assert cpu.caches == []


def test_a_virtual_amd_epyc_falls_back_to_the_current_clock(tmp_path):
    text = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.124\n"
        "physical id\t: 0\ncore id\t\t: 0\nflags\t\t: sse2 avx fma avx2 avx512f avx512_bf16\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.124\n"
        "physical id\t: 0\ncore id\t\t: 1\nflags\t\t: sse2 avx fma avx2 avx512f avx512_bf16\n"
    )
    cpu = parse_cpu(text, tmp_path, tmp_path)
    assert (cpu.vendor, cpu.family, cpu.cores, cpu.threads) == ("AuthenticAMD", 26, 2, 2)
    assert cpu.max_mhz == 2596.124 and cpu.base_mhz is None
    assert cpu.clock_source.startswith("current clock")


def test_an_arm_node_reads_features_topology_from_sysfs_and_the_sve_length(tmp_path):
    text = "".join(
        f"processor\t: {k}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd asimdhp sve sve2 bf16\n"
        f"CPU implementer\t: 0x41\nCPU part\t: 0xd4f\n\n"
        for k in range(4)
    )
    for k in range(4):
        topo = tmp_path / "devices" / "system" / "cpu" / f"cpu{k}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{k}\n")
    abi = tmp_path / "sys" / "abi"
    abi.mkdir(parents=True)
    (abi / "sve_default_vector_length").write_text("16\n")
    cpu = parse_cpu(text, tmp_path, tmp_path)
    assert (cpu.sockets, cpu.cores, cpu.threads) == (1, 4, 4)
    assert cpu.vector_isa == "sve" and cpu.sve_vector_bits == 128
    assert {"asimd", "sve", "sve2", "bf16", "asimdhp"} <= set(cpu.flags)
    assert cpu.max_mhz is None and cpu.clock_source == ""


def test_the_widest_isa_wins_and_none_is_empty():
    assert vector_isa({"sse2", "avx", "avx2", "fma", "avx512f"}) == "avx512"
    assert vector_isa({"sse2", "avx", "avx2"}) == "avx"  # AVX2 without FMA: no fused multiply-add rate
    assert vector_isa({"asimd"}) == "neon"
    assert vector_isa(set()) == ""


def test_an_empty_cpuinfo_still_describes_something(tmp_path):
    cpu = parse_cpu("", tmp_path, tmp_path)
    assert cpu.threads >= 1 and cpu.cores >= 1 and cpu.vector_isa == ""


def test_a_description_survives_its_dict(tmp_path):
    cpu = parse_cpu(_xeon_cpuinfo(), _sysfs(tmp_path, 16, max_khz=3_800_000, base_khz=None), tmp_path)
    assert CpuDescription.from_dict({**cpu.to_dict(), "added_later": 1}) == cpu
