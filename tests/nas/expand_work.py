"""Work for expansion processes in tests: a result large enough that sending it takes a while."""

from __future__ import annotations

import os
from pathlib import Path

RESULT_BYTES = 300_000_000


def large_result_after_a_mark(graph, kernel, seed, limits, ceiling):
    """Writes a mark file named by the seed's environment, then returns ``RESULT_BYTES`` to send back."""
    payload = b"x" * RESULT_BYTES
    Path(os.environ["AIPERF_TEST_EXPAND_MARK"]).write_text("sending")
    return payload
