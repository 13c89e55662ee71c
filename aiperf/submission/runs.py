"""What a package needs to know about one run, read the same way by ``aiperf package`` and ``aiperf check``.

A run belongs in an entry by its workload and its config; the config is compared as the ledger
recorded it (``run_start.config``, under the chain), not as a file beside the run claims it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from aiperf.errors import AiperfError, excerpt, first_line
from aiperf.ledger.audit_file import AUDIT_NAME, MAX_AUDIT_BYTES, audited_end, binding
from aiperf.ledger.json_types import JSONObject
from aiperf.ledger.schema import Record, ResumeRecord, RunStartRecord, SystemHeader, TrialStartRecord, WeightsRecord
from aiperf.ledger.store import LEDGER_NAME, read_raw_ledger
from aiperf.submission.layout import WEIGHTS_DIR, portable_name, read_bounded

# Settings that differ between runs of one config without changing what is measured: the seed (each
# run of a series has its own), where results go, and the address of a Ray cluster (each job's own).
PER_RUN_SETTINGS = (("run", "seed"), ("run", "results_dir"), ("cluster", "address"))


@dataclass
class RunFacts:
    """A run's ledger read once: its header, records, identity and the config its entry compares."""

    path: Path
    raw: list[JSONObject]
    records: list[Record]
    header: RunStartRecord

    @property
    def run_id(self) -> str:
        return self.header.run_id

    @property
    def seed(self) -> int | None:
        return self.header.config.run.seed

    @property
    def last_hash(self) -> object:
        return self.raw[-1].get("hash")

    @property
    def config(self) -> JSONObject:
        """The run's config as its ledger recorded it, less :data:`PER_RUN_SETTINGS`."""
        config = self.raw[0].get("config")
        return shared_config(config if isinstance(config, dict) else {})

    @property
    def workload(self) -> str:
        """The built-in workload it is (``smoke``), else its ``run.name`` as a portable name."""
        from aiperf.metrics.workloads import identify

        name = identify(self.header).workload
        return name if name is not None else portable_name(str(self.header.config.run.name or "custom")) or "custom"

    def systems(self) -> list[tuple[str, SystemHeader]]:
        """Every system header the ledger holds: the run's start and each resumed session's."""
        out = [("run_start", self.header.system)]
        out += [(f"resume (seq {r.seq})", r.system) for r in self.records if isinstance(r, ResumeRecord)]
        return out


def read_run(path: Path) -> RunFacts:
    """Read a run's ledger (shapes checked); :class:`AiperfError` when it cannot be read as one."""
    from aiperf.ledger.schema import of_type, parse_records

    raw = read_raw_ledger(path)
    records = parse_records(raw, path / LEDGER_NAME)
    return RunFacts(path, raw, records, of_type(records, RunStartRecord)[0])


def shared_config(config: JSONObject) -> JSONObject:
    """``config`` without the settings each run of a series has its own of."""
    out = copy.deepcopy(config)
    for section, key in PER_RUN_SETTINGS:
        part = out.get(section)
        if isinstance(part, dict):
            part.pop(key, None)
    return out


def first_difference(a: object, b: object, path: str = "") -> str | None:
    """The first dotted key where two configs differ, with both values, or None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return f"{where} is set in only one of them"
            found = first_difference(a[key], b[key], where)
            if found is not None:
                return found
        return None
    if a != b or type(a) is not type(b):
        return f"{path or 'the config'}: {excerpt(a)} against {excerpt(b)}"
    return None


@dataclass(frozen=True)
class StoredAudit:
    """``audit.json`` as ``aiperf audit`` left it beside the run."""

    data: JSONObject
    raw: bytes = b""  # the file's bytes, which the ledger's audit record must name

    @property
    def options(self) -> JSONObject:
        options = self.data.get("options")
        return options if isinstance(options, dict) else {}

    def problem(self, run: RunFacts) -> str | None:
        """Why this audit does not vouch for ``run`` (failed, or of another ledger), or None."""
        recorded = self.data.get("ledger")
        ledger: JSONObject = recorded if isinstance(recorded, dict) else {}
        if self.data.get("ok") is not True:
            message = self.data.get("message")
            return f"its audit failed ({excerpt(message, 200) if message else 'no message'})"
        count, last_hash = audited_end(run.raw)
        if self.data.get("run_id") != run.run_id or ledger.get("last_hash") != last_hash:
            return "its audit.json is of another ledger (the run changed after it was audited, or it was copied in)"
        if ledger.get("records") != count:
            return f"its audit.json saw {excerpt(ledger.get('records'))} ledger records, the run has {count}"
        bound, why = binding(self.raw, run.records)
        if not bound:
            return f"its audit is not vouched for by the ledger: {why}"
        return None

    def trials(self) -> list[JSONObject]:
        trials = self.data.get("trials")
        return [t for t in trials if isinstance(t, dict)] if isinstance(trials, list) else []


def read_audit(path: Path) -> StoredAudit:
    """``RUN/audit.json``; :class:`AiperfError` when there is none or it is not a JSON object."""
    file = path / AUDIT_NAME
    try:
        raw = read_bounded(file, MAX_AUDIT_BYTES)
        data = json.loads(raw)
    except FileNotFoundError:
        raise AiperfError(f"{file}: no such file") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise AiperfError(f"{file}: cannot be read as an audit ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise AiperfError(f"{file}: not a JSON object")
    return StoredAudit(data, raw)


def audited_weights(run: RunFacts, audit: StoredAudit) -> list[str]:
    """The weights files (``weights/<trial>.npz``) the audit used: its re-evaluated and re-trained trials,
    and the parents the re-trained ones inherited from. ``aiperf check`` audits again with the same
    sample and seed, so it asks for exactly these; the others stay out of the package."""
    used = {str(t.get("trial")) for t in audit.trials() if t.get("status") != "skipped"}
    retrained = {str(t.get("trial")) for t in audit.trials() if t.get("check") == "retrain"}
    for rec in run.records:
        if isinstance(rec, TrialStartRecord) and rec.trial in retrained and rec.inherit:
            used.add(rec.inherit)
    files = {
        rec.trial: rec.file
        for rec in run.records
        if isinstance(rec, WeightsRecord) and rec.trial in used and rec.file == f"{WEIGHTS_DIR}/{rec.trial}.npz"
    }
    return sorted(files.values())
