"""``aiperf package`` and ``aiperf check``: the layout, the refusals, and one tampered package per check.

The end-to-end tests drive the CLI on real smoke runs (fixtures in conftest.py); each tampered
package is a copy of the real one with one thing wrong, and the check must name it. Tampering a
file changes its hash, which the manifest catches by itself, so the tests of the deeper checks
re-write the manifest afterwards (as a forger would) and the finding must come from the check
under test.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from helpers import REPO, aiperf_cmd, cli_env, page_health, run_cli
from submission_fixtures import AUDIT_SAMPLE, SYSTEM

from aiperf import cli
from aiperf.errors import AiperfError
from aiperf.metrics.workloads import WORKLOADS
from aiperf.submission import layout
from aiperf.submission.layout import MANIFEST, PACKAGE_JSON, inside, is_portable, portable_name, read_package_json
from aiperf.submission.listing import make_list
from aiperf.submission.manifest import file_sha256, manifest_text, read_manifest
from aiperf.submission.tree import walk

ENTRY = f"results/{SYSTEM}/smoke"

# --- helpers ------------------------------------------------------------------------------------


def copy_package(package_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "pkg"
    shutil.copytree(package_dir, target, symlinks=True)
    for path in target.rglob("*"):  # the fixture's files may be read-only; the copy is the test's own
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def reseal(package: Path) -> None:
    """Re-write the manifest for what is there now, as a forger would."""
    files = [p for p in package.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MANIFEST]
    hashes = {p.relative_to(package).as_posix(): file_sha256(p) for p in files}
    (package / MANIFEST).write_text(manifest_text(hashes))


def check(package: Path, *args: str) -> tuple[int, list[str], str]:
    """``aiperf check``: exit code, its lines, stderr."""
    proc = run_cli("check", str(package), *args, timeout=900)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


def rejected_for(package: Path, *needles: str) -> list[str]:
    """Check ``package``: it must be rejected, with a finding line holding every needle; returns the lines."""
    rc, lines, stderr = check(package)
    assert rc == 1, "\n".join(lines) + stderr[-2000:]
    assert lines[0].startswith("rejected:"), lines
    findings = [line for line in lines[1:] if not line.strip().startswith("note:")]
    assert any(all(n in line for n in needles) for line in findings), "\n".join(lines)
    return lines


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1))


# --- the layout, fast -----------------------------------------------------------------------------


def test_portable_names():
    assert portable_name("Example Cluster (CI)") == "Example-Cluster-CI"
    assert portable_name("../../etc") == "etc"
    assert portable_name("日本") == ""
    assert len(portable_name("x" * 500)) == layout.MAX_NAME_CHARS
    assert is_portable("run_1") and is_portable("t00003.npz")
    assert not any(is_portable(n) for n in ("", ".hidden", "-rf", "a b", "a:b", "é", "x" * 65))


def test_inside_refuses_every_path_that_leaves_or_hides(tmp_path):
    assert inside(tmp_path, "results/a/b/run_1/ledger.jsonl") == tmp_path / "results/a/b/run_1/ledger.jsonl"
    for bad in ("../x", "/etc/passwd", "a/../../x", "a//b", "a/./b", "a/", ".git/config", "a\\b", ""):
        assert inside(tmp_path, bad) is None, bad


def test_every_workload_says_how_many_runs_a_ranked_entry_needs():
    assert {n: w.ranked_runs for n, w in WORKLOADS.items() if n in ("smoke", "default", "imagenet")} == {
        "smoke": 2,
        "default": 3,
        "imagenet": 3,
    }


def test_package_json_of_another_shape_is_unreadable(tmp_path):
    (tmp_path / PACKAGE_JSON).write_text(json.dumps({"format": "aiperf-package/1", "entries": [{"system": 3}]}))
    with pytest.raises(AiperfError, match=r"entries\[0\]: runs must be a list of strings"):
        read_package_json(tmp_path)
    entry = {"system": "s", "workload": "smoke", "config": "c", "runs": ["r"]}
    good = {"format": "aiperf-package/1", "created": "2026-11-26T00:00:00Z", "aiperf_version": "0.1.0", "commit": None}
    good["entries"] = [entry]
    (tmp_path / PACKAGE_JSON).write_text(json.dumps(good))
    index = read_package_json(tmp_path)
    assert index.entries[0].runs == ["r"] and index.commit is None


@pytest.mark.parametrize("make", ["missing", "file", "no-index", "not-json", "link", "tar"])
def test_check_of_no_package_is_one_line_and_exit_2(tmp_path, capsys, make):
    target = tmp_path / "pkg"
    if make == "file":
        target.write_text("x")
    elif make in ("no-index", "not-json", "link"):
        target.mkdir()
        if make == "not-json":
            (target / PACKAGE_JSON).write_text("{")
        if make == "link":
            (target / PACKAGE_JSON).symlink_to("/etc/hostname")
    elif make == "tar":
        target = tmp_path / "pkg.tar.gz"
        target.write_bytes(b"")
    assert cli.main(["check", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aiperf: error: "), err


def test_manifest_lines_that_escape_or_are_malformed_are_problems(tmp_path):
    good = "0" * 64
    (tmp_path / MANIFEST).write_text(
        f"{good}  ../outside\n{good}  /etc/passwd\nnot a line\n{good}  b\n{good}  a\n{good}  a\n"
    )
    problems = read_manifest(tmp_path).problems
    assert sum("not a portable path inside the package" in p for p in problems) == 2
    assert any("is not '<sha256>  <path>'" in p for p in problems)
    assert any("a second time" in p for p in problems) and any("not sorted" in p for p in problems)


def test_the_walk_reports_links_fifos_hidden_names_and_depth_without_following(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ok.json").write_text("{}")
    (tmp_path / "link").symlink_to("/etc")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / ".hidden").write_text("")
    deep = tmp_path.joinpath(*["d"] * (layout.MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    tree = walk(tmp_path)
    text = "\n".join(tree.problems)
    assert "link: a symbolic link" in text and "fifo: not a regular file" in text
    assert ".hidden: not a portable name" in text and "nested deeper than" in text
    assert "a/ok.json" in tree.files and not any(p.startswith("link/") for p in tree.files)


# --- the package, from real runs ------------------------------------------------------------------


@pytest.mark.slow
def test_the_package_has_the_documented_layout_and_its_archive(package_dir, two_smoke_runs):
    index = read_package_json(package_dir)
    (entry,) = index.entries
    assert (entry.system, entry.workload) == (SYSTEM, "smoke")
    assert entry.config == f"{ENTRY}/config.yaml" and entry.runs == [f"{ENTRY}/run_1", f"{ENTRY}/run_2"]
    listed = read_manifest(package_dir)
    assert not listed.problems
    files = walk(package_dir)
    assert not files.problems and set(files.files) - {MANIFEST} == set(listed.hashes)
    assert all(file_sha256(package_dir / p) == h for p, h in listed.hashes.items())
    for k, run in enumerate(two_smoke_runs, 1):
        packaged = package_dir / f"{ENTRY}/run_{k}"
        header = json.loads((packaged / "ledger.jsonl").read_text().splitlines()[0])
        assert header["config"]["run"]["seed"] == k - 1
        for name in ("ledger.jsonl", "summary.json", "mllog.txt", "audit.json", "telemetry.jsonl"):
            assert (packaged / name).read_bytes() == (run / name).read_bytes(), name
        assert (run / "report.html").exists() and not (packaged / "report.html").exists()  # a page is not evidence
        audit = json.loads((run / "audit.json").read_text())
        audited = {f"{t['trial']}.npz" for t in audit["trials"] if t["status"] != "skipped"}
        weights = {p.name for p in (packaged / "weights").iterdir()}
        assert weights == audited and 1 <= len(weights) <= 1 + int(AUDIT_SAMPLE)
        assert (run / "weights").exists() and weights <= {p.name for p in (run / "weights").iterdir()}
        assert not (packaged / "compile-cache").exists() and not (packaged / "run.lock").exists()
    from aiperf.config import load_config

    cfg = load_config(str(package_dir / entry.config))
    assert cfg.run.name == "smoke" and cfg.run.max_trials == 8
    with tarfile.open(package_dir.with_name(package_dir.name + ".tar.gz")) as tar:
        members = tar.getmembers()
    assert all(m.isreg() for m in members)
    assert sorted(m.name for m in members) == sorted(f"{package_dir.name}/{p}" for p in files.files)
    assert not package_dir.with_name(package_dir.name + ".partial").exists()


@pytest.mark.slow
def test_the_description_is_copied_as_it_was_written(package_dir, system_json):
    assert (package_dir / f"systems/{SYSTEM}.json").read_bytes() == system_json.read_bytes()


@pytest.mark.slow
def test_check_accepts_the_package_and_audits_every_run_again(package_dir):
    rc, lines, stderr = check(package_dir)
    assert rc == 0, "\n".join(lines) + stderr[-3000:]
    assert lines[0].startswith(f"accepted: {package_dir}: 1 system(s), 1 entry, 2 run(s);"), lines
    assert "trial(s) re-evaluated from stored weights" in lines[0] and " 0 trial(s)" not in lines[0]
    assert any("note:" in line and "not official" in line for line in lines[1:]), lines


# --- refusals -------------------------------------------------------------------------------------


def _package(runs, system_json, out) -> tuple[int, str]:
    proc = run_cli("package", *map(str, runs), "--system", str(system_json), "-o", str(out), timeout=300)
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stderr


@pytest.mark.slow
def test_package_refuses_an_existing_output_and_the_same_run_twice(two_smoke_runs, system_json, tmp_path):
    (tmp_path / "out").mkdir()
    rc, err = _package(two_smoke_runs, system_json, tmp_path / "out")
    assert rc == 2 and "already exists" in err and err.count("\n") == 1
    rc, err = _package([two_smoke_runs[0], two_smoke_runs[0]], system_json, tmp_path / "new")
    assert rc == 2 and "are the same run directory" in err
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()


@pytest.mark.slow
def test_package_refuses_a_run_without_audit_and_one_that_fails_verify(two_smoke_runs, system_json, tmp_path):
    unaudited = tmp_path / "unaudited"
    shutil.copytree(two_smoke_runs[0], unaudited)
    (unaudited / "audit.json").unlink()
    rc, err = _package([unaudited], system_json, tmp_path / "a")
    assert rc == 2 and f"run aiperf audit {unaudited} first" in err
    edited = tmp_path / "edited"
    shutil.copytree(two_smoke_runs[0], edited)
    edit_json(edited / "summary.json", lambda s: s["score"].update(ops_per_s=s["score"]["ops_per_s"] * 2))
    rc, err = _package([edited], system_json, tmp_path / "b")
    assert rc == 2 and "does not verify" in err and "score.ops_per_s" in err


@pytest.mark.slow
def test_a_run_that_completed_no_trial_is_told_it_can_be_neither_audited_nor_packaged(sim_run, system_json, tmp_path):
    run = shutil.copytree(sim_run, tmp_path / "sim")  # simulated trials store no weights, as a run cut short
    rc, err = _package([run], system_json, tmp_path / "out")
    assert rc == 2 and "the run has no audit, and none can be made" in err and f"--resume {run}" in err
    audit = run_cli("audit", str(run))
    assert audit.returncode == 2 and "can be neither audited nor packaged" in audit.stderr


@pytest.mark.slow
def test_package_refuses_a_linked_file(two_smoke_runs, system_json, tmp_path):
    linked = tmp_path / "linked"
    shutil.copytree(two_smoke_runs[0], linked)
    (linked / "telemetry.jsonl").unlink()
    (linked / "telemetry.jsonl").symlink_to(two_smoke_runs[0] / "telemetry.jsonl")
    rc, err = _package([linked], system_json, tmp_path / "out")
    assert rc == 2 and "a symbolic link" in err


@pytest.mark.slow
def test_package_refuses_duplicate_seeds_and_different_configs(two_smoke_runs):
    from aiperf.submission.package import _group
    from aiperf.submission.runs import RunFacts, read_audit, read_run

    run = read_run(two_smoke_runs[0])
    audit = read_audit(two_smoke_runs[0])
    twin = RunFacts(Path("/elsewhere"), run.raw, run.records, run.header.model_copy(update={"run_id": "another-run"}))
    with pytest.raises(AiperfError, match=r"have the same seed \(0\)"):
        _group([(run, audit), (twin, audit)])
    raw = json.loads(json.dumps(run.raw))
    raw[0]["config"]["train"]["epochs"] = 99
    other = RunFacts(Path("/elsewhere"), raw, run.records, twin.header)
    with pytest.raises(AiperfError, match=r"different configs \(train.epochs"):
        _group([(run, audit), (other, audit)])
    seeded = read_run(two_smoke_runs[1])
    assert [r.seed for r, _ in _group([(seeded, audit), (run, audit)])["smoke"]] == [0, 1]


@pytest.mark.slow
def test_package_bounds_are_checked_before_anything_is_written(two_smoke_runs, system_json, tmp_path):
    from aiperf.submission.package import Limits, package_command

    for limits, message in (
        (Limits(package_bytes=10_000), "over its limit of 10,000"),
        (Limits(file_bytes=100), "over the package's limit of 100 per file"),
        (Limits(files=5), "over its limit of 5"),
        (Limits(runs=1), "a package holds at most 1"),
    ):
        with pytest.raises(AiperfError, match=message):
            package_command(list(map(str, two_smoke_runs)), str(system_json), str(tmp_path / "out"), limits)
        assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_interrupted_write_leaves_no_package(two_smoke_runs, system_json, tmp_path, monkeypatch):
    from aiperf.submission import package

    calls = []

    def full_disk(source, target, size):
        calls.append(source)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        return real(source, target, size)

    real = package._copy
    monkeypatch.setattr(package, "_copy", full_disk)
    with pytest.raises(AiperfError, match="no space left") as err:
        package.package_command(list(map(str, two_smoke_runs)), str(system_json), str(tmp_path / "out"))
    assert err.value.exit_code == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_package_refuses_a_description_of_the_measured_part_only_or_of_another_machine(
    two_smoke_runs, system_json, tmp_path
):
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"aiperf": json.loads(system_json.read_text())["aiperf"]}))
    rc, err = _package(two_smoke_runs, measured, tmp_path / "a")
    assert rc == 2 and "no system_name" in err
    other = tmp_path / "other.json"
    other.write_text(system_json.read_text())
    edit_json(other, _claim_512_h100)
    rc, err = _package(two_smoke_runs, other, tmp_path / "b")
    assert rc == 2 and f"--system {other}:" in err and err.count("\n") == 1, err


def _claim_512_h100(description: dict) -> None:
    kind = description["aiperf"]["node_kinds"][0]
    kind["count"] = 64
    kind["used_accelerators"] = 512
    kind["description"]["accelerators"] = [
        {"index": k, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30} for k in range(8)
    ]
    description.update(number_of_nodes="64", accelerators_per_node="8", accelerator_model_name="NVIDIA H100 80GB HBM3")


# --- one tampered package per check ---------------------------------------------------------------


@pytest.mark.slow
def test_an_edited_summary_score_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    edit_json(pkg / f"{ENTRY}/run_1/summary.json", lambda s: s["score"].update(ops_per_s=1e15))
    reseal(pkg)
    rejected_for(pkg, f"{ENTRY}/run_1: does not verify", "score.ops_per_s")


@pytest.mark.slow
def test_an_edited_ledger_line_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    ledger = pkg / f"{ENTRY}/run_2/ledger.jsonl"
    lines = ledger.read_text().splitlines()
    k = next(k for k, line in enumerate(lines) if json.loads(line)["type"] == "epoch")
    record = json.loads(lines[k])
    record["val_acc"] = 0.999
    lines[k] = json.dumps(record)
    ledger.write_text("\n".join(lines) + "\n")
    reseal(pkg)
    rejected_for(pkg, f"{ENTRY}/run_2: does not verify", "edited")


@pytest.mark.slow
def test_an_extra_file_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    (pkg / f"{ENTRY}/run_1/notes.txt").write_text("trust me\n")
    lines = rejected_for(pkg, f"{ENTRY}/run_1/notes.txt", f"not in {MANIFEST}")
    assert any("not part of the package layout" in line for line in lines)
    # Rejected already: no run is audited again (the costly check), and the note says so.
    assert "  note: 2 run(s) not audited again: the findings above reject the package already" in "\n".join(lines)


@pytest.mark.slow
def test_a_missing_file_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    (pkg / f"{ENTRY}/run_1/mllog.txt").unlink()
    rejected_for(pkg, f"{ENTRY}/run_1/mllog.txt", "missing from the package")


@pytest.mark.slow
def test_a_symbolic_link_is_rejected_and_not_followed(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    target = pkg / f"{ENTRY}/run_2/telemetry.jsonl"
    target.unlink()
    target.symlink_to("/etc/hostname")
    rejected_for(pkg, f"{ENTRY}/run_2/telemetry.jsonl", "a symbolic link")


@pytest.mark.slow
def test_a_manifest_entry_leaving_the_package_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    with open(pkg / MANIFEST, "a") as fh:
        fh.write(f"{'0' * 64}  ../../../etc/passwd\n")
    rejected_for(pkg, "../../../etc/passwd", "not a portable path inside the package")


@pytest.mark.slow
def test_a_description_claiming_512_h100_over_two_cpu_slots_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    edit_json(pkg / f"systems/{SYSTEM}.json", _claim_512_h100)
    reseal(pkg)
    rejected_for(pkg, "describes 64 node(s)", "NVIDIA H100", "run_1 (run_start)'s ledger recorded 1 node(s)")


@pytest.mark.slow
def test_a_description_edited_above_its_measurements_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    edit_json(pkg / f"systems/{SYSTEM}.json", lambda d: d.update(number_of_nodes="512"))
    reseal(pkg)
    rejected_for(pkg, f"systems/{SYSTEM}.json: number_of_nodes says '512' but its measured node kinds give '1'")


@pytest.mark.slow
def test_duplicate_seeds_are_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    shutil.rmtree(pkg / f"{ENTRY}/run_2")
    shutil.copytree(pkg / f"{ENTRY}/run_1", pkg / f"{ENTRY}/run_2")
    reseal(pkg)
    lines = rejected_for(pkg, f"{ENTRY}/run_2: seed 0 is also {ENTRY}/run_1's")
    assert any("one run packaged twice" in line for line in lines)


@pytest.mark.slow
def test_too_few_runs_are_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    shutil.rmtree(pkg / f"{ENTRY}/run_2")
    edit_json(pkg / PACKAGE_JSON, lambda d: d["entries"][0]["runs"].pop())
    reseal(pkg)
    rejected_for(pkg, f"{ENTRY}: 1 run(s); a ranked entry of workload smoke needs 2 runs")


@pytest.mark.slow
def test_a_broken_mllog_is_rejected_by_mlcommons_compliance_checker(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    log = pkg / f"{ENTRY}/run_1/mllog.txt"
    kept = [line for line in log.read_text().splitlines() if '"key": "init_stop"' not in line]
    log.write_text("\n".join(kept) + "\n")
    reseal(pkg)
    rejected_for(pkg, f"{ENTRY}/run_1/mllog.txt: MLCommons' compliance checker", "init_stop")


@pytest.mark.slow
def test_a_hash_mismatch_is_rejected(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    with open(pkg / f"{ENTRY}/run_2/telemetry.jsonl", "ab") as fh:
        fh.write(b"\n")
    rejected_for(pkg, f"{ENTRY}/run_2/telemetry.jsonl: SHA-256", f"does not match {MANIFEST}")


@pytest.mark.slow
def test_a_report_page_in_a_package_is_rejected_whatever_it_says(package_dir, tmp_path):
    """A page is not evidence: one claiming "9.9 EOPS (verified)" with a script was accepted (issue 45, case
    10). Packages carry no report; `aiperf report` makes one from the verified ledger."""
    pkg = copy_package(package_dir, tmp_path)
    page = pkg / f"{ENTRY}/run_1/report.html"
    page.write_text("<html><script>alert(1)</script><h1>9.9 EOPS (verified)</h1></html>")
    reseal(pkg)
    rejected_for(pkg, f"{ENTRY}/run_1/report.html", "aiperf report")


@pytest.mark.slow
def test_an_oversized_file_is_rejected_without_being_read(package_dir, tmp_path):
    pkg = copy_package(package_dir, tmp_path)
    big = pkg / f"{ENTRY}/run_1/weights/t99999.npz"
    with open(big, "wb") as fh:
        fh.truncate(layout.MAX_FILE_BYTES + 1)  # sparse: no disk used
    rejected_for(pkg, f"{ENTRY}/run_1/weights/t99999.npz", "over the limit")


# --- the description against itself and a ledger, fast ---------------------------------------------


def _cpu_kind(cores: int = 2, keras: str = "3.15.1") -> dict:
    cpu = {"model": "AMD EPYC 7B13", "vendor": "AuthenticAMD", "family": 25, "sockets": 1, "cores": cores,
           "threads": cores, "base_mhz": 2450.0, "max_mhz": 2450.0, "clock_source": "cpuinfo", "vector_isa": "avx2",
           "flags": ["avx2", "fma"], "caches": []}  # fmt: skip
    software = {"python": "3.11.7", "backend": "tensorflow", "keras": keras, "tensorflow": "2.20.0", "aiperf": "0.1.0"}
    description = {"cpu": cpu, "memory_bytes": 24 * 2**30, "accelerators": [], "accelerator_topology": {},
                   "operating_system": "Debian 12", "kernel": "6.1.0", "software": software}  # fmt: skip
    return {"count": 1, "nodes": ["n1"], "hostnames": ["vm"], "description": description, "used_accelerators": 0,
            "used_cores": cores, "peaks": {}}  # fmt: skip


def _description(kind: dict) -> dict:
    from submission_fixtures import SITE

    from aiperf.system.description import build_description
    from aiperf.system.kinds import NodeKind
    from aiperf.system.site import parse_site

    return json.loads(json.dumps(build_description([NodeKind(**kind)], parse_site(SITE))))


def test_a_description_of_the_ledgers_machine_agrees_and_another_is_named():
    from aiperf.ledger.schema import SystemHeader
    from aiperf.submission.system_check import agreement_problems

    header = SystemHeader.model_validate({"kinds": [_cpu_kind()]})
    assert agreement_problems([_cpu_kind()], header, "run_1", "sys.json") == []
    (problem,) = agreement_problems([_cpu_kind(cores=512)], header, "run_1", "sys.json")
    assert "sys.json describes 1 node(s) of 1 x AMD EPYC 7B13 (512 cores" in problem
    assert "but run_1's ledger recorded 1 node(s) of 1 x AMD EPYC 7B13 (2 cores" in problem
    (problem,) = agreement_problems([_cpu_kind(keras="3.0.0")], header, "run_1", "sys.json")
    assert problem == "sys.json says keras '3.0.0' but run_1's ledger recorded '3.15.1'"
    old = SystemHeader.model_validate({})
    assert "records no measured system" in agreement_problems([_cpu_kind()], old, "run_1", "sys.json")[0]


def test_a_description_is_checked_against_its_own_measurements_and_the_site_rules(tmp_path):
    from aiperf.submission.system_check import description_problems

    description = _description(_cpu_kind())
    path = tmp_path / "system.json"
    path.write_text(json.dumps(description))
    assert description_problems(path, description, "Example-Cluster-CI") == []
    assert description_problems(path, description, "another") == [
        "system_name 'Example Cluster (CI)' does not give the file's name 'another'"
    ]
    edited = {**description, "host_processor_core_count": "512", "division": "premier"}
    path.write_text(json.dumps(edited))
    problems = description_problems(path, edited, "Example-Cluster-CI")
    assert any(p.startswith("the submitter's fields: division: must be 'closed' or 'open'") for p in problems), problems
    edited.pop("division")
    path.write_text(json.dumps(edited))
    problems = description_problems(path, edited, "Example-Cluster-CI")
    assert any("MLCommons' system description checker" in p and "division" in p for p in problems), problems
    edited["division"] = "open"
    path.write_text(json.dumps(edited))
    problems = description_problems(path, edited, "Example-Cluster-CI")
    assert problems == ["host_processor_core_count says '512' but its measured node kinds give '2'"]


# --- hostile packages that once crashed or stalled the check (issue 45, cases 1, 2, 7 and 13) -----


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"sample": float("nan")}, "its sample is not a whole number, got nan"),
        ({"sample": 1e999}, "its sample is not a whole number, got inf"),
        ({"sample": 4.5}, "its sample is not a whole number"),
        ({"sample": True}, "its sample is not a number"),
        ({"sample": "4"}, "its sample is not a number"),
        ({"sample": -1}, "its --sample must be from 0 to 1,000,000"),
        ({"sample": 10**9}, "its --sample must be from 0 to 1,000,000"),
        ({"seed": 2**40}, "its --seed must be from 0"),
        ({"speed_factor": float("inf")}, "its --speed-factor must be a number from 1 to 1,000,000, got inf"),
        ({"speed_factor": 0.5}, "its --speed-factor must be a number from 1"),
    ],
)
def test_a_stored_audit_s_options_out_of_range_are_a_finding_not_a_crash(options, why):
    from aiperf.submission.check import audit_options

    with pytest.raises(AiperfError, match=re.escape(why)):
        audit_options(options)
    assert audit_options({"sample": 2.0, "seed": 7, "speed_factor": 3}) == (2, 7, 3.0)
    assert audit_options({}) == (4, 0, 4.0)  # an audit made with the defaults stores none


@pytest.mark.slow
def test_a_package_over_the_run_bound_audits_nothing(package_dir, tmp_path):
    """The bound on runs is where the checking stops: each run costs an audit (case 7: 120 runs were each
    audited after the finding)."""
    from aiperf.submission.check import check_package

    pkg = copy_package(package_dir, tmp_path)

    def swell(index: dict) -> None:
        entry = index["entries"][0]
        entry["runs"] = entry["runs"] * 30  # 60 runs
        index["entries"].append(dict(entry))  # and 60 more: 120 in all, each entry within its own bound

    edit_json(pkg / PACKAGE_JSON, swell)
    reseal(pkg)
    result = check_package(pkg)
    assert any("120 runs, over the limit of 100" in f.text for f in result.findings)
    assert result.runs == 0 and result.reevaluated == 0  # no run checked, none audited


@pytest.mark.slow
def test_a_run_listed_twice_is_a_finding_and_the_list_goes_on(package_dir, tmp_path):
    """package.json naming one run twice (manifest re-hashed) ended check and list in 'File exists'."""
    pkg = copy_package(package_dir, tmp_path)
    edit_json(pkg / PACKAGE_JSON, lambda p: p["entries"][0]["runs"].append(p["entries"][0]["runs"][0]))
    reseal(pkg)
    rejected_for(pkg, f"run '{ENTRY}/run_1' is listed twice")
    good = tmp_path / "good"
    shutil.copytree(package_dir, good / "pkg", symlinks=True)
    shutil.move(pkg, good / "forged")
    proc = run_cli("list", str(good), "--csv", str(tmp_path / "list.csv"), timeout=900)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    verdicts = sorted(pd.read_csv(tmp_path / "list.csv")["verdict"])
    assert verdicts == ["accepted", "rejected"]


@pytest.mark.slow
def test_sigterm_stops_a_check_with_its_audits_and_its_copy(package_dir, tmp_path):
    """Case 13: SIGTERM during the audit left the temporary copy (weights included) and the audit training."""
    work = tmp_path / "tmp"
    work.mkdir()
    env = {**cli_env(), "TMPDIR": str(work)}
    proc = subprocess.Popen(aiperf_cmd("check", str(package_dir)), env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    audits: list[psutil.Process] = []
    while not audits and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        audits = [p for p in psutil.Process(proc.pid).children(recursive=True) if "audit" in " ".join(_cmdline(p))]
    assert audits, "the check never started an audit"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "terminated (SIGTERM)" in stderr and "Traceback" not in stderr
    assert psutil.wait_procs(audits, timeout=10)[1] == [], "an audit outlived the check"
    assert list(work.iterdir()) == [], "the check's temporary copy is still there"


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.mark.slow
def test_a_log_far_larger_than_its_ledger_gives_is_a_finding_before_it_is_read(package_dir, tmp_path):
    """Case 6: a 200 MB mllog.txt took the check to 1.8 GB parsing it. A log is its ledger's rendering: one
    more than twice that (and a MiB) is refused by its size, neither parsed nor given to the compliance checker."""
    pkg = copy_package(package_dir, tmp_path)
    log = pkg / f"{ENTRY}/run_1/mllog.txt"
    with open(log, "a") as fh:
        fh.write(':::MLLOG {"key": "padding"}\n' * 200_000)  # about 5.6 MB
    reseal(pkg)
    lines = rejected_for(pkg, f"{ENTRY}/run_1/mllog.txt:", "bytes; the log its ledger gives has")
    assert not [line for line in lines if "run_1/mllog.txt" in line and "compliance" in line.lower()]


# --- aiperf list of the real package ------------------------------------------------------------
# Here rather than in test_list.py: xdist hands each file to one worker, and a second worker asking for the
# session's package waited idle (81 s in a measured suite) while this file's worker made it.


@pytest.mark.slow
def test_list_of_a_real_package_through_the_cli(package_dir, tmp_path):
    html_path, csv_path, md_path = tmp_path / "list.html", tmp_path / "list.csv", tmp_path / "list.md"
    proc = run_cli("list", str(package_dir), "--html", str(html_path), "--csv", str(csv_path), "--md", str(md_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("rank") and re.match(r"1\s+smoke\s", lines[1]), proc.stdout
    assert lines[1].rstrip().endswith("accepted") and "1 of 1 row(s) ranked by OPS" in proc.stdout
    frame = pd.read_csv(csv_path)
    assert frame["runs"][0] == 2 and frame["ops_per_s"][0] > 0 and frame["ops_cv"][0] >= 0
    assert 0 < frame["ops_over_ceiling"][0] <= 1
    ready, images, caught, console_errors = page_health(html_path, tmp_path)
    assert ready and caught is None and not console_errors, (caught, console_errors)
    assert images is not None and images[0] == images[1]


@pytest.mark.slow
def test_a_tampered_package_is_listed_below_with_its_finding(package_dir, tmp_path):
    tampered = tmp_path / "tampered"
    shutil.copytree(package_dir, tampered)
    summary_path = next(tampered.glob("results/*/*/run_1/summary.json"))
    data = json.loads(summary_path.read_text())
    data["score"]["ops_per_s"] *= 100
    summary_path.write_text(json.dumps(data))
    table = make_list([package_dir, tampered], "ops")
    lines = table.splitlines()
    assert lines[1].startswith("1 ") and lines[2].startswith("- ") and lines[2].rstrip().endswith("rejected")
    assert re.search(r"rejected: .*summary\.json", table), table
