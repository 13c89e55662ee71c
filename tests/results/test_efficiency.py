"""OPS / Rpeak and OPS / measured ceiling in the summary, from hand-built ledgers: GPUs, a CPU box, an old ledger."""

from __future__ import annotations

import pytest
from helpers import REPO

from aiperf.ledger.schema import (
    EpochRecord,
    RunStartRecord,
    RunStopRecord,
    TrialEndRecord,
    TrialStartRecord,
    WorkerRecord,
    parse_records,
)
from aiperf.ledger.store import LedgerWriter, read_ledger
from aiperf.results.efficiency import efficiency_summary, format_efficiency
from aiperf.results.summary import build_summary, format_summary
from aiperf.system.kinds import attach_usage, group_nodes
from aiperf.system.peak import device_peaks

T = 1e12
CPU = {
    "model": "AMD EPYC", "vendor": "AuthenticAMD", "family": 26, "sockets": 1, "cores": 2, "threads": 2,
    "max_mhz": 2500.0, "clock_source": "current clock in /proc/cpuinfo (no cpufreq)", "vector_isa": "avx512",
    "flags": ["avx512f"],
}  # fmt: skip


def _system(descriptions, slots, declared=None):
    kinds = group_nodes(descriptions)
    attach_usage(kinds, slots)
    for kind in kinds:
        kind.peaks = device_peaks(kind.description, declared)
    return {"head": "h", "platform": "Linux", "nodes": [], "kinds": [k.to_dict() for k in kinds], "commit": "abc"}


def _gpu(name="NVIDIA H100 80GB HBM3", count=2):
    return {"cpu": CPU, "memory_bytes": 2**40, "accelerators": [{"index": k, "name": name} for k in range(count)]}


def _records(system, epochs, workers, precision="mixed_bfloat16"):
    out = [
        RunStartRecord(t=0.0, run_id="r", system=system, plan={"precision": "auto"}),
        TrialStartRecord(t=0.0, trial="t0", kind="seed", arch_id="a", flops={"train_per_image": 1.0}, params=1),
    ]
    for k, (node, ops) in enumerate(epochs, 1):
        out.append(EpochRecord(t=10.0 * k, trial="t0", epoch=k, ops=ops, val_acc=0.5, precision=precision, node=node))
    out.append(TrialEndRecord(t=10.0 * len(epochs), trial="t0", status="completed"))
    for worker, node, ceiling in workers:
        out.append(WorkerRecord(t=10.0 * len(epochs), worker=worker, node=node, precision=precision, ceiling=ceiling))
    out.append(RunStopRecord(t=10.0 * len(epochs), status="completed"))  # the run ends with its last epoch
    return out


def _ceiling(flops, device_ids="", devices=1):
    return {"flops_per_s": flops, "dtype": "bfloat16", "backend": "jax", "seconds": 3.0, "devices": devices,
            "device_ids": device_ids}  # fmt: skip


def test_a_gpu_cluster_has_its_efficiency_per_device_kind_and_for_the_run():
    system = _system(
        [("n1", _gpu()), ("n2", _gpu("Imaginary NPU 9000"))],
        [("n1", 8.0, 1.0), ("n1", 8.0, 1.0), ("n2", 8.0, 0.5), ("n2", 8.0, 0.5)],
        declared={"Imaginary NPU 9000": {"bfloat16": 100 * T}},
    )
    records = _records(
        system,
        [("n1", 3000 * T), ("n2", 1000 * T)],
        [("w0", "n1", _ceiling(700 * T, "0")), ("w1", "n1", _ceiling(690 * T, "1")),
         ("w2", "n2", _ceiling(60 * T, "0")), ("w3", "n2", _ceiling(80 * T, "0"))],
    )  # fmt: skip
    e = efficiency_summary(records, ops_per_s=4000 * T / 20.0, wall_s=20.0)
    h100, npu = e["by_device"]
    assert (h100["device"], h100["devices"], h100["precision"]) == ("NVIDIA H100 80GB HBM3", 2, "mixed_bfloat16")
    assert h100["rpeak_flops"] == pytest.approx(2 * 989.5 * T) and h100["rpeak_source"] == "table"
    assert h100["ceiling_flops"] == pytest.approx(1390 * T)  # two workers on two GPUs: both count
    assert h100["ops_per_s"] == pytest.approx(150 * T)
    assert h100["ops_over_rpeak"] == pytest.approx(150 / (2 * 989.5))
    assert npu["devices"] == 1 and npu["rpeak_source"] == "declared"  # two half slots share one device
    assert npu["ceiling_flops"] == pytest.approx(80 * T)  # workers sharing GPU 0: the best of them, not the sum
    assert e["rpeak_flops"] == pytest.approx(2 * 989.5 * T + 100 * T)
    assert e["rpeak_sources"] == ["declared", "table"]
    assert e["ops_over_ceiling"] == pytest.approx(200 / 1470)
    assert 0 < e["ops_over_rpeak"] < e["ops_over_ceiling"] <= 1
    line = format_efficiency(e)
    assert line.startswith("9.6 % of Rpeak 2.08 PFLOP/s (declared, table, dense); 13.6 % of the measured matmul")
    assert "2 x NVIDIA H100 80GB HBM3 (accelerators) at mixed_bfloat16" in line


