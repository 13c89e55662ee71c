"""What aiperf logs reaches the terminal: warnings always, the engine's work with ``-v``.

Every module logs through ``logging.getLogger(__name__)``. :func:`configure` gives the
``aiperf`` and ``nas`` loggers one handler: warnings and errors print as ``aiperf: warning: ...``
(as they always have), and ``-v`` adds what the engine does at INFO (each trial's lifecycle:
proposed, started on which worker, ended, re-queued; workers ready and lost), ``-vv`` at DEBUG.
During a run the handler writes through the run's non-blocking stream
(:func:`through`), so a terminal nobody reads cannot stall the master. A message is made inert
(:func:`~aiperf.ledger.inert.inert`): a worker's host name or a file name it quotes cannot move
the cursor, reorder the line or start a line of its own.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Protocol

from aiperf.ledger.inert import inert, inert_lines

LOGGERS = ("aiperf", "nas")
_DETAIL = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class Stream(Protocol):
    """Where log lines go: a text stream, or a run's non-blocking :class:`~aiperf.engine.output.Output`."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


class TerminalHandler(logging.Handler):
    """One line per record on a stream (standard error as it is at each line, unless told otherwise)."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.stream: Stream | None = None

    def format(self, record: logging.LogRecord) -> str:
        message = inert(record.getMessage())
        if record.levelno >= logging.WARNING:
            return f"aiperf: {record.levelname.lower()}: {message}"
        shown = logging.makeLogRecord({**record.__dict__, "msg": message, "args": None})
        return inert_lines(_DETAIL.format(shown))  # a traceback keeps its lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=self.stream if self.stream is not None else sys.stderr, flush=True)
        except Exception:  # a log line must never end the run
            self.handleError(record)


def _installed() -> TerminalHandler | None:
    return next((h for h in logging.getLogger(LOGGERS[0]).handlers if isinstance(h, TerminalHandler)), None)


def configure(verbosity: int = 0) -> TerminalHandler:
    """Warnings always, INFO with ``-v``, DEBUG with ``-vv``; calling it again replaces the handler."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = TerminalHandler(level)
    for name in LOGGERS:
        log = logging.getLogger(name)
        for old in [h for h in log.handlers if isinstance(h, TerminalHandler)]:
            log.removeHandler(old)
        log.addHandler(handler)
        log.setLevel(level)
    return handler


@contextlib.contextmanager
def through(stream: Stream) -> Iterator[None]:
    """Send the terminal's log lines to ``stream`` meanwhile (a run's non-blocking standard error).

    Without a configured handler (aiperf used as a library), warnings are shown meanwhile anyway.
    """
    handler = _installed()
    added = handler is None
    if handler is None:
        handler = configure(0)
    previous, handler.stream = handler.stream, stream
    try:
        yield
    finally:
        handler.stream = previous
        if added:
            for name in LOGGERS:
                logging.getLogger(name).removeHandler(handler)
