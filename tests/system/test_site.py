"""The site file: every problem named at once, in one line, and refused before anything is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiperf.cli import main
from aiperf.errors import AiperfError
from aiperf.system.site import REQUIRED, parse_site, read_site, site_problems

SITE = {
    "submitter": "Example University",
    "system_name": "example-cluster",
    "division": "closed",
    "status": "Available on-premise",
    "site": "Example HPC Centre",
    "location": "Exampletown, Exampleland",
    "year": 2026,
    "host_networking": "InfiniBand NDR 400 Gb/s",
    "host_networking_topology": "fat tree",
    "host_storage_type": "NVMe SSD",
    "host_storage_capacity": "4 x 3.84 TB",
    "host_memory_configuration": "16 x 64 GB DDR5-4800",
    "cooling": "liquid",
}


def site_yaml(**changes: object) -> str:
    import yaml

    data = {**SITE, **changes}
    return yaml.safe_dump({k: v for k, v in data.items() if v is not None}, sort_keys=False)


def test_a_complete_site_file_reads_with_its_optional_fields():
    site = parse_site(
        {**SITE, "accelerator_on-chip_memories": "50 MB L2", "declared_peak": {"Imaginary NPU": {"bfloat16": 1e15}}}
    )
    assert site.accelerator_on_chip_memories == "50 MB L2"
    assert site.declared_for("Imaginary NPU") == {"bfloat16": 1e15}
    assert site.hw_notes == "" and site.manufacturer == ""


def test_an_unknown_field_is_named():
    problem = site_problems({**SITE, "cooling_fluid": "water"})
    assert problem == "unknown field(s): cooling_fluid"


def test_all_missing_required_fields_are_listed_at_once_in_one_line():
    problem = site_problems({"submitter": "x", "system_name": "y"})
    assert problem is not None and "\n" not in problem
    missing = problem.split("missing required field(s): ", 1)[1].split(", ")
    assert missing == [f for f in REQUIRED if f not in ("submitter", "system_name")]


def test_wrong_types_and_values_are_named_with_what_was_given():
    problem = site_problems(
        {**SITE, "year": "twenty", "status": "available", "division": 3, "declared_peak": {"X": {"fp8": 1}}, "extra": 1}
    )
    assert problem is not None
    assert problem.startswith("unknown field(s): extra; ")
    assert "year: must be a valid integer (got 'twenty')" in problem
    assert "status: must be 'Available on-premise', 'Available cloud'" in problem and "(got 'available')" in problem
    assert "division: must be 'closed' or 'open' (got 3)" in problem
    assert "declared_peak.X.fp8" in problem


@pytest.mark.parametrize("peak", [0, -4e14, float("inf"), float("nan"), 1e25])
def test_a_declared_peak_is_a_positive_finite_figure(peak):
    """A zero or negative peak vanished from the efficiency; a tiny one ranked first (issue 45, case 9)."""
    problem = site_problems({**SITE, "declared_peak": {"Imaginary NPU": {"bfloat16": peak}}})
    assert problem is not None and "declared_peak.Imaginary NPU.bfloat16" in problem
    assert site_problems({**SITE, "declared_peak": {"Imaginary NPU": {"bfloat16": 4e14}}}) is None


def test_a_declared_peak_below_the_measured_ceiling_is_a_finding_of_the_check():
    from aiperf.submission.check import declared_peak_problems

    def efficiency(source: str, rpeak: object, ceiling: object = 2e12) -> dict:
        device = {"device": "Xeon", "rpeak_source": source, "rpeak_flops": rpeak, "ceiling_flops": ceiling}
        return {"by_device": [device]}

    [low] = declared_peak_problems(efficiency("declared", 1e-3))
    assert "the declared peak of 'Xeon', 0.001 FLOP/s, is below its measured ceiling of 2e+12 FLOP/s" in low
    assert declared_peak_problems(efficiency("declared", -1.0)) == [
        "the declared peak of 'Xeon' is not a positive number (-1.0)"
    ]
    assert declared_peak_problems(efficiency("declared", 3e12)) == []
    assert declared_peak_problems(efficiency("formula", 1e12)) == []  # a formula below turbo clocks: a note, not this
    assert declared_peak_problems(efficiency("declared", 1e12, None)) == []  # nothing measured to compare with
    assert declared_peak_problems({"by_device": "junk"}) == declared_peak_problems(None) == []


def test_a_file_that_is_not_a_mapping_or_not_yaml_is_refused(tmp_path):
    assert site_problems(["a", "b"]) == "the top level must be a mapping of field: value"
    path = tmp_path / "site.yaml"
    path.write_text("submitter: [unclosed\n")
    with pytest.raises(AiperfError, match=r"site file .*site.yaml: not valid YAML at line 2"):
        read_site(path)
    with pytest.raises(AiperfError, match="no such file"):
        read_site(tmp_path / "nope.yaml")
    path.write_text("a: &x 1\nb: *x\n")
    with pytest.raises(AiperfError, match="not valid YAML"):
        read_site(path)


def test_read_site_reads_a_written_file(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(site_yaml())
    assert read_site(path).system_name == "example-cluster"


def test_the_cli_refuses_a_bad_site_file_in_one_line_before_measuring(tmp_path, capsys):
    path = tmp_path / "site.yaml"
    path.write_text(site_yaml(cooling=None, year=None, colour="blue"))
    assert main(["system", "--site", str(path), "-o", str(tmp_path / "system.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("aiperf: error: site file ")
    assert "unknown field(s): colour; missing required field(s): year, cooling" in err
    assert not (tmp_path / "system.json").exists()


def test_a_run_naming_a_bad_site_file_is_refused_before_anything_is_created(tmp_path):
    from aiperf.config import load_config
    from aiperf.engine.run import declared_peak, run_benchmark

    bad = tmp_path / "site.yaml"
    bad.write_text(site_yaml(status="soon"))
    results = tmp_path / "results"
    cfg = load_config("smoke", [f"cluster.site={bad}", f"run.results_dir={results}"])
    with pytest.raises(AiperfError, match=r"status: must be 'Available on-premise'.*\(got 'soon'\)"):
        run_benchmark(cfg)
    assert not results.exists()
    good = tmp_path / "good.yaml"
    good.write_text(site_yaml(declared_peak={"Imaginary NPU": {"bfloat16": 4.0e14}}))
    assert declared_peak(load_config("smoke", [f"cluster.site={good}"])) == {"Imaginary NPU": {"bfloat16": 4.0e14}}
    assert declared_peak(load_config("smoke")) == {}


def test_the_example_site_file_in_the_docs_is_accepted():
    site = read_site(Path(__file__).parents[2] / "docs" / "site-example.yaml")
    assert (site.system_name, site.division, site.year) == ("Example Cluster", "open", 2026)
