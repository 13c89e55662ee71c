"""``aiperf package RUN... --system system.json -o DIR``: verified, audited runs and their system, in one package.

Everything a list maintainer needs to re-check a result, and nothing else: per run the ledger
and the files derived from it (summary, MLPerf log, telemetry; no report page), the audit, and only the
weights files that audit re-evaluated or re-trained from (``aiperf check`` audits again with the
same sample and seed); the system description; the config the runs share; a SHA-256 manifest.

Refused, with one line and exit 2, before anything is written: a run that does not pass
``aiperf verify``; a run with no ``audit.json``, a failed one, or one of another ledger; runs of
one workload whose configs differ (beyond the seed, results folder and cluster address) or that
share a seed; a description that fails its own checks or that does not describe the machine a
run's ledger recorded; a package over its bounds (docs/submission.md); an output that exists.

A run without an audit is refused rather than audited here: an audit re-executes training (it
loads the dataset and a framework, minutes to hours on the official workload) with options the
submitter should choose (``--sample``, ``--retrain``), and it writes into the run directory,
which packaging only reads. The message says what to run (``aiperf audit RUN``).

The package is written to ``DIR.partial`` and renamed to ``DIR`` once complete, so ``DIR`` is
never half written; ``DIR.tar.gz`` is made from it afterwards the same way (``.partial``, then
renamed). Files are copied -- never linked -- hashed as they are copied.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from aiperf.errors import AiperfError, excerpt, os_error
from aiperf.ledger.inert import inert
from aiperf.ledger.json_types import JSONObject
from aiperf.ledger.schema import WeightsRecord
from aiperf.ledger.store import iter_ledger
from aiperf.submission import layout
from aiperf.submission.layout import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_PACKAGE_BYTES,
    MAX_RUNS,
    OPTIONAL_RUN_FILES,
    PACKAGE_FORMAT,
    REQUIRED_RUN_FILES,
    PackageEntry,
    PackageIndex,
)
from aiperf.submission.manifest import manifest_text
from aiperf.submission.runs import RunFacts, StoredAudit, audited_weights, first_difference, read_audit, read_run

if TYPE_CHECKING:
    from aiperf.submission.system_check import NodeKindDoc

CONFIG_HEADER = (
    "# The config every run of this entry shares, as their ledgers recorded it (run.seed, run.results_dir\n"
    "# and cluster.address are each run's own). aiperf run --config config.yaml --repeat N runs it again.\n"
)


@dataclass(frozen=True)
class Limits:
    """The package's bounds (docs/submission.md); a parameter so tests can set small ones."""

    package_bytes: int = MAX_PACKAGE_BYTES
    file_bytes: int = MAX_FILE_BYTES
    files: int = MAX_FILES
    runs: int = MAX_RUNS


@dataclass
class Plan:
    """What will be written: files to copy (package path -> source), files to create (path -> bytes)."""

    copies: dict[str, tuple[Path, int]] = field(default_factory=dict)
    created: dict[str, bytes] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.copies.values()) + sum(len(b) for b in self.created.values())


def _shown(path: Path | str) -> str:
    text = os.fspath(path)
    return text if text.isprintable() and len(text) <= 300 else excerpt(text, 200)


