"""``audit.json``: where ``aiperf audit`` writes its result beside a run, and how the report reads it.

The audit itself re-executes training (:mod:`aiperf.engine.audit`); the file's name and reader
live here, in the record layer, so the report can show an audit without importing the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AUDIT_NAME = "audit.json"


def read_audit(run_dir: str | Path) -> dict[str, Any] | None:
    """``audit.json`` of a run for the report, or None when there is none (or it is unreadable)."""
    from aiperf.record.files import read_regular

    try:
        raw = read_regular(Path(run_dir) / AUDIT_NAME, 4 * 1024 * 1024)
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
