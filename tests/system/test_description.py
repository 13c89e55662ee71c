"""The system description: kinds of node, MLCommons' checker accepting the file (and refusing a broken one)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_site import SITE

from aiperf.engine import system_command as command
from aiperf.system.description import build_description
from aiperf.system.kinds import attach_usage, group_nodes
from aiperf.system.peak import device_peaks
from aiperf.system.site import parse_site

CHECKER_RULESET = ("training", "4.0.0")


def _gpu_node(host: str, memory: int = 2048 * 2**30) -> dict:
    cpu = {
        "model": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "family": 6, "sockets": 2, "cores": 112,
        "threads": 224, "base_mhz": 2000.0, "max_mhz": 3800.0, "clock_source": "cpufreq cpuinfo_max_freq",
        "vector_isa": "avx512", "flags": ["avx512f", "amx_bf16"],
        "caches": [{"level": 3, "type": "Unified", "size_bytes": 105 * 2**20, "instances": 2}],
    }  # fmt: skip
    gpus = [
        {"index": k, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30, "max_sm_mhz": 1980,
         "pcie_generation": 5, "pcie_width": 16, "nvlinks_active": 18, "nvlink_version": 4, "pci_bus_id": f"0:{k}",
         "driver": "550.54.15", "cuda_driver": "12.4"}
        for k in range(8)
    ]  # fmt: skip
    return {
        "hostname": host, "cpu": cpu, "memory_bytes": memory, "accelerators": gpus,
        "accelerator_topology": {"0-1": "NVLink, same board"}, "operating_system": "Ubuntu 22.04.4 LTS",
        "kernel": "5.15.0", "software": {"python": "3.11.7", "backend": "jax", "keras": "3.15.1", "jax": "0.6.2",
        "ray": "2.60.0", "aiperf": "0.1.0"}, "commit": "abc123",
    }  # fmt: skip


def _cpu_node(host: str) -> dict:
    node = _gpu_node(host, 512 * 2**30)
    node["accelerators"], node["accelerator_topology"] = [], {}
    node["cpu"] = {**node["cpu"], "model": "AMD EPYC 9654", "vendor": "AuthenticAMD", "family": 25, "cores": 192}
    return node


def _kinds(described):
    kinds = group_nodes(described)
    for kind in kinds:
        kind.peaks = device_peaks(kind.description)
    return kinds


def test_identical_nodes_are_one_kind_and_memory_differing_by_megabytes_does_not_split_them():
    kinds = group_nodes(
        [("n1", _gpu_node("g1")), ("n2", _gpu_node("g2", 2048 * 2**30 - 300 * 2**20)), ("n3", _cpu_node("c1"))]
    )
    assert [(k.count, k.nodes, k.hostnames) for k in kinds] == [(2, ["n1", "n2"], ["g1", "g2"]), (1, ["n3"], ["c1"])]
    assert "hostname" not in kinds[0].description


def test_usage_counts_accelerators_of_gpu_slots_and_cores_of_cpu_slots():
    kinds = group_nodes([("n1", _gpu_node("g1")), ("n2", _gpu_node("g2")), ("n3", _cpu_node("c1"))])
    slots = [("n1", 14.0, 1.0)] * 8 + [("n2", 28.0, 0.5)] * 4 + [("n3", 300.0, 0.0)]
    attach_usage(kinds, slots)
    assert (kinds[0].used_accelerators, kinds[0].used_cores) == (8 + 2, 0)  # fractional: 4 x 0.5 -> 2 GPUs
    assert (kinds[1].used_accelerators, kinds[1].used_cores) == (0, 192)  # at most the node's physical cores


def _write(tmp_path, document) -> str:
    path = tmp_path / "system.json"
    path.write_text(json.dumps(document))
    return str(path)


def check(path: str) -> bool:
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

    valid, *_ = check_system_desc(path, *CHECKER_RULESET)
    return valid


def test_mlcommons_checker_accepts_the_description_and_top500_fields_sit_beside(tmp_path):
    document = build_description(_kinds([("n1", _gpu_node("g1")), ("n2", _gpu_node("g2"))]), parse_site(SITE))
    assert check(_write(tmp_path, document))
    assert document["number_of_nodes"] == "2" and document["accelerators_per_node"] == "8"
    assert document["accelerator_model_name"] == "NVIDIA H100 80GB HBM3"
    assert document["host_processor_core_count"] == "56" and document["host_processors_per_node"] == "2"
    assert document["accelerator_host_interconnect"] == "PCIe Gen5 x16"
    assert document["accelerator_interconnect"] == "NVLink 4, 18 links per accelerator"
    assert document["framework"] == "Keras 3.15.1 on jax 0.6.2"
    assert all(isinstance(v, str) for k, v in document.items() if k not in ("top500", "aiperf"))
    top = document["top500"]
    assert (top["site"], top["year"], top["total_cores"], top["accelerator_count"]) == (
        "Example HPC Centre",
        2026,
        224,
        16,
    )
    assert top["rpeak"]["bfloat16"]["flops_per_s"] == pytest.approx(16 * 989.5e12)
    assert top["rpeak"]["bfloat16"]["sources"] == ["table"]
    assert document["aiperf"]["node_kinds"][0]["count"] == 2


def test_a_heterogeneous_cluster_lists_each_kind_with_its_count(tmp_path):
    document = build_description(
        _kinds([("n1", _gpu_node("g1")), ("n2", _gpu_node("g2")), ("n3", _cpu_node("c1"))]), parse_site(SITE)
    )
    assert check(_write(tmp_path, document))
    assert document["number_of_nodes"] == "3"
    assert document["accelerators_per_node"] == "2 node(s): 8; 1 node(s): 0"
    assert (
        document["host_processor_model_name"] == "2 node(s): Intel(R) Xeon(R) Platinum 8480+; 1 node(s): AMD EPYC 9654"
    )
    assert len(document["aiperf"]["node_kinds"]) == 2


def test_the_site_file_overrides_what_was_measured_where_a_person_knows_better():
    site = parse_site({**SITE, "accelerator_interconnect": "NVLink Switch System, 900 GB/s"})
    document = build_description(_kinds([("n1", _gpu_node("g1"))]), site)
    assert document["accelerator_interconnect"] == "NVLink Switch System, 900 GB/s"


@pytest.mark.parametrize(
    "breakage",
    [lambda d: d.pop("cooling"), lambda d: d.update(status="available"), lambda d: d.pop("host_memory_capacity")],
)
def test_the_checker_refuses_a_broken_description(tmp_path, breakage):
    document = build_description(_kinds([("n1", _gpu_node("g1"))]), parse_site(SITE))
    breakage(document)
    assert not check(_write(tmp_path, document))


def test_the_checker_module_run_as_a_user_runs_it_passes_the_file(tmp_path):
    path = _write(tmp_path, build_description(_kinds([("n1", _cpu_node("c1"))]), parse_site(SITE)))
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.system_desc_checker", path, *CHECKER_RULESET,
         "--log_output", str(tmp_path / "checker.log")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "System description checker passed for example-cluster" in proc.stderr, proc.stderr


def test_the_system_command_writes_a_checked_file_from_the_measured_kinds(tmp_path, monkeypatch, capsys):
    from aiperf.config import load_config

    monkeypatch.setattr(command, "measure_kinds", lambda cfg, address, declared=None: _kinds([("n1", _gpu_node("g1"))]))
    site = tmp_path / "site.yaml"
    site.write_text(json.dumps(SITE))  # JSON is YAML
    out = tmp_path / "system.json"
    text = command.system_command(load_config("smoke"), None, str(site), str(out))
    assert check(str(out))
    assert "1 node(s) the run would use, 1 kind(s)" in text and "8 x NVIDIA H100 80GB HBM3 (80 GiB)" in text
    assert "bfloat16 990 TFLOP/s" in text
    capsys.readouterr()
    measured_only = command.system_command(load_config("smoke"), None, None, None)
    assert set(json.loads(measured_only)) == {"aiperf"}
    note = capsys.readouterr().err  # printed JSON lacks the site's fields: which ones is said beside it
    assert "measured part only" in note and "system_name" in note and "--site" in note


@pytest.mark.slow  # starts a private Ray instance (~10 s)
def test_aiperf_system_measures_this_machine_through_ray_and_the_checker_accepts_it(tmp_path):
    from helpers import run_cli

    site = tmp_path / "site.yaml"
    site.write_text(json.dumps(SITE))
    out = tmp_path / "system.json"
    proc = run_cli("system", "--config", "smoke", "--site", str(site), "-o", str(out), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("system: 1 node(s) the run would use, 1 kind(s)")
    assert check(str(out))
    (kind,) = json.loads(out.read_text())["aiperf"]["node_kinds"]
    assert kind["count"] == 1 and kind["used_cores"] >= 1 and kind["description"]["cpu"]["threads"] >= 1