def _regular_size(path: Path) -> int:
    """The size of a regular file that is not a link; :class:`AiperfError` otherwise."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise AiperfError(f"{_shown(path)}: no such file") from None
    except OSError as exc:
        raise os_error(exc, path, "read") from None
    if stat.S_ISLNK(info.st_mode):
        raise AiperfError(f"{_shown(path)}: a symbolic link; a package holds copies of regular files only")
    if not stat.S_ISREG(info.st_mode):
        raise AiperfError(f"{_shown(path)}: not a regular file")
    return info.st_size


def _output_paths(output: str) -> tuple[Path, Path, Path]:
    target = Path(output)
    name = target.name
    if not layout.is_portable(name):
        raise AiperfError(f"-o {_shown(output)}: the package's name must be a portable name ([A-Za-z0-9._-])")
    partial = target.with_name(f"{name}.partial")
    archive = target.with_name(f"{name}.tar.gz")
    for path in (target, archive):
        if os.path.lexists(path):
            raise AiperfError(f"{_shown(path)} already exists; choose another -o or remove it")
    if os.path.lexists(partial):
        raise AiperfError(f"{_shown(partial)} exists: an earlier aiperf package was interrupted; remove it first")
    if not target.parent.is_dir():
        raise AiperfError(f"-o {_shown(output)}: the folder {_shown(target.parent)} does not exist")
    return target, partial, archive


def _read_description(path: Path) -> tuple[bytes, JSONObject, str]:
    """The description's bytes (copied as they are), its JSON and the package's name for the system."""
    from aiperf.submission.layout import MAX_DESCRIPTION_BYTES, read_bounded

    try:
        raw = read_bounded(path, MAX_DESCRIPTION_BYTES)
        data = json.loads(raw)
    except FileNotFoundError:
        raise AiperfError(f"--system {_shown(path)}: no such file") from None
    except OSError as exc:
        raise AiperfError(f"--system {_shown(path)}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError):
        raise AiperfError(f"--system {_shown(path)}: not valid JSON (write it with aiperf system -o)") from None
    if not isinstance(data, dict) or not isinstance(data.get("system_name"), str):
        raise AiperfError(
            f"--system {_shown(path)}: no system_name: a description of the measured part only; "
            "write it with aiperf system --site site.yaml -o system.json (docs/system.md)"
        )
    system = layout.portable_name(data["system_name"])
    if not system:
        raise AiperfError(f"--system {_shown(path)}: system_name {excerpt(data['system_name'])} has no portable letter")
    return raw, data, system


def _check_description(path: Path, data: JSONObject, system: str) -> list[NodeKindDoc]:
    from aiperf.submission.system_check import description_problems, node_kinds

    problems = description_problems(path, data, system)
    if problems:
        more = f" (and {len(problems) - 1} more: aiperf check lists them all)" if len(problems) > 1 else ""
        raise AiperfError(f"--system {_shown(path)}: {problems[0]}{more}")
    return node_kinds(data)[0]


def _check_run(path: Path, kinds: list[NodeKindDoc], system_path: Path) -> tuple[RunFacts, StoredAudit]:
    """Verified, audited by an audit of this very ledger, and made on the described machine."""
    from aiperf.ledger.runlock import live_holder
    from aiperf.results.verify import verify_run
    from aiperf.submission.system_check import agreement_problems

    if not (path / "ledger.jsonl").is_file():
        raise AiperfError(f"{_shown(path)}: not a run directory (no ledger.jsonl)")
    holder = live_holder(path)
    if holder is not None:
        raise AiperfError(f"{_shown(path)}: the run is still going ({holder.describe()}); package it when it has ended")
    ok, message = verify_run(path)
    if not ok:
        raise AiperfError(f"{_shown(path)}: does not verify ({message.splitlines()[0]}); see aiperf verify {path}")
    run = read_run(path)
    try:
        audit = read_audit(path)
    except AiperfError:
        if not any(isinstance(rec, WeightsRecord) for rec in iter_ledger(path)):
            raise AiperfError(
                f"{_shown(path)}: the run has no audit, and none can be made: no trial completed with its weights"
                f" stored; resume it (aiperf run --resume {path}) or run again with a longer run.time_budget_s"
            ) from None
        raise AiperfError(f"{_shown(path)}: the run has no audit; run aiperf audit {path} first") from None
    problem = audit.problem(run)
    if problem is not None:
        raise AiperfError(f"{_shown(path)}: {problem}; run aiperf audit {path} again")
    for where, header in run.systems():
        problems = agreement_problems(kinds, header, f"{path} ({where})", _shown(system_path))
        if problems:
            raise AiperfError(problems[0])
    return run, audit


def _group(runs: list[tuple[RunFacts, StoredAudit]]) -> dict[str, list[tuple[RunFacts, StoredAudit]]]:
    """Runs by workload, each group of one config and distinct seeds, in order of seed."""
    groups: dict[str, list[tuple[RunFacts, StoredAudit]]] = {}
    ids: dict[str, Path] = {}
    for run, audit in runs:
        if run.run_id in ids:
            raise AiperfError(f"{_shown(run.path)} and {_shown(ids[run.run_id])} are one run ({run.run_id}) twice")
        ids[run.run_id] = run.path
        groups.setdefault(run.workload, []).append((run, audit))
    for workload, members in groups.items():
        first = members[0][0]
        seeds: dict[int | None, Path] = {}
        for run, _ in members:
            difference = first_difference(first.config, run.config)
            if difference is not None:
                raise AiperfError(
                    f"{_shown(run.path)} and {_shown(first.path)} are runs of workload {workload} with different "
                    f"configs ({difference}); an entry holds runs of one config: package them separately"
                )
            if run.seed in seeds:
                raise AiperfError(
                    f"{_shown(run.path)} and {_shown(seeds[run.seed])} have the same seed ({run.seed}): repeated runs "
                    "need distinct seeds (aiperf run --repeat N gives them)"
                )
            seeds[run.seed] = run.path
        members.sort(key=lambda m: (m[0].seed if m[0].seed is not None else -1, m[0].run_id))
    return groups


def _plan(
    groups: dict[str, list[tuple[RunFacts, StoredAudit]]], system: str, description: bytes, limits: Limits
) -> tuple[Plan, PackageIndex]:
    from aiperf import __version__

    plan = Plan()
    plan.created[layout.system_file(system)] = description
    entries = []
    commits = set()
    for workload, members in sorted(groups.items()):
        config = yaml.safe_dump(members[0][0].config, sort_keys=True, allow_unicode=False)
        plan.created[layout.config_file(system, workload)] = (CONFIG_HEADER + config).encode()
        runs = []
        for number, (run, audit) in enumerate(members, 1):
            target = layout.run_dir(system, workload, number)
            runs.append(target)
            commits.add(run.header.system.commit)
            names = [*REQUIRED_RUN_FILES, *(n for n in OPTIONAL_RUN_FILES if os.path.lexists(run.path / n))]
            weights = [w for w in audited_weights(run, audit) if os.path.lexists(run.path / w)]
            for name in [*names, *weights]:
                plan.copies[f"{target}/{name}"] = (run.path / name, _regular_size(run.path / name))
        entries.append(PackageEntry(system, workload, layout.config_file(system, workload), runs))
    index = PackageIndex(
        format=PACKAGE_FORMAT,
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        aiperf_version=__version__,
        commit=commits.pop() if len(commits) == 1 else None,
        entries=entries,
    )
    plan.created[layout.PACKAGE_JSON] = (json.dumps(index.to_dict(), indent=1) + "\n").encode()
    _check_bounds(plan, limits)
    return plan, index


def _check_bounds(plan: Plan, limits: Limits) -> None:
    """The bounds, before a byte is copied (the manifest adds about 100 bytes per file)."""
    for name, (source, size) in plan.copies.items():
        if size > limits.file_bytes:
            raise AiperfError(
                f"{_shown(source)}: {size:,} bytes, over the package's limit of {limits.file_bytes:,} per file ({name})"
            )
    count = len(plan.copies) + len(plan.created) + 1
    if count > limits.files:
        raise AiperfError(f"the package would hold {count:,} files, over its limit of {limits.files:,}")
    total = plan.total_bytes + 100 * count
    if total > limits.package_bytes:
        raise AiperfError(
            f"the package would hold {total:,} bytes, over its limit of {limits.package_bytes:,}; package fewer runs"
        )


def _copy(source: Path, target: Path, size: int) -> str:
    """Copy a regular file (never through a link), fsync it, return its SHA-256; it must not change meanwhile."""
    digest = hashlib.sha256()
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as src, open(target, "xb") as dst:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise AiperfError(f"{_shown(source)}: not a regular file")
        copied = 0
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > size:
                break
            digest.update(chunk)
            dst.write(chunk)
        if copied != size:
            raise AiperfError(f"{_shown(source)}: changed while it was being packaged; package again")
        dst.flush()
        os.fsync(dst.fileno())
    return digest.hexdigest()


def _write(plan: Plan, partial: Path) -> None:
    hashes: dict[str, str] = {}
    for name, data in sorted(plan.created.items()):
        target = partial / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        hashes[name] = hashlib.sha256(data).hexdigest()
    for name, (source, size) in sorted(plan.copies.items()):
        target = partial / name
        target.parent.mkdir(parents=True, exist_ok=True)
        hashes[name] = _copy(source, target, size)
    with open(partial / layout.MANIFEST, "x", encoding="ascii") as fh:
        fh.write(manifest_text(hashes))
        fh.flush()
        os.fsync(fh.fileno())
    for folder in sorted({(partial / n).parent for n in hashes} | {partial}, key=lambda p: -len(p.parts)):
        _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _archive(target: Path, archive: Path, names: list[str], mtime: float) -> None:
    """``DIR.tar.gz`` of the package: regular files only, owner root, mode 0644, one time stamp."""
    partial = archive.with_name(archive.name + ".partial")
    try:
        with tarfile.open(partial, "x:gz") as tar:
            for name in names:
                info = tar.gettarinfo(target / name, arcname=f"{target.name}/{name}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                info.mtime = int(mtime)
                with open(target / name, "rb") as fh:
                    tar.addfile(info, fh)
        with open(partial, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(partial, archive)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def package_command(runs: list[str], system_path: str, output: str, limits: Limits | None = None) -> str:
    """Check, plan, write ``DIR`` (through ``DIR.partial``) and ``DIR.tar.gz``; returns what to print."""
    from aiperf.metrics.workloads import WORKLOADS

    limits = limits or Limits()
    if not runs:
        raise AiperfError("aiperf package: give at least one run directory")
    if len(runs) > limits.runs:
        raise AiperfError(f"aiperf package: {len(runs)} runs; a package holds at most {limits.runs}")
    target, partial, archive = _output_paths(output)
    description, data, system = _read_description(Path(system_path))
    kinds = _check_description(Path(system_path), data, system)
    seen: dict[Path, str] = {}
    checked = []
    for given in runs:
        path = Path(given)
        try:
            real = path.resolve()
        except OSError as exc:
            raise os_error(exc, path, "read") from None
        if real in seen:
            raise AiperfError(f"{_shown(given)} and {_shown(seen[real])} are the same run directory")
        seen[real] = given
        checked.append(_check_run(path, kinds, Path(system_path)))
    groups = _group(checked)
    plan, index = _plan(groups, system, description, limits)
    try:
        partial.mkdir()
    except FileExistsError:
        raise AiperfError(f"{_shown(partial)} exists: another aiperf package is writing it") from None
    except OSError as exc:
        raise os_error(exc, partial, "create", exit_code=1) from None
    try:
        _write(plan, partial)
        os.rename(partial, target)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError):
            raise os_error(exc, exc.filename or partial, "write the package", exit_code=1) from None
        raise
    _fsync_dir(target.parent)
    names = sorted([*plan.created, *plan.copies, layout.MANIFEST])
    try:
        _archive(target, archive, names, datetime.datetime.now().timestamp())
    except OSError as exc:
        raise os_error(exc, archive, "write", f"the package {target} is complete; tar it yourself", 1) from None
    lines = []
    for entry in index.entries:
        workload = WORKLOADS.get(entry.workload)
        lines.append(f"  {inert(entry.system)} / {inert(entry.workload)}: {len(entry.runs)} run(s)")
        if workload is not None and len(entry.runs) < workload.ranked_runs:
            lines.append(
                f"  note: a ranked entry of workload {inert(entry.workload)} needs {workload.ranked_runs} runs; "
                f"aiperf check will say so"
            )
    size = plan.total_bytes / 2**20
    head = (
        f"packaged {len(checked)} run(s) into {inert(target)} ({len(names)} files, {size:.1f} MiB) and {inert(archive)}"
    )
    return "\n".join([head, *lines, f"check it with: aiperf check {inert(target)}"])
