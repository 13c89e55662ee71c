"""What a run prints, through a stream that cannot stop or stall the benchmark.

A benchmark that runs for hours must not die because the terminal it printed to went away
(``aiperf run ... | head -1``: the next write gets ``EPIPE``), nor stall because nobody
reads its output (``aiperf run | less`` left on the first page, a terminal paused with
Ctrl-S: the next write blocks once the pipe's 64 KiB are full). :class:`Output` handles both:

* a write that fails switches the output off for good, and points the descriptor at
  ``/dev/null`` so the interpreter's last flush at exit cannot fail either (which would
  print "Exception ignored" and turn the exit status into 120);
* with ``background=True`` (what ``aiperf run`` uses) lines are handed to a daemon thread
  that writes them straight to the file descriptor; when it is blocked, lines beyond
  ``max_pending`` are dropped (and counted), never waited for. :meth:`drain` gives pending
  lines a bounded time to get out at the end.

A terminal resize (SIGWINCH) needs nothing: Python restarts interrupted writes, and the
progress line is redrawn from its start on every update.

Everything written is made inert first (:func:`~aiperf.ledger.inert.inert_lines`): a control or
format character that reached a printed line from a ledger, a config or a folder name shows as
an escape (``\\x1b``, ``\\u202e``) instead of moving the cursor or reordering text. The one
control sequence aiperf sends on purpose, the progress line's redraw, goes through :meth:`Output.redraw`.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import sys
import threading
import time
from typing import TextIO

from aiperf.ledger.inert import inert_lines


class Output:
    """A text stream that never raises and (in the background mode) never blocks its writer.

    File-like enough for ``print(..., file=out)``.
    """

    def __init__(self, stream: TextIO | None, background: bool = False, max_pending: int = 1000) -> None:
        self.stream = stream
        self.failure: BaseException | None = None  # why it was switched off, if it was
        self.dropped = 0  # lines not written because the reader had stopped reading
        self._fd: int | None = None
        self._queue: queue.Queue[str] | None = None
        self._thread: threading.Thread | None = None
        if background and stream is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
                self._fd = stream.fileno()
                self._encoding = getattr(stream, "encoding", None) or "utf-8"
                self._queue = queue.Queue(max_pending)

    @property
    def enabled(self) -> bool:
        return self.stream is not None and self.failure is None

    def write(self, text: str) -> int:
        """Write ``text`` with its control and format characters shown as escapes (line feeds and tabs kept)."""
        return self._put(inert_lines(text), len(text))

    def redraw(self, text: str) -> None:
        """Go back to the start of the line, clear it and write ``text`` (made inert) there: a live status line."""
        self._put("\r\033[K" + inert_lines(text), 0)

    def _put(self, text: str, written: int) -> int:
        if not self.enabled or not text:
            return written
        if self._queue is None:
            try:
                self.stream.write(text)  # type: ignore[union-attr]
                self.stream.flush()  # type: ignore[union-attr]
            except (OSError, ValueError) as exc:  # EPIPE, EIO, a closed file
                self._switch_off(exc)
            return written
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            self.dropped += 1
        return written

    def flush(self) -> None:
        """Writes flush themselves (a progress line must appear when it is printed)."""

    def isatty(self) -> bool:
        try:
            return bool(self.enabled and self.stream.isatty())  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            return False

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait up to ``timeout_s`` for pending lines to be written; whether they all were."""
        if self._queue is None:
            return True
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _start(self) -> None:
        # What the stream buffered before (printed through it directly) goes first.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.stream.flush()  # type: ignore[union-attr]
        self._thread = threading.Thread(target=self._writer, name="aiperf-output", daemon=True)
        self._thread.start()

    def _writer(self) -> None:
        assert self._queue is not None and self._fd is not None
        while True:
            text = self._queue.get()
            try:
                if self.failure is None:
                    data = text.encode(self._encoding, "replace")
                    while data:
                        data = data[os.write(self._fd, data) :]
            except OSError as exc:
                self._switch_off(exc)
            finally:
                self._queue.task_done()

    def _switch_off(self, exc: BaseException) -> None:
        self.failure = exc
        stream: TextIO | None = self.stream
        # The interpreter flushes sys.stdout/sys.stderr once more at exit; a broken pipe there
        # would print "Exception ignored ..." and change the exit status to 120. Point the
        # descriptor at /dev/null so that last flush (of what is still buffered) succeeds.
        standard = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        if stream is not None and any(stream is s for s in standard):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)


def output(stream: TextIO | Output | None, background: bool = False) -> Output:
    """``stream`` wrapped in an :class:`Output` (an Output is returned as it is)."""
    return stream if isinstance(stream, Output) else Output(stream, background=background)
