"""The run's ledger: typed records, the hash-chained append-only file, its locks and its inert text.

The ground floor every other part of aiperf reads and writes: :mod:`~aiperf.ledger.schema`
(one model per record type), :mod:`~aiperf.ledger.store` (writer and readers),
:mod:`~aiperf.ledger.files` (whole-file replacement), :mod:`~aiperf.ledger.runlock` (one master
per run directory), :mod:`~aiperf.ledger.audit_file` (the audit's file bound to the ledger) and
:mod:`~aiperf.ledger.inert` (text from a ledger made safe to print), with
:mod:`~aiperf.ledger.json_types` naming what a JSON document read from disk can hold.
"""
