"""``aiperf check DIR``: every check a list maintainer needs before ranking a package, all findings at once.

A finding rejects the package; a note does not. The checks, in order (docs/submission.md):

1. the files: no symbolic link, FIFO or device, portable names, nesting, count and size within
   the bounds (:mod:`.tree`), nothing outside the layout, nothing the layout needs missing;
2. the manifest: every file listed with its SHA-256, none listed that is missing (:mod:`.manifest`);
3. each system description: MLCommons' checker, the submitter's fields and allowed values, and
   the measured fields derived again from its node kinds (:mod:`.system_check`);
4. each run: ``aiperf verify`` (chain, bookkeeping, consistency, FLOPs, score, rules), its stored
   audit of this very ledger, the audit done again here in a copy of the run (stored weights
   re-evaluated with the audit's own sample and seed; ``--retrain K`` re-trains K trials), the
   workload's rules (an invalid run, or one under custom rules, is a finding; a valid run that is
   not official is a note: the list shows it as unofficial), its config against the entry's,
   its ledger's system against the description, and its MLPerf log against MLCommons'
   compliance checker and against the log its ledger gives;
5. each entry: the runs' seeds and run ids distinct, and at least the workload's ``ranked_runs``.

The audits of step 4 are done again last, and only when no other check found anything: they are
the one costly check, and no retraining accepts a package that is rejected already.

Input that is no package at all (not a folder, no or unreadable ``package.json``) raises
:class:`~aiperf.errors.AiperfError` (exit 2); anything wrong inside a package is a finding (exit 1).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from aiperf.errors import AiperfError, excerpt, first_line
from aiperf.ledger.inert import inert
from aiperf.ledger.json_types import JSONObject
from aiperf.submission import layout
from aiperf.submission.layout import PackageEntry, PackageIndex, read_package_json
from aiperf.submission.ranking import finite_number
from aiperf.submission.runs import RunFacts, StoredAudit

if TYPE_CHECKING:
    from aiperf.submission.system_check import NodeKindDoc

MAX_CONFIG_BYTES = 64 * 1024  # as aiperf run reads a config file


@dataclass(frozen=True)
class Finding:
    """One problem: ``text`` is a one-liner naming the file or run and what is wrong; ``check`` which check found it."""

    text: str
    check: str = ""


@dataclass
class CheckResult:
    """What ``aiperf check`` found; ``accepted`` when there are no findings (notes do not count)."""

    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    index: PackageIndex | None = None
    runs: int = 0
    reevaluated: int = 0
    retrained: int = 0

    @property
    def accepted(self) -> bool:
        return not self.findings

    def add(self, check: str, text: str) -> None:
        self.findings.append(Finding(one_line(text), check))

    def format(self, package: Path) -> str:
        """The verdict line, then one line per finding, then the notes."""
        index = self.index
        systems = len(index.system_names()) if index else 0
        entries = len(index.entries) if index else 0
        counts = f"{systems} system(s), {entries} entr{'y' if entries == 1 else 'ies'}, {self.runs} run(s)"
        if self.accepted:
            head = f"accepted: {inert(package)}: {counts}; {self.reevaluated} trial(s) re-evaluated from stored weights"
            head += f", {self.retrained} re-trained" if self.retrained else ""
        else:
            head = f"rejected: {inert(package)}: {len(self.findings)} finding(s) ({counts})"
        lines = [head, *(f"  {inert(f.text)}" for f in self.findings), *(f"  note: {inert(n)}" for n in self.notes)]
        return "\n".join(lines)


def check_package(path: Path, *, retrain: int = 0, sample: int | None = None) -> CheckResult:
    """Check the package at ``path``; raises ``AiperfError`` (exit 2) when it cannot be read as a package at all.

    ``retrain``: trials per run to re-train (``aiperf audit --retrain``); ``sample``: trials to
    re-evaluate besides the best (default: as many as the stored audit did, with its seed).
    """
    path = Path(path)
    try:
        is_dir = path.is_dir()
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read ({exc.strerror})") from None
    if not is_dir:
        what = "a .tar.gz: extract it first (tar xzf)" if path.name.endswith(".tar.gz") else "not a folder"
        raise AiperfError(f"{path}: {what}; an aiperf package is a folder with a package.json")
    result = CheckResult(index=read_package_json(path))
    with tempfile.TemporaryDirectory(prefix="aiperf-check-") as work:
        _Checker(path, result, Path(work), retrain, sample).run()
    return result


class _AuditCheck(TypedDict, total=False):
    """One check of ``audit.json``'s ``trials`` (:class:`aiperf.engine.audit.TrialCheck`), as far as it is read here."""

    check: str
    status: str


