"""One Ray actor per node (``cluster.actors: per_node``): the node agent runs its workers as processes.

The slow test drives it through ``aiperf run``: one agent holds the node's resources, its
workers are processes of its own, a worker process killed mid-trial is a lost worker (its trial
re-queued, the slot started again on the same agent), and the run verifies like any other.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import aiperf_cmd, cli_env, killed_if_left, start_cli

from aiperf.cluster.messages import TrialDone, TrialEnded, TrialStarted
from aiperf.cluster.node_agent import NodeAgent, SlotLost, _SlotProcess, device_shares
from aiperf.cluster.node_weights import StartWeights
from aiperf.ledger.store import read_raw_ledger
from aiperf.training.trial import TrialSpec


def test_slots_get_their_own_accelerators_whole_or_shared():
    assert device_shares([1.0, 1.0, 1.0], ["0", "1", "2"]) == [["0"], ["1"], ["2"]]
    assert device_shares([2.0, 2.0], ["0", "1", "2", "3"]) == [["0", "1"], ["2", "3"]]  # data-parallel pairs
    assert device_shares([0.5, 0.5, 0.5, 0.5], ["4", "6"]) == [["4"], ["4"], ["6"], ["6"]]  # fractional
    assert device_shares([0.25] * 3, ["0"]) == [["0"]] * 3
    assert device_shares([1.0, 1.0], []) == [[], []]  # a CPU node: nothing to choose


def test_a_slot_whose_process_died_between_trials_says_it_died_when_it_is_sent_work():
    context = multiprocessing.get_context("spawn")
    slot = _SlotProcess.__new__(_SlotProcess)  # its pipe and process without a worker in it
    slot.conn, child = context.Pipe()
    slot.process = context.Process(target=time.sleep, args=(60,))
    slot.process.start()
    child.close()  # as the agent's end of a slot whose process is gone: nobody reads the pipe
    slot.worker_id, slot._send_lock = "w0003", threading.Lock()
    os.kill(slot.process.pid, signal.SIGKILL)
    with pytest.raises(SlotLost, match=r"^worker w0003's process died \(exit code -9\)$"):
        slot.send(("run", {}, None, None))
    with pytest.raises(SlotLost, match=r"process died \(exit code -9\)"):
        slot.receive(1.0)


class _ScriptedSlot:
    """A slot whose process answers each ``run`` with the next scripted replies."""

    def __init__(self, worker_id: str, replies: list[list[tuple[str, object]]]) -> None:
        self.worker_id, self.replies, self.ready = worker_id, replies, True
        self.lock = threading.Lock()
        self.training = False
        self.ran: list[str] = []
        self.prepared: list[str] = []

    def prepare(self, spec: dict) -> None:
        self.prepared.append(spec["trial_id"])

    def send(self, message: tuple) -> None:
        self.ran.append(message[1]["trial_id"])
        self._now = iter(self.replies.pop(0))

    def receive(self, timeout: float | None = None) -> tuple[str, object]:
        return next(self._now)


def _request(key: int, worker: str, trial: str) -> tuple:
    spec = TrialSpec(trial_id=trial, kind="seed", graph={}, hparams={"batch_size": 32, "epochs": 1}, seed=1)
    return (key, worker, spec.to_dict(), None, None)


def test_one_call_runs_each_slots_trials_in_order_and_ends_each_trials_share_on_its_own():
    agent = NodeAgent.__new__(NodeAgent)  # no Ray: the slots' processes are scripted
    agent._changed, agent._failed, agent._store = threading.Condition(), {}, None
    agent._ahead, agent._waiting = False, {}
    done = ("message", TrialDone(weights=None))
    slot0 = _ScriptedSlot(
        "w0000",
        [
            [("message", TrialStarted(worker="w0000")), done, ("end", None)],
            [("error", "ValueError: the learning rate is not a number")],
            [("message", TrialStarted(worker="w0000")), done, ("end", None)],
        ],
    )
    slot1 = _ScriptedSlot("w0007", [])  # worker w0001 was lost; its slot was started again for w0007
    agent._slots = {0: slot0, 1: slot1}
    batch = [
        _request(0, "w0000", "t0"),
        _request(1, "w0001", "t1"),
        _request(0, "w0000", "t2"),
        _request(0, "w0000", "t3"),
    ]
    items = list(agent.run_trials(batch))
    assert slot0.ran == ["t0", "t2", "t3"], "a slot's trials run in the call's order"
    assert slot1.ran == [], "a trial for a lost worker does not run on its slot's new worker"
    by_trial: dict[int, list] = {}
    for index, item in items:
        by_trial.setdefault(index, []).append(item)
    assert [type(m) for m in by_trial[0]] == [TrialStarted, TrialDone, TrialEnded] and by_trial[0][-1].error is None
    gone = "SlotLost: worker w0001 is gone: its slot now runs worker w0007"
    assert by_trial[1] == [TrialEnded(error=gone, lost=True)]
    assert by_trial[2] == [TrialEnded(error="ValueError: the learning rate is not a number")]
    assert [type(m) for m in by_trial[3]] == [TrialStarted, TrialDone, TrialEnded], "the failure ended only its trial"
    zero = [index for index, _ in items if index in (0, 2, 3)]
    assert zero == sorted(zero), "each of slot 0's trials ends before the next one's messages"


def test_each_trial_that_starts_sends_the_next_one_waiting_for_its_slot_to_be_compiled_ahead():
    agent = NodeAgent.__new__(NodeAgent)
    agent._changed, agent._failed, agent._store = threading.Condition(), {}, None
    agent._ahead, agent._waiting = True, {}
    ran = [("message", TrialStarted(worker="w0000")), ("message", TrialDone(weights=None)), ("end", None)]
    slot0 = _ScriptedSlot("w0000", [list(ran), list(ran), list(ran)])
    agent._slots = {0: slot0}
    items = list(agent.run_trials([_request(0, "w0000", "t0"), _request(0, "w0000", "t1"), _request(0, "w0000", "t2")]))
    assert slot0.ran == ["t0", "t1", "t2"]
    assert slot0.prepared == ["t1", "t2"], "each trial's successor compiles while it runs; the last has none"
    assert sum(isinstance(m, TrialEnded) for _, m in items) == 3
    assert agent._waiting == {0: []}, "nothing stays queued once the trials ran"


def test_a_trial_queued_while_its_slot_only_answers_a_stats_request_is_not_compiled_ahead():
    # Compiling ahead hides a compile behind a running trial; with none running the trial compiles as it starts.
    agent = NodeAgent.__new__(NodeAgent)
    agent._changed, agent._failed, agent._store = threading.Condition(), {}, None
    agent._ahead, agent._waiting = True, {}
    slot0 = _ScriptedSlot("w0000", [])
    agent._slots = {0: slot0}
    spec = TrialSpec.from_dict(_request(0, "w0000", "t0")[2])
    with slot0.lock:  # a stats request talks to the slot
        agent._queue_behind(0, "w0000", spec)
    assert slot0.prepared == []
    slot0.training = True  # a trial runs there: the next one waiting compiles meanwhile
    agent._waiting = {}
    agent._queue_behind(0, "w0000", spec)
    assert slot0.prepared == ["t0"]


def _relay_in_thread(agent: NodeAgent, request: tuple) -> threading.Thread:
    key, worker, spec, _, _ = request
    start = StartWeights(TrialSpec.from_dict(spec), None, None)
    thread = threading.Thread(target=lambda: list(agent._relay(key, worker, start)), daemon=True)
    thread.start()
    return thread


def test_a_slot_runs_the_trials_of_several_calls_in_the_order_they_came():
    # Two calls queued trials on one slot; the later call's thread reaches the slot first. Taking the slot
    # in its place would run the trials out of order, and the trial compiled ahead behind the running one
    # (the first waiting) would not be the one that runs next: it would compile on the device's time.
    agent = NodeAgent.__new__(NodeAgent)
    agent._changed, agent._failed, agent._store = threading.Condition(), {}, None
    agent._ahead, agent._waiting = True, {}
    ran = [("message", TrialStarted(worker="w0000")), ("message", TrialDone(weights=None)), ("end", None)]
    slot0 = _ScriptedSlot("w0000", [list(ran), list(ran)])
    agent._slots = {0: slot0}
    first, second = _request(0, "w0000", "t0"), _request(0, "w0000", "t1")
    for _, worker, spec, _, _ in (first, second):
        agent._queue_behind(0, worker, TrialSpec.from_dict(spec))
    late = _relay_in_thread(agent, second)
    late.join(0.5)
    assert late.is_alive() and slot0.ran == [], "the second trial waits for the first"
    _relay_in_thread(agent, first).join(10)
    late.join(10)
    assert slot0.ran == ["t0", "t1"]
    assert slot0.prepared == ["t1"], "the trial compiled ahead is the one that ran next"
    assert agent._waiting == {0: []}


def test_a_trial_that_gives_up_its_place_lets_the_trials_behind_it_run():
    agent = NodeAgent.__new__(NodeAgent)
    agent._changed, agent._failed, agent._store = threading.Condition(), {}, None
    agent._ahead, agent._waiting = False, {}
    ran = [("message", TrialStarted(worker="w0007")), ("message", TrialDone(weights=None)), ("end", None)]
    slot0 = _ScriptedSlot("w0007", [list(ran)])  # its worker w0000 was lost; the slot runs w0007 now
    agent._slots = {0: slot0}
    lost, behind = _request(0, "w0000", "t0"), _request(0, "w0007", "t1")
    for _, worker, spec, _, _ in (lost, behind):
        agent._queue_behind(0, worker, TrialSpec.from_dict(spec))
    waiting = _relay_in_thread(agent, behind)
    _relay_in_thread(agent, lost).join(10)  # ends with SlotLost: its worker is gone
    waiting.join(10)
    assert not waiting.is_alive() and slot0.ran == ["t1"]


def _agent_children(run: subprocess.Popen) -> list[psutil.Process]:
    """The worker processes the run's node agent started (spawned children of the ``ray::NodeAgent`` process)."""
    out = []
    for proc in psutil.Process(run.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "NodeAgent" in " ".join(proc.cmdline()):
                out.extend(c for c in proc.children() if "spawn_main" in " ".join(c.cmdline()))
    return out


@pytest.mark.slow
def test_a_run_with_one_actor_per_node_survives_a_worker_process_killed_mid_trial(tmp_path):
    results = tmp_path / "results"
    env = cli_env()
    env.pop("RAY_ADDRESS", None)
    run = start_cli(
        # Ends on its trial count (the budget only guards against a hang): the slot started again after the kill
        # has its framework to import before it trains, which on a loaded machine outlasts a short budget.
        "run", "--config", "smoke", "--set", "cluster.actors=per_node", "--set", "run.max_trials=30",
        "--set", "run.time_budget_s=600", "--set", f"run.results_dir={results}",
        env=env,
    )  # fmt: skip
    with killed_if_left(run):
        deadline = time.monotonic() + 240
        victims: list[psutil.Process] = []
        while time.monotonic() < deadline and run.poll() is None:
            runs = [p for p in results.iterdir() if (p / "ledger.jsonl").exists()] if results.exists() else []
            records = read_raw_ledger(runs[0]) if runs else []
            training = {r["worker"] for r in records if r["type"] == "trial_start"}
            victims = _agent_children(run)
            # Both workers past their start-up (one killed before it is ready is a worker_failed, not a lost
            # worker: on a loaded box the second can take a minute), early enough that the slot started
            # again has time to train.
            if len(training) == 2 and len(victims) == 2:
                break
            time.sleep(0.5)
        assert len(victims) == 2, "the node agent does not run its two workers as processes of its own"
        os.kill(victims[0].pid, signal.SIGKILL)  # one worker process dies mid-run; the agent and its sibling live
        out, _ = run.communicate(timeout=700)
    assert run.returncode == 0, out[-3000:]

    run_dir = next(results.iterdir())
    records = read_raw_ledger(run_dir)
    assert records[0]["plan"]["actors"] == "per_node"
    lost = [r for r in records if r["type"] == "worker" and "process died" in (r["retired"] or "")]
    assert len(lost) == 1, "the killed process is one lost worker"
    again = [r for r in records if r["type"] == "trial_start" and r["worker"] not in ("w0000", "w0001")]
    assert again, "the lost slot was started again and ran trials"
    assert records[-1]["type"] == "run_stop" and records[-1]["status"] == "completed"
    assert [r for r in records if r["type"] == "weights"], "kept weights were collected from the agent"
    done = subprocess.run(aiperf_cmd("verify", str(run_dir)), capture_output=True, text=True, env=cli_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads(Path(run_dir, "summary.json").read_text())
    assert summary["trials"]["epochs_counted"] == sum(r["type"] == "epoch" for r in records)
