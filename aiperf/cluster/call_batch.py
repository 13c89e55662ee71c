"""Trials submitted one after another to the same node agent travel in one remote call.

Ray's remote call costs the submitting thread about 110 µs beyond serialising its arguments, and
the master submits trial by trial from one thread: at the start-up fill of 65,536 workers that is
over 7 s of the master's time while workers wait (benchmarks/submit_cost.py). A node agent runs
all its node's slots, so the trials the master hands its free workers in a row -- the free list
is in worker order, and a node's workers are numbered together -- can share one call: 8 trials
to a call cost 23 µs of the calling thread a trial instead of 133 (benchmarks/RESULTS.md).

A batch is sent when the next submission goes to another agent, when it is full, or when the
pool next waits for events, so a trial waits at most for the proposals of its batch's later trials.
"""

from __future__ import annotations

from typing import Generic, TypeVar

Key = TypeVar("Key")
Item = TypeVar("Item")

BATCH_LIMIT = 64  # trials in one call at most: a node's slots times its queue depth fits, the message stays small


class CallBatcher(Generic[Key, Item]):
    """Collects consecutive submissions to one destination; hands back each batch once it must go."""

    def __init__(self, limit: int = BATCH_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"a batch holds at least one submission, got a limit of {limit}")
        self._limit = limit
        self._key: Key | None = None
        self._items: list[Item] = []

    def add(self, key: Key, item: Item) -> list[tuple[Key, list[Item]]]:
        """Hold ``item`` for ``key``; the batches that must go now (the previous destination's, a full one)."""
        out = self.flush() if self._items and self._key != key else []
        self._key = key
        self._items.append(item)
        if len(self._items) >= self._limit:
            out.extend(self.flush())
        return out

    def flush(self) -> list[tuple[Key, list[Item]]]:
        """The batch held so far, to be sent now (none when nothing is held)."""
        if not self._items:
            return []
        batch, self._items = self._items, []
        key, self._key = self._key, None
        return [(key, batch)]  # type: ignore[list-item]  # key is set whenever items are held

    def __len__(self) -> int:
        return len(self._items)
