"""TPE asked ahead, in this process or in a process of its own.

Optuna's TPE costs about 10 ms an ask on the bounded study (nas.hpo), and a quarter of the
search's asks are re-tunes: with the architecture batches at thousands of workers, those asks
are most of the master's search time (benchmarks/RESULTS.md, "TPE in a process of its own").
TPE is not needed the moment a re-tune is proposed, only its answer is, so the tuner asks
``ahead`` trials early under placeholder names (as constant-liar lies, like any running trial)
and hands the oldest one out, renamed, when a re-tune is proposed; then it asks one more.

Which values a trial gets depends only on the order of the asks and results the tuner is given,
never on where it runs: :class:`AheadTuner` runs here, and :class:`TunerProcess` runs the same
:class:`AheadTuner` in a spawned process that is sent every ask and result in order, so the
proposals are the same with or without it. The master keeps what it needs to answer without
waiting (which trials run, with what values) and the results a bounded study is rebuilt from
(:class:`nas.hpo.KeptResults`): if the process dies or stops answering, the tuning goes on here
from those, under another seed; the ledger is untouched and the run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
from collections import deque
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from optuna.trial import create_trial

from nas.errors import NasError
from nas.hpo import KEEP_BEST, KEEP_RECENT, HyperparameterTuner, KeptResults, TunedSpace

logger = logging.getLogger(__name__)
MAX_AHEAD = 64
PATIENCE_S = 120.0  # the longest wait for the tuner process's next values before tuning here
_PLACEHOLDER = "~ahead:"  # trial ids of the search never start with "~"


class AheadTuner:
    """A :class:`~nas.hpo.HyperparameterTuner` whose asks are made ``ahead`` asks early (see the module docstring)."""

    def __init__(self, tuner: HyperparameterTuner, ahead: int) -> None:
        if isinstance(ahead, bool) or not isinstance(ahead, int) or not 0 <= ahead <= MAX_AHEAD:
            raise NasError(f"TPE asked ahead: must be an integer from 0 to {MAX_AHEAD}, got {ahead!r}")
        self.tuner = tuner
        self.space = tuner.space
        self.ahead = ahead
        self._made = 0
        self._queue: deque[str] = deque()
        for _ in range(ahead):
            self._ask_ahead()

    def _ask_ahead(self) -> None:
        placeholder = f"{_PLACEHOLDER}{self._made}"
        self._made += 1
        self.tuner.ask(placeholder)
        self._queue.append(placeholder)

    def made_ahead(self) -> list[dict[str, Any]]:
        """The values waiting to be handed out, oldest first (as sampled)."""
        return [self.tuner.running_params(p) for p in self._queue]

    def ask_params(self, trial_id: str) -> dict[str, Any]:
        """``trial_id``'s values as sampled: the oldest asked ahead (then one more is asked), or asked now."""
        if trial_id.startswith(_PLACEHOLDER) or self.tuner.is_running(trial_id):
            raise NasError(f"trial {trial_id} already has hyperparameters")
        if not self.ahead:
            self.tuner.ask(trial_id)
        else:
            self.tuner.rename(self._queue.popleft(), trial_id)
            self._ask_ahead()
        return self.tuner.running_params(trial_id)

    def ask(self, trial_id: str) -> dict[str, Any]:
        return self.space.normalise(self.ask_params(trial_id))

    def tell(self, trial_id: str, value: float) -> None:
        self.tuner.tell(trial_id, value)

    def fail(self, trial_id: str) -> None:
        self.tuner.fail(trial_id)

    def is_running(self, trial_id: str) -> bool:
        return self.tuner.is_running(trial_id)

    def add_completed(self, hparams: Mapping[str, Any], value: float) -> bool:
        return self.tuner.add_completed(hparams, value)

    def best(self) -> tuple[dict[str, Any], float] | None:
        return self.tuner.best()

    def close(self) -> None:
        """Nothing runs elsewhere."""


