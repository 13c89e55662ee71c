"""The types of JSON as Python's ``json`` module reads and writes it.

Ledger lines, ``summary.json``, ``audit.json`` and a submission's files are read as JSON before
anything checks their shape: these name what such a value can be, so a reader narrows it
(``isinstance``) before it indexes into it instead of trusting it blindly.
"""

from __future__ import annotations

# What ``json.loads`` returns: a document of any shape. Recursive: a list or object holds more of the same.
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
# A JSON object: a ledger record, an audit file, a summary read back from disk.
JSONObject = dict[str, JSONValue]
