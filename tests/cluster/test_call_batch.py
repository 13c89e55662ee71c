"""Consecutive submissions to one destination share a call; a batch goes as soon as it must."""

from __future__ import annotations

import pytest

from aiperf.cluster.call_batch import CallBatcher


def test_a_batch_goes_when_the_next_submission_goes_elsewhere_when_full_or_when_flushed():
    batcher: CallBatcher[str, int] = CallBatcher(limit=3)
    assert batcher.add("node-a", 1) == [] and batcher.add("node-" + "a", 2) == []  # equal names: one destination
    assert batcher.add("node-b", 3) == [("node-a", [1, 2])]
    assert batcher.add("node-b", 4) == [] and batcher.add("node-b", 5) == [("node-b", [3, 4, 5])], "full"
    assert len(batcher) == 0 and batcher.flush() == []
    batcher.add("node-a", 6)
    assert batcher.flush() == [("node-a", [6])] and batcher.flush() == []
    assert batcher.add("node-a", 7) == [], "a flushed destination starts a new batch"


def test_a_limit_of_one_sends_every_submission_alone():
    batcher: CallBatcher[str, int] = CallBatcher(limit=1)
    assert batcher.add("a", 1) == [("a", [1])]
    assert batcher.add("a", 2) == [("a", [2])]
    with pytest.raises(ValueError, match="at least one"):
        CallBatcher(limit=0)
