"""One master per run directory: an exclusive ``flock`` on ``RUN_DIR/run.lock``.

Two masters appending to one ledger break its chain and invent results (issue 13: a
``--resume`` of a run that was still going). So the master takes an exclusive, non-blocking
``fcntl.flock`` on ``run.lock`` before it reads the ledger for appending, and holds it until
its summary and report are written. The file records who holds it (PID, host, start time,
command) so a refusal can say whom to wait for. The kernel drops the lock when its holder
dies, however it dies: a lock file left by a killed master is *stale* -- it can be taken at
once, and ``--resume`` says whose it was. The content is cleared on a clean release.

Shared file systems: Linux implements ``flock`` on NFS as a whole-file POSIX lock, which
NFSv4 (and NFSv3 with a running lock manager) enforces across clients; a client that
crashes holds its locks until its lease expires (90 s by default), so a ``--resume`` from
another node right after such a crash is refused for that long. Lustre enforces ``flock``
across nodes only when mounted with ``-o flock``; ``localflock`` (and NFS's ``nolock``) make
locks node-local, which does not protect a run directory shared between nodes. Where locks
are refused (Lustre's default ``noflock``: ENOSYS; NFSv3 without a lock manager: ENOLCK) the
run is refused rather than run unprotected. Because NFS's emulation is a POSIX lock, the
holder must never open and close ``run.lock`` a second time (that would drop the lock): this
module opens it once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiperf.errors import AiperfError, excerpt, os_error

LOCK_NAME = "run.lock"
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run lock, as recorded in the lock file."""

    pid: int | None
    host: str
    started: str
    command: str = ""

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        try:
            info = json.loads(data.decode())
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(info, dict):
            return None
        pid = info.get("pid")
        return cls(
            pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31 else None,
            _text(info.get("host")),
            _text(info.get("started")),
            _text(info.get("command")),
        )

    def describe(self) -> str:
        """``PID 1234 on host gpu-07, started 2026-11-23 18:00:00 UTC``."""
        who = f"PID {self.pid}" if self.pid is not None else "an unknown process"
        return f"{who} on host {self.host or '?'}, started {self.started or '?'}"

    def is_alive_here(self) -> bool | None:
        """Whether the recorded process still exists (None when it ran on another host)."""
        if self.host != platform.node() or self.pid is None:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _text(value: object) -> str:
    return value if isinstance(value, str) and value.isprintable() and len(value) <= 200 else excerpt(value)


class RunLocked(AiperfError):
    """Another process holds the run directory."""


class RunLock:
    """The run directory's lock; use as a context manager or with :meth:`acquire`/:meth:`release`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self.previous: Holder | None = None  # the stale holder taken over, if the file named one

    def acquire(self, command: str = "aiperf run") -> RunLock:
        """Take the lock or raise :class:`RunLocked` naming its holder; never waits."""
        try:
            # O_NOFOLLOW: a planted symlink must not make us truncate the file it points at.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise AiperfError(f"{self.path} is a symbolic link; refusing to use it as the run lock") from None
            raise os_error(exc, self.path, "create the run lock", then="a run needs a writable run directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            content = _read_all(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _locked(self.run_dir, Holder.parse(content)) from None
            if exc.errno in _UNSUPPORTED:
                raise AiperfError(
                    f"cannot lock {self.path}: the file system does not support file locks "
                    f"({errno.errorcode.get(exc.errno, exc.errno)}); put run.results_dir on a local disk, or mount "
                    "NFS with locking / Lustre with -o flock (docs/results.md)"
                ) from None
            raise os_error(exc, self.path, "lock") from None
        try:
            self.previous = Holder.parse(_read_all(fd))
            record = {
                "pid": os.getpid(),
                "host": platform.node(),
                "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
                "command": command,
                "python": sys.executable,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise os_error(exc, self.path, "write the run lock") from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Clear the holder record and drop the lock (a later taker then has no stale holder to report)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self if self.held else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_all(fd: int) -> bytes:
    try:
        return os.pread(fd, 4096, 0)
    except OSError:
        return b""


def _locked(run_dir: Path, holder: Holder | None) -> RunLocked:
    if holder is None:
        return RunLocked(f"{run_dir} is in use by another aiperf process; try again when it has finished")
    alive = holder.is_alive_here()
    if alive is False:
        return RunLocked(
            f"{run_dir} is locked by another process: its recorded master ({holder.describe()}) has exited, "
            "but a process it started still holds the lock; stop that process, then try again"
        )
    return RunLocked(
        f"{run_dir} is in use by a running aiperf master ({holder.describe()}); wait for it to finish, "
        f"or stop it (kill -TERM {holder.pid if holder.pid is not None else '<pid>'} on {holder.host or 'its host'}) "
        "and then --resume"
    )


def live_holder(run_dir: str | Path) -> Holder | None:
    """The master holding ``run_dir`` right now, or None (also when it cannot be told).

    Tries a *shared* lock without waiting and without creating the file, so it never
    disturbs a master and works on a read-only copy of a run.
    """
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return Holder.parse(_read_all(fd)) or Holder(None, "", "")
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def takeover_note(previous: Holder | None) -> str | None:
    """One line about the stale lock that was taken over, if the file named a holder."""
    if previous is None:
        return None
    return f"took over the run lock of a master that is no longer running ({previous.describe()})"