def test_a_device_without_rpeak_leaves_the_run_without_one_and_says_so():
    system = _system([("n1", _gpu("Imaginary NPU 9000", 1))], [("n1", 8.0, 1.0)])
    e = efficiency_summary(_records(system, [("n1", T)], [("w0", "n1", None)]), ops_per_s=T / 10, wall_s=10.0)
    assert e["rpeak_flops"] is None and e["ops_over_rpeak"] is None and e["ceiling_flops"] is None
    assert e["notes"] == [
        "no Rpeak for Imaginary NPU 9000 at mixed_bfloat16: not in the table; a site file can declare it"
    ]
    assert format_efficiency(e).startswith("Rpeak unknown; ceiling not measured")


def test_cpu_workers_ceilings_add_up_and_a_ceiling_above_a_guessed_clock_is_noted():
    system = _system([("n1", {"cpu": CPU, "memory_bytes": 2**34})], [("n1", 1.0, 0.0), ("n1", 1.0, 0.0)])
    records = _records(
        system, [("n1", 1e12)], [("w0", "n1", _ceiling(2e11)), ("w1", "n1", _ceiling(1.9e11))], precision="float32"
    )
    e = efficiency_summary(records, ops_per_s=1e11, wall_s=10.0)
    (cpu,) = e["by_device"]
    assert (cpu["unit"], cpu["devices"], cpu["rpeak_source"]) == ("core", 2, "formula")
    assert cpu["rpeak_flops"] == pytest.approx(2 * 2500e6 * 64)
    assert cpu["ceiling_flops"] == pytest.approx(3.9e11)
    assert len(e["notes"]) == 1 and "the measured ceiling exceeds Rpeak" in e["notes"][0]


def test_the_summary_of_a_written_ledger_shows_both_ratios(tmp_path):
    system = _system([("n1", {"cpu": CPU, "memory_bytes": 2**34})], [("n1", 1.0, 0.0), ("n1", 1.0, 0.0)])
    records = _records(
        system, [("n1", 4e11), ("n1", 4e11)], [("w0", "n1", _ceiling(1e11)), ("w1", "n1", _ceiling(1e11))], "float32"
    )
    with LedgerWriter(tmp_path) as ledger:
        for record in records:
            ledger.append(record)
    summary = build_summary(tmp_path, read_ledger(tmp_path))
    e = summary["efficiency"]
    assert e["ops_per_s"] == summary["score"]["ops_per_s"] == pytest.approx(4e10)
    assert e["ops_over_rpeak"] == pytest.approx(4e10 / (2 * 2500e6 * 64))
    assert e["ops_over_ceiling"] == pytest.approx(0.2)
    assert "  efficiency           12.5 % of Rpeak 320 GFLOP/s (formula, dense); 20.0 % of the measured" in (
        format_summary(summary, tmp_path)
    )


def test_an_old_ledger_reads_and_has_no_efficiency_figures():
    import json

    lines = (REPO / "tests" / "data" / "ledger-format-1.jsonl").read_text().splitlines()
    records = parse_records([json.loads(line) for line in lines])
    e = efficiency_summary(records, ops_per_s=1.0, wall_s=1.0)
    assert e["rpeak_flops"] is None and e["ceiling_flops"] is None and e["by_device"] == []
    assert e["notes"] == ["the ledger records no measured system (written before 2026-11-25, or a simulated run)"]
    assert format_efficiency(e) == f"- ({e['notes'][0]})"


def test_the_report_shows_the_ratio_card_and_a_row_per_device(tmp_path):
    from aiperf.results.report import write_report

    system = _system([("n1", _gpu())], [("n1", 8.0, 1.0), ("n1", 8.0, 1.0)])
    records = _records(system, [("n1", 3000 * T)], [("w0", "n1", _ceiling(700 * T, "0")), ("w1", "n1", None)])
    with LedgerWriter(tmp_path) as ledger:
        for record in records:
            ledger.append(record)
    page = write_report(tmp_path).read_text()
    assert '<div class="label">OPS / Rpeak</div><div class="value">15.2 % of Rpeak</div>' in page
    section = page.split('<h2 id="efficiency">Efficiency</h2>', 1)[1]
    assert "<td>NVIDIA H100 80GB HBM3</td><td>2 accelerator(s) on 1 node(s)</td><td>mixed_bfloat16</td>" in section
    assert "NVIDIA H100 Tensor Core GPU datasheet" in section