class _AuditAgain(TypedDict, total=False):
    """What ``check`` reads of the ``audit.json`` its own ``aiperf audit`` of a run wrote (aiperf.engine.audit)."""

    notes: list[str]
    trials: list[_AuditCheck]
    problems: list[str]


def audit_options(options: Mapping[str, object]) -> tuple[int, int, float]:
    """A stored audit's (sample, seed, speed factor), each within its flag's range; AiperfError naming the first
    that is not (a forged ``"sample": NaN`` or ``1e999`` once ended the check in an unexpected error)."""
    from aiperf.cli_limits import AUDIT_SAMPLE, AUDIT_SEED, SPEED_FACTOR

    values: list[int | float] = []
    for name, default, limit in (("sample", 4, AUDIT_SAMPLE), ("seed", 0, AUDIT_SEED), ("speed_factor", 4.0, None)):
        value = options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AiperfError(f"its {name} is not a number, got {excerpt(value)}")
        if limit is None:
            values.append(SPEED_FACTOR.check(float(value), "its "))
        elif isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise AiperfError(f"its {name} is not a whole number, got {excerpt(value)}")
        else:
            values.append(limit.check(int(value), "its "))
    sample, seed, speed = values
    return int(sample), int(seed), float(speed)


def declared_peak_problems(efficiency: object) -> list[str]:
    """A site file's declared peak below what its devices were measured doing, or not a positive number.

    A table or formula Rpeak below the measured ceiling is a note (turbo clocks beat the formula);
    a declared one is the submitter's own figure, and a list ranking OPS over Rpeak would rank a
    0.001 FLOP/s declaration first (issue 45, case 9).
    """
    devices = efficiency.get("by_device") if isinstance(efficiency, dict) else None
    problems = []
    for d in devices if isinstance(devices, list) else []:
        if not isinstance(d, dict) or d.get("rpeak_source") != "declared":
            continue
        rpeak, ceiling = finite_number(d.get("rpeak_flops")), finite_number(d.get("ceiling_flops"))
        name = excerpt(d.get("device"))
        if rpeak is None or rpeak <= 0:
            problems.append(f"the declared peak of {name} is not a positive number ({excerpt(d.get('rpeak_flops'))})")
        elif ceiling is not None and ceiling > rpeak:
            problems.append(
                f"the declared peak of {name}, {rpeak:.4g} FLOP/s, is below its measured ceiling of"
                f" {ceiling:.4g} FLOP/s: a peak is at least what the device was measured doing"
            )
    return problems


