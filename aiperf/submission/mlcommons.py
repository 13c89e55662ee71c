"""MLCommons' own checkers, run in-process on a package's files, their verdicts as one-line problems.

Both report through the root logger only (and the compliance checker evaluates its rules'
Python expressions from the rule files, which are MLCommons' and aiperf's, never the package's).
Running them in this process costs milliseconds where a subprocess per file costs a Python start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from textwrap import shorten

from aiperf.errors import first_line

SYSTEM_RULESET = ("training", "4.0.0")  # as tests/system/test_description.py runs the description checker


@contextmanager
def captured_log() -> Iterator[list[str]]:
    """Collect what the checkers log at WARNING and above (and keep it off the terminal)."""
    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage().strip())

    handler = _Collect(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield lines
    finally:
        root.removeHandler(handler)


def system_description_problems(path: Path) -> list[str]:
    """MLCommons' system description checker on ``path``; its reasons, or [] when it passes."""
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

    with captured_log() as lines:
        try:
            valid, *_ = check_system_desc(str(path), *SYSTEM_RULESET)
        except Exception as exc:  # the checker assumes a well-formed file; a broken one can raise anything
            return [f"MLCommons' system description checker could not read it ({first_line(exc)})"]
    if valid:
        return []
    reason = "; ".join(line for line in lines if line) or "it failed"
    return [f"MLCommons' system description checker ({' '.join(SYSTEM_RULESET)}): {shorten(reason, 400)}"]


def compliance_problems(log: Path, config: Path) -> list[str]:
    """MLCommons' compliance checker (HPC 3.0.0, aiperf registered as an open benchmark) on ``log``.

    ``config``: :func:`aiperf.results.mllog.write_checker_config`'s file, written once per check.
    """
    from mlperf_logging.compliance_checker import mlp_compliance

    from aiperf.results.mllog import CHECKER_RULESET, CHECKER_USAGE

    checker = mlp_compliance.make_checker(CHECKER_USAGE, CHECKER_RULESET, False, False)
    with captured_log() as lines:
        try:
            valid = checker.check_file(str(log), str(config))
        except Exception as exc:  # CCError, or a rule that cannot be evaluated on a malformed line
            return [f"MLCommons' compliance checker stopped: {first_line(exc)}"]
    if valid:
        return []
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    text = "; ".join(" ".join(str(m).split()) for m in messages) or "; ".join(lines) or "it failed"
    return [f"MLCommons' compliance checker ({CHECKER_USAGE} {CHECKER_RULESET}) failed: {shorten(text, 400)}"]
