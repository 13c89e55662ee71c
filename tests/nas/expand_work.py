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


def slow_expand_unsent(graph, kernel, seed, limits, ceiling):
    """The processes' own work, a quarter of a second late: slower than the master, as on a busy head node."""
    import time

    from nas.expand_pool import expand_unsent

    time.sleep(0.25)
    return expand_unsent(graph, kernel, seed, limits, ceiling)