def run_in_session(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command``'s output and exit code; it runs in a session of its own, killed whole should the check stop.

    An audit starts processes of its own; a check stopped by Ctrl-C or SIGTERM kills them all
    (and removes its temporary copy of the runs) instead of leaving them training.
    """
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


class _Checker:
    def __init__(self, package: Path, result: CheckResult, work: Path, retrain: int, sample: int | None) -> None:
        assert result.index is not None
        self.package = package
        self.index: PackageIndex = result.index
        self.result = result
        self.work = work
        self.retrain = retrain
        self.sample = sample
        self.files: dict[str, int] = {}
        self.unsafe: set[str] = set()
        self.kinds: dict[str, list[NodeKindDoc]] = {}
        self.mllog_config: Path | None = None
        self.run_ids: dict[str, str] = {}
        self.checked: set[str] = set()  # runs checked so far: a run listed twice is checked (and audited) once
        # (run, folder, the stored audit's sample, seed and speed factor): done again last, if nothing was found
        self.audits: list[tuple[str, Path, tuple[int, int, float]]] = []

    def add(self, check: str, text: str) -> None:
        self.result.add(check, text)

    def run(self) -> None:
        from aiperf.submission.manifest import compare_manifest, read_manifest
        from aiperf.submission.tree import walk

        tree = walk(self.package)
        for problem in tree.problems:
            self.add("files", problem)
        self.files = tree.files
        self.unsafe = tree.unsafe
        manifest = read_manifest(self.package)
        for problem in manifest.problems:
            self.add("manifest", problem)
        if layout.MANIFEST in self.files:
            for problem in compare_manifest(self.package, manifest, self.files):
                self.add("manifest", problem)
        self._layout()
        for system in self.index.system_names():
            self._system(system)
        if not self.index.entries:
            self.add("layout", f"{layout.PACKAGE_JSON}: no entries: the package holds no run")
        if sum(len(entry.runs) for entry in self.index.entries) > layout.MAX_RUNS:
            return  # a finding already: no run is audited past the bound (each costs an audit)
        for entry in self.index.entries:
            self._entry(entry)
        self._audits_again()

    def _audits_again(self) -> None:
        """The stored audits done again, the last and only costly check: retraining cannot accept a package
        another check rejects, so a rejected one is told so at once instead of after every run's audit."""
        if self.result.findings and self.audits:
            self.note(
                f"{len(self.audits)} run(s) not audited again: the findings above reject the package already;"
                " the audits are done again once every other check passes"
            )
            return
        for run, path, options in self.audits:
            self._audit_again(run, path, *options)

    # --- the layout ---------------------------------------------------------------------------

    def _expected(self) -> tuple[set[str], set[str]]:
        """(files the layout requires, run folders whose weights/ may hold weights files)."""
        required = {layout.PACKAGE_JSON, layout.MANIFEST}
        runs = set()
        for entry in self.index.entries:
            required.add(layout.system_file(entry.system))
            required.add(entry.config)
            for run in entry.runs:
                runs.add(run)
                required.update(f"{run}/{name}" for name in layout.REQUIRED_RUN_FILES)
        return required, runs

    def _layout(self) -> None:
        seen: set[tuple[str, str]] = set()
        total = 0
        for k, entry in enumerate(self.index.entries):
            where = f"{layout.PACKAGE_JSON} entry {k + 1}"
            total += len(entry.runs)
            for what, name in (("system", entry.system), ("workload", entry.workload)):
                if not layout.is_portable(name):
                    self.add("layout", f"{where}: {what} {excerpt(name)} is not a portable name")
            if (entry.system, entry.workload) in seen:
                self.add("layout", f"{where}: a second entry for {entry.system} / {entry.workload}")
            seen.add((entry.system, entry.workload))
            if entry.config != layout.config_file(entry.system, entry.workload):
                expected = layout.config_file(entry.system, entry.workload)
                self.add("layout", f"{where}: config {excerpt(entry.config)} is not {expected}")
            wanted = [layout.run_dir(entry.system, entry.workload, i) for i in range(1, len(entry.runs) + 1)]
            if entry.runs != wanted:
                self.add("layout", f"{where}: runs {excerpt(', '.join(entry.runs), 120)} are not {', '.join(wanted)}")
            if not entry.runs:
                self.add("layout", f"{where}: no runs")
        if total > layout.MAX_RUNS:
            self.add("layout", f"{layout.PACKAGE_JSON}: {total} runs, over the limit of {layout.MAX_RUNS}")
        required, runs = self._expected()
        optional = {f"{run}/{name}" for run in runs for name in layout.OPTIONAL_RUN_FILES}
        for name in sorted(required - set(self.files)):
            if layout.inside(self.package, name) is not None and name != layout.MANIFEST:
                self.add("layout", f"{name}: missing from the package")
        for name in sorted(set(self.files) - required - optional):
            folder, _, file = name.rpartition("/")
            if file == layout.REPORT_PAGE and folder in runs:
                self.add("layout", f"{name}: a package holds no report page; `aiperf report` makes it from the ledger")
                continue
            weights = folder.endswith(f"/{layout.WEIGHTS_DIR}") and folder.rpartition("/")[0] in runs
            if not (weights and file.endswith(".npz")):
                self.add("layout", f"{name}: not part of the package layout (docs/submission.md)")

    def _read(self, name: str, limit: int) -> bytes | None:
        """A file of the package the walk found regular, or None (its absence is already a finding)."""
        path = layout.inside(self.package, name)
        if path is None or name not in self.files:
            return None
        try:
            return layout.read_bounded(path, limit)
        except OSError as exc:
            self.add("files", f"{name}: cannot be read ({exc.strerror or exc})")
            return None

    # --- systems ------------------------------------------------------------------------------

    def _system(self, system: str) -> None:
        from aiperf.submission.system_check import description_problems, node_kinds

        name = layout.system_file(system)
        raw = self._read(name, layout.MAX_DESCRIPTION_BYTES)
        if raw is None:
            return
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            self.add("system", f"{name}: not valid JSON")
            return
        for problem in description_problems(self.package / name, data, system):
            self.add("system", f"{name}: {problem}")
        if isinstance(data, dict):
            self.kinds[system] = node_kinds(data)[0]

    # --- entries ------------------------------------------------------------------------------

    def _entry(self, entry: PackageEntry) -> None:
        from aiperf.metrics.workloads import WORKLOADS

        config = self._config(entry)
        facts: list[tuple[str, RunFacts]] = []
        for run in entry.runs:
            if run in self.checked:
                self.add("layout", f"{layout.PACKAGE_JSON}: run {excerpt(run)} is listed twice (checked once)")
                continue
            self.checked.add(run)
            path = layout.inside(self.package, run)
            if path is None or not any(name.startswith(f"{run}/") for name in self.files):
                if path is None:
                    self.add("layout", f"{layout.PACKAGE_JSON}: run {excerpt(run)} is not a path inside the package")
                continue
            self.result.runs += 1
            got = self._run(entry, run, path, config)
            if got is not None:
                facts.append((run, got))
        seeds: dict[object, str] = {}
        for run, fact in facts:
            if fact.seed in seeds:
                self.add(
                    "seeds", f"{run}: seed {fact.seed} is also {seeds[fact.seed]}'s: repeated runs need distinct seeds"
                )
            else:
                seeds[fact.seed] = run
            if fact.run_id in self.run_ids:
                self.add(
                    "seeds", f"{run}: run {fact.run_id} is also {self.run_ids[fact.run_id]}: one run packaged twice"
                )
            else:
                self.run_ids[fact.run_id] = run
        workload = WORKLOADS.get(entry.workload)
        if workload is not None and len(entry.runs) < workload.ranked_runs:
            self.add(
                "runs",
                f"{layout.entry_dir(entry.system, entry.workload)}: {len(entry.runs)} run(s); a ranked entry of "
                f"workload {entry.workload} needs {workload.ranked_runs} runs of its config (distinct seeds)",
            )

    def _config(self, entry: PackageEntry) -> dict[str, object] | None:
        from aiperf.config import parse_yaml

        raw = self._read(entry.config, MAX_CONFIG_BYTES)
        if raw is None:
            return None
        try:
            data = parse_yaml(raw.decode("utf-8"))
        except Exception as exc:  # YAML errors, refused anchors, bad UTF-8: all mean "not a config"
            self.add("config", f"{entry.config}: not a readable config ({first_line(exc)})")
            return None
        if not isinstance(data, dict):
            self.add("config", f"{entry.config}: not a mapping of config sections")
            return None
        return data

    # --- runs ---------------------------------------------------------------------------------

    def _run(self, entry: PackageEntry, run: str, path: Path, config: dict[str, object] | None) -> RunFacts | None:
        from aiperf.results.verify import verify_run
        from aiperf.submission.runs import first_difference, read_run

        if f"{run}/ledger.jsonl" not in self.files:
            return None  # a layout finding already
        if any(name.startswith(f"{run}/") for name in self.unsafe):
            # verify and the audit open the run's files by name; a link among them could point anywhere
            self.note(f"{run}: not verified or audited: it holds a link or special file (a finding above)")
            return None
        try:
            verified, message = verify_run(path)
        except AiperfError as exc:
            self.add("verify", f"{run}: the ledger cannot be read ({exc})")
            return None
        if not verified:
            for line in message.splitlines():
                line = line.strip().removeprefix("verify failed: ").removeprefix("also: ")
                if line and not line.startswith("note:"):
                    self.add("verify", f"{run}: does not verify: {line}")
        try:
            facts = read_run(path)
        except AiperfError:
            return None  # a record of the wrong shape: verify has named it
        if facts.workload != entry.workload:
            self.add("config", f"{run}: a run of workload {facts.workload}, in the entry of {entry.workload}")
        if config is not None:
            difference = first_difference(config, facts.config)
            if difference is not None:
                self.add("config", f"{run}: its ledger's config differs from {entry.config} ({difference})")
        kinds = self.kinds.get(entry.system)
        if kinds:
            from aiperf.submission.system_check import agreement_problems

            for where, header in facts.systems():
                for problem in agreement_problems(kinds, header, f"{run} ({where})", layout.system_file(entry.system)):
                    self.add("system", problem)
        self._mllog(run, path, facts)
        if verified:
            self._verdict(run, path)
        audited = self._stored_audit(run, path, facts)
        if verified and audited is not None:
            try:
                options = audit_options(audited.options)
            except AiperfError as exc:
                self.add("audit", f"{run}/audit.json: {exc}")
            else:
                self.audits.append((run, path, options))
        return facts

    def _verdict(self, run: str, path: Path) -> None:
        """The rules, read from the summary ``aiperf verify`` has just recomputed and compared."""
        raw = self._read(f"{run}/summary.json", 16 * 2**20)
        try:
            summary = json.loads(raw or b"")
            verdict = summary["verdict"]
            headline = str(verdict.get("headline", ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.add("rules", f"{run}/summary.json: no verdict")
            return
        for problem in declared_peak_problems(summary.get("efficiency")):
            self.add("system", f"{run}: {problem}")
        if verdict.get("valid") is not True:
            self.add("rules", f"{run}: not valid: {headline}")
        elif verdict.get("comparable") is not True:
            self.add("rules", f"{run}: {headline}: a list ranks runs of a workload under its own rules only")
        elif verdict.get("official") is not True:
            self.note(f"{run}: not official: {headline}")

    def note(self, text: str) -> None:
        self.result.notes.append(one_line(text))

    def _stored_audit(self, run: str, path: Path, facts: RunFacts) -> StoredAudit | None:
        from aiperf.submission.runs import read_audit

        if f"{run}/audit.json" not in self.files:
            return None
        try:
            audit = read_audit(path)
        except AiperfError as exc:
            self.add("audit", f"{run}: {exc}")
            return None
        problem = audit.problem(facts)
        if problem is not None:
            self.add("audit", f"{run}: {problem}")
            return None
        return audit

    def _audit_again(self, run: str, path: Path, sample: int, seed: int, speed: float) -> None:
        """``aiperf audit`` in a copy of the run (it writes audit.json beside the ledger), in a process of its own.

        A process of its own: each run binds its own Keras backend, and a framework that fails
        natively cannot take the checker down with it.
        """
        copy = self.work / "runs" / run.replace("/", "__")
        copy.mkdir(parents=True)
        for name in sorted(self.files):
            if name.startswith(f"{run}/") and not name.endswith("/audit.json"):
                target = copy / name[len(run) + 1 :]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path / name[len(run) + 1 :], target, follow_symlinks=False)
        sample = self.sample if self.sample is not None else sample
        command = [sys.executable, "-m", "aiperf.cli", "audit", str(copy), "--sample", str(sample)]
        command += ["--seed", str(seed), "--retrain", str(self.retrain), "--speed-factor", str(speed)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
        )
        proc = run_in_session(command, env)
        again: _AuditAgain = {}
        with contextlib.suppress(OSError, ValueError):
            again = json.loads((copy / "audit.json").read_text())
        for note in again.get("notes") or []:
            self.note(f"{run}: audit: {note}")
        if proc.returncode == 0:
            trials = again.get("trials") or []
            for check, attribute in (("reevaluate", "reevaluated"), ("retrain", "retrained")):
                passed = sum(1 for t in trials if t.get("check") == check and t.get("status") == "pass")
                setattr(self.result, attribute, getattr(self.result, attribute) + passed)
            return
        problems = again.get("problems") if proc.returncode == 1 else None
        if isinstance(problems, list) and problems:
            for problem in problems:
                self.add("audit", f"{run}: audited again here: {problem}")
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            reason = tail[-1] if tail else f"exit code {proc.returncode}"
            self.add("audit", f"{run}: cannot be audited here: {reason.removeprefix('aiperf: error: ')}")

    def _mllog(self, run: str, path: Path, facts: RunFacts) -> None:
        """MLCommons' compliance checker on the log, and the log against the one its ledger gives."""
        from aiperf.results.mllog import MLLOG_NAME, parse, render, write_checker_config
        from aiperf.submission.mlcommons import compliance_problems

        name = f"{run}/{MLLOG_NAME}"
        if name not in self.files:
            return
        try:
            lines = render(facts.records)
        except Exception as exc:  # a ledger that verify rejects may not render; that is verify's finding
            self.note(f"{name}: not compared with its ledger ({first_line(exc)})")
            return
        # The log is the ledger's rendering: one much larger is a finding before it is read or parsed
        # (a 200 MB log once took the check to 1.8 GB), so the memory it costs is the ledger's.
        size = sum(len(line.encode()) + 1 for line in lines)
        bound = 2 * size + 2**20
        if self.files[name] > bound:
            self.add("mllog", f"{name}: {self.files[name]:,} bytes; the log its ledger gives has {size:,}")
            return
        if self.mllog_config is None:
            self.mllog_config = write_checker_config(self.work / "mllog-checker")
        for problem in compliance_problems(path / MLLOG_NAME, self.mllog_config):
            self.add("mllog", f"{name}: {problem}")
        raw = self._read(name, bound)
        if raw is None:
            return
        expected = [_comparable(parse(line)) for line in lines]
        actual = [_comparable(parse(line)) for line in raw.decode("utf-8", "replace").splitlines()]
        for k, (got, want) in enumerate(zip(actual, expected, strict=False)):
            if got != want:
                key = excerpt((want or {}).get("key"))
                self.add("mllog", f"{name}: line {k + 1} is not the line its ledger gives (expected key {key})")
                return
        if len(actual) != len(expected):
            self.add("mllog", f"{name}: {len(actual)} lines; its ledger gives {len(expected)}")


def one_line(text: str, limit: int = 600) -> str:
    """A finding as one printable line: a package's strings may hold newlines or terminal escapes."""
    text = " ".join(text.split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _comparable(line: JSONObject | None) -> JSONObject | None:
    """An MLPerf log line without the logger's call site (``file``, ``lineno``: another aiperf version moves them)."""
    if line is None:
        return None
    metadata = line.get("metadata")
    if isinstance(metadata, dict):
        line = {**line, "metadata": {k: v for k, v in metadata.items() if k not in ("file", "lineno")}}
    return line