def _serve(conn: Connection, space: TunedSpace, seed: int, ahead: int) -> None:
    """The tuner process: every ask and result in the master's order; the values of each ask back, in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's to handle; it closes the process
    try:
        tuner = AheadTuner(HyperparameterTuner(space, seed=seed), ahead)
        if ahead:
            conn.send(tuner.made_ahead())
        while True:
            messages = conn.recv()
            if messages is None:
                return
            made = []
            for kind, *args in messages:
                if kind == "ask":
                    params = tuner.ask_params(args[0])
                    made.append(tuner.made_ahead()[-1] if ahead else params)
                elif kind == "tell":
                    tuner.tell(args[0], args[1])
                elif kind == "fail":
                    tuner.fail(args[0])
                elif kind == "add":
                    tuner.add_completed(args[0], args[1])
            if made:
                conn.send(made)
    except (EOFError, OSError, KeyboardInterrupt):  # the master closed the pipe or is gone
        return
    except Exception as exc:  # the master sees the pipe end and tunes in its own process
        logger.warning(f"the tuner process stopped: {type(exc).__name__}: {str(exc)[:200]}")


class TunerProcess:
    """An :class:`AheadTuner` in a spawned process, with the master's side of it (see the module docstring)."""

    def __init__(self, space: TunedSpace, seed: int, ahead: int, patience_s: float = PATIENCE_S) -> None:
        if isinstance(ahead, bool) or not isinstance(ahead, int) or not 0 <= ahead <= MAX_AHEAD:
            raise NasError(f"TPE asked ahead: must be an integer from 0 to {MAX_AHEAD}, got {ahead!r}")
        self.space = space
        self.ahead = ahead
        self.patience_s = patience_s
        self._seed = seed
        self._distributions = space.distributions()
        self._running: dict[str, dict[str, Any]] = {}  # trial id -> its values as sampled
        self._kept = KeptResults(KEEP_BEST, KEEP_RECENT)
        self._made: deque[dict[str, Any]] = deque()  # values the process sent, not yet handed out
        # Messages go in batches: one pipe write per ask cost the master 6 % of the start-up fill at
        # 65,536 simulated workers. Half the asks made ahead are sent at a time, so the process is
        # making the next values while the master hands out the rest; with none ahead, every ask at once.
        self._outbox: list[tuple[Any, ...]] = []
        self._batch = max(1, ahead // 2)
        self._inline: AheadTuner | None = None  # tuning here, once the process is lost
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe(duplex=True)
        self._process = context.Process(
            target=_serve, args=(theirs, space, seed, ahead), name="aiperf-tuner", daemon=True
        )
        self._process.start()
        theirs.close()  # the process's death then ends this pipe

    @property
    def in_process(self) -> bool:
        """Whether TPE still runs in its own process."""
        return self._inline is None

    def ask(self, trial_id: str) -> dict[str, Any]:
        if self._inline is not None:
            return self._inline.ask(trial_id)
        if trial_id.startswith(_PLACEHOLDER) or trial_id in self._running:
            raise NasError(f"trial {trial_id} already has hyperparameters")
        if self._send("ask", trial_id, now=not self._made):
            params = self._next()
            if params is not None:
                self._running[trial_id] = params
                return self.space.normalise(params)
        return self.ask(trial_id)  # the process was lost: asked here

    def tell(self, trial_id: str, value: float) -> None:
        if self._inline is not None:
            self._inline.tell(trial_id, value)
            return
        params = self._running.pop(trial_id, None)
        if params is None:
            raise NasError(f"trial {trial_id} is not running in TPE")
        self._kept.record(params, float(value))
        self._send("tell", trial_id, float(value))

    def fail(self, trial_id: str) -> None:
        if self._inline is not None:
            self._inline.fail(trial_id)
        elif self._running.pop(trial_id, None) is not None:
            self._send("fail", trial_id)

    def is_running(self, trial_id: str) -> bool:
        return self._inline.is_running(trial_id) if self._inline is not None else trial_id in self._running

    def add_completed(self, hparams: Mapping[str, Any], value: float) -> bool:
        """As :meth:`nas.hpo.HyperparameterTuner.add_completed`; checked here, so the answer needs no wait."""
        if self._inline is not None:
            return self._inline.add_completed(hparams, value)
        params = {k: hparams[k] for k in self._distributions}
        if not self.space.admits(params):
            return False
        try:
            create_trial(params=params, distributions=self._distributions, value=float(value))
        except ValueError:
            return False
        self._kept.record(params, float(value))
        self._send("add", params, float(value))
        return True

    def best(self) -> tuple[dict[str, Any], float] | None:
        if self._inline is not None:
            return self._inline.best()
        if self._kept.best is None:
            return None
        params, value = self._kept.best
        return self.space.normalise(params), value

    def close(self) -> None:
        """End the process (the tuning, if it goes on, goes on here)."""
        if self._inline is None:
            self._lose("the tuner process is closed", warn=False)

    def _send(self, *message: Any, now: bool = False) -> bool:
        """Queue ``message``; send what is queued, in order, once a batch is full or ``now``. False once lost."""
        self._outbox.append(message)
        if not now and len(self._outbox) < self._batch:
            return True
        batch, self._outbox = self._outbox, []
        try:
            self._conn.send(batch)
            return True
        except (OSError, ValueError) as exc:  # the process died (broken pipe) or the pipe is closed
            self._lose(f"could not be sent to ({type(exc).__name__}: {exc})")
            return False

    def _next(self) -> dict[str, Any] | None:
        """The oldest values the process made, waiting for them at most the patience; None once it is lost."""
        if not self._made:
            try:
                if not self._conn.poll(self.patience_s):
                    self._lose(f"sent nothing within {self.patience_s:g} s")
                    return None
                self._made.extend(self._conn.recv())
                while self._conn.poll(0):  # and whatever else it has sent back meanwhile
                    self._made.extend(self._conn.recv())
            except (EOFError, OSError) as exc:
                self._lose(f"ended ({type(exc).__name__}: {exc})")
                return None
        return self._made.popleft()

    def _lose(self, why: str, warn: bool = True) -> None:
        """Stop the process and tune here from the kept results and the running trials, under another seed."""
        if warn:
            logger.warning(f"the TPE process {why}; tuning in the master from its kept results instead")
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(None)
        with contextlib.suppress(OSError, ValueError):
            self._conn.close()
        self._process.join(1)
        if self._process.is_alive():
            self._process.kill()  # SIGKILL: a stopped process ends too
            self._process.join(5)
        seed = int(np.random.SeedSequence([self._seed, 0xA11E]).generate_state(1)[0])
        tuner = HyperparameterTuner(self.space, seed=seed)
        for params, value in self._kept.kept():
            tuner.add_completed(params, value)
        for trial_id, params in self._running.items():
            tuner.adopt_running(trial_id, params)
        self._inline = AheadTuner(tuner, self.ahead)
