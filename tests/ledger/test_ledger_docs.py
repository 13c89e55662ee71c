"""docs/ledger.md documents every field a writer can put into a record, under its record type.

The fields come from two places: the record models in ``aiperf/ledger/schema.py`` (which
declare every field the master, resume and the simulator write, including those only real
workers or failures produce: streamed input, bad images, workers that cannot start), and the
records of a real simulated run (so a field a writer starts emitting without declaring it is
caught too).
"""

from __future__ import annotations

import re

from helpers import REPO

from aiperf.ledger.schema import SHAPES, Record, RecordType
from aiperf.ledger.store import read_ledger

DOC = REPO / "docs" / "ledger.md"
COMMON = set(Record.model_fields)


def _sections() -> tuple[set[str], dict[str, set[str]]]:
    """The names in backticks of the common-fields table, and of each record type's paragraph."""
    text = DOC.read_text()
    common = text.split("## Common fields", 1)[1].split("\n## ", 1)[0]
    types = text.split("## Record types", 1)[1].split("\n## ", 1)[0]
    paragraphs: dict[str, set[str]] = {}
    for paragraph in re.split(r"\n\s*\n", types):
        head = re.match(r"`(\w+)`", paragraph.strip())
        if head:
            values = re.sub(r"`\w+`(?=\s*\|)|(?<=\|\s)`\w+`", "", paragraph)  # `seed` | `arch`: values, not fields
            paragraphs.setdefault(head.group(1), set()).update(re.findall(r"`(\w+)`", values))
    return set(re.findall(r"`(\w+)`", common)), paragraphs


def _undocumented(fields: dict[str, set[str]]) -> list[str]:
    common, paragraphs = _sections()
    missing = []
    for rtype, names in sorted(fields.items()):
        for name in sorted(names):
            if name in COMMON:
                if name not in common:
                    missing.append(f"{name} (common field)")
            elif name not in paragraphs.get(rtype, set()):
                missing.append(f"{rtype}.{name}")
    return missing


def test_every_record_type_has_a_paragraph():
    _, paragraphs = _sections()
    assert sorted(set(RecordType) - set(paragraphs)) == []


def test_every_field_a_record_model_declares_is_documented_under_its_type():
    fields = {str(rtype): set(model.model_fields) for rtype, model in SHAPES.items()}
    assert _undocumented(fields) == []


def test_every_field_of_a_simulated_run_is_documented_under_its_type(sim_run):
    fields: dict[str, set[str]] = {}
    for record in read_ledger(sim_run):
        fields.setdefault(record.type, set()).update(record.to_dict())  # the fields as written
    assert set(fields) <= set(RecordType)
    assert _undocumented(fields) == []


def test_the_check_finds_a_field_missing_from_the_docs():
    """The check itself can fail: a field documented under another type does not count."""
    assert _undocumented({"requeue": {"trial", "oom_retries", "seq"}}) == ["requeue.oom_retries"]
