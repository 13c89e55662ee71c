"""``audit.json``: where ``aiperf audit`` writes its result beside a run, how it is bound to the ledger,
and how the report reads it.

The audit itself re-executes training (:mod:`aiperf.engine.audit`); the file's name, its binding
and its reader live here, in the record layer, so the report can show an audit without
importing the engine. A file beside a ledger proves nothing by itself: anyone can write
``{"ok": true}`` with the ledger's last hash. So the audit appends an ``audit`` record to the
ledger after the run's end, holding the SHA-256 of the ``audit.json`` it wrote; the report and
the submission checker show an audit as passed only when the file's hash is the one the ledger
names (:func:`bound_audit`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from aiperf.ledger.json_types import JSONObject
from aiperf.ledger.schema import AuditRecord, Record, RecordType

AUDIT_NAME = "audit.json"
MAX_AUDIT_BYTES = 16 * 2**20  # an audit of every trial of a 12-hour run lists a few thousand checks


def audited_end(raw: Sequence[Mapping[str, object]]) -> tuple[int, object]:
    """The run records' count and the last one's hash: what an audit audits (earlier audits excluded)."""
    ran = [r for r in raw if r.get("type") != RecordType.AUDIT]
    return len(ran), (ran[-1].get("hash") if ran else None)


def write_bound_audit(run_dir: str | Path, payload: bytes, audited_hash: str, ok: bool) -> None:
    """Write ``audit.json`` and append its hash to the ledger, under the run's lock.

    Raises ``OSError`` or :class:`~aiperf.errors.AiperfError` (a run lock held, a full disk);
    the file is written first, so a failure leaves an unbound file the report does not vouch for.
    """
    from aiperf.ledger.files import write_atomic
    from aiperf.ledger.runlock import RunLock
    from aiperf.ledger.store import LedgerWriter, read_raw_ledger

    run_dir = Path(run_dir)
    with RunLock(run_dir).acquire("aiperf audit"):
        write_atomic(run_dir / AUDIT_NAME, payload)
        last = read_raw_ledger(run_dir)[-1]
        # t continues the master's clock as wall does, so verify's clock check holds for the appended record
        # (the ledger verified before an audit binds to it: both are numbers, as their models hold)
        t, wall = cast(float, last.get("t", 0.0)), cast(float, last.get("wall", time.time()))
        offset = float(t) + max(0.0, time.time() - float(wall))
        with LedgerWriter(run_dir, clock_offset=offset) as ledger:
            digest = hashlib.sha256(payload).hexdigest()
            ledger.append(AuditRecord(audited_hash=audited_hash, result_sha256=digest, ok=ok))


@dataclass(frozen=True)
class BoundAudit:
    """``audit.json`` as read, and whether the ledger vouches for it (``bound``; ``why`` when not)."""

    data: JSONObject
    bound: bool
    why: str = ""

    @property
    def passed(self) -> bool:
        return self.bound and self.data.get("ok") is True


def read_audit(run_dir: str | Path) -> JSONObject | None:
    """``audit.json`` of a run, or None when there is none (or it is unreadable): not yet vouched for."""
    found = read_audit_bytes(run_dir)
    return found[0] if found is not None else None


def read_audit_bytes(run_dir: str | Path) -> tuple[JSONObject, bytes] | None:
    """``audit.json`` of a run and its bytes, or None when there is none (or it is unreadable)."""
    from aiperf.ledger.files import read_regular

    try:
        raw = read_regular(Path(run_dir) / AUDIT_NAME, MAX_AUDIT_BYTES)
        if len(raw) > MAX_AUDIT_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return (data, raw) if isinstance(data, dict) else None


def binding(raw: bytes, records: list[Record]) -> tuple[bool, str]:
    """Whether the ledger's latest audit record names these bytes and audited the run's last record."""
    audits = [r for r in records if isinstance(r, AuditRecord)]
    if not audits:
        return False, "the ledger holds no audit record: audit.json was not written by `aiperf audit` on this ledger"
    latest = audits[-1]
    if hashlib.sha256(raw).hexdigest() != latest.result_sha256:
        return False, f"audit.json is not the file the ledger's audit record (seq {latest.seq}) names: it was changed"
    ran = [r for r in records if not isinstance(r, AuditRecord)]
    if not ran or ran[-1].hash != latest.audited_hash:
        return False, "the ledger's audit record audited another state of the ledger"
    return True, ""


def bound_audit(run_dir: str | Path, records: list[Record]) -> BoundAudit | None:
    """The run's audit as the report shows it, or None when there is no readable ``audit.json``."""
    found = read_audit_bytes(run_dir)
    if found is None:
        return None
    data, raw = found
    bound, why = binding(raw, records)
    return BoundAudit(data, bound, why)
