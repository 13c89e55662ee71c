"""Helpers shared by the tests (import them: ``from helpers import aiperf_cmd``); fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def aiperf_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, from this interpreter (works with or without an installed script)."""
    return [sys.executable, "-m", "aiperf.cli", *args]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``aiperf ARGS`` in a process of its own, as a user types it; ``timeout`` guards against a hang."""
    return subprocess.run(aiperf_cmd(*args), capture_output=True, text=True, env=cli_env(), timeout=timeout, cwd=REPO)


def start_cli(*args: str, env: dict[str, str]) -> subprocess.Popen:
    """``aiperf ARGS`` started in a session of its own (so a test can kill its whole process group), output piped."""
    return subprocess.Popen(
        aiperf_cmd(*args),
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def killed_if_left(run: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """SIGKILL the process group of a :func:`start_cli` run on the way out if it still goes (a failed test)."""
    try:
        yield run
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)


BOUNDED_MEMORY = 3 << 30  # address space for one hostile-input CLI call: TensorFlow imports in under 2 GiB


def run_cli_bounded(*args: str, memory: int = BOUNDED_MEMORY, timeout: float = 300) -> subprocess.CompletedProcess:
    """``aiperf ARGS`` under an address-space limit (``RLIMIT_AS``), so a regression on hostile input fails
    the test (a MemoryError, a killed process) instead of taking the machine's memory."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        aiperf_cmd(*args), capture_output=True, text=True, env=cli_env(), timeout=timeout, cwd=REPO, preexec_fn=limit
    )


def backend_subprocess(backend: str) -> tuple[str, dict[str, str]]:
    """The Python (``AIPERF_BACKEND_PYTHON`` or this one) and environment of a check on another Keras backend."""
    python = os.environ.get("AIPERF_BACKEND_PYTHON", sys.executable)
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return python, env


# The shared smoke run's settings (conftest.py's ``smoke_run``, and the submission runs made beside it): it ends
# on a trial count, not on the smoke config's 30 s budget (on a loaded CI box that budget can pass before a
# worker completes an epoch), and its search runs in processes of its own (``search.processes=1``: the
# expansions, and TPE), as a large machine's does, so the tests of every real run go through them.
SMOKE_RUN_SETTINGS = ("run.max_trials=8", "run.time_budget_s=300", "search.processes=1")


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def two_trial_smoke_run(results: Path, *overrides: str, trials: int = 2) -> Path:
    """A real smoke run of exactly ``trials`` trials with stored weights (~25 s for 2 on 2 idle cores): what an
    audit needs.

    Not conftest's time-boxed ``smoke_run``: on a loaded machine 30 s may complete no trial.
    """
    settings = [f"run.results_dir={results}", f"run.max_trials={trials}", "run.time_budget_s=600", *overrides]
    proc = subprocess.run(
        aiperf_cmd("run", "--config", "smoke", *[a for o in settings for a in ("--set", o)]),
        capture_output=True, text=True, env=cli_env(), timeout=900, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    return run


def ledger_records(run: Path) -> list[dict]:
    """A run's ledger as JSON objects, read plainly (a test's view, not the readers under test)."""
    import json

    return [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines() if line.strip()]


def rehash(records: list[dict]) -> None:
    """Renumber ``records`` and give them a fresh hash chain, in place (an edit that keeps the chain intact)."""
    from aiperf.ledger.store import record_hash

    prev = ""
    for seq, rec in enumerate(records):
        rec.pop("hash", None)
        rec.update(seq=seq, prev=prev)
        rec["hash"] = prev = record_hash(rec)


def rechain(run: Path, records: list[dict]) -> None:
    """Write ``records`` as a fresh, internally consistent ledger and summary: what a careful forger does."""
    from aiperf.ledger.store import canonical
    from aiperf.results.summary import build_summary, save_summary
    from aiperf.results.verify import verify_run

    rehash(records)
    (run / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in records))
    save_summary(run, build_summary(run))
    ok, message = verify_run(run)
    assert ok, message  # the forgery gets past every check that reads only the ledger


def sim_run_start(cfg, pool):
    """The ``run_start`` record a master on a simulated pool appends first (tests that drive ``Master``)."""
    from aiperf.ledger.schema import Record

    return Record(
        type="run_start", t=0.0, run_id="sim", config=cfg.to_dict(), plan=pool.plan.to_dict(),
        dataset={"name": "sim", "split": {"disjoint": True}}, rules=cfg.rules.model_dump(),
    )  # fmt: skip


SIM_DATASET = {
    "name": "digits-sim", "num_classes": 10, "input_shape": [8, 8, 1], "train_images": 1438, "eval_images": 359,
    "split": {"method": "stratified", "seed": 0, "disjoint": True}, "fingerprint": "0" * 64,
}  # fmt: skip


def simulated_run(run_dir: Path) -> Path:
    """A complete run directory from the real master and search on a simulated 2-node pool (~2 s)."""
    from aiperf.config import load_config
    from aiperf.engine.scaling import SimulationSettings, simulate_run
    from nas import zoo

    cfg = load_config("smoke", ["run.time_budget_s=120"])
    sim = SimulationSettings(workers_per_node=2, device_ops_per_s=3e8, startup_s=0.5)
    simulate_run(cfg, 2, run_dir, zoo.small_resnet((8, 8, 1), 10, width=8), SIM_DATASET, sim)
    return run_dir


# --- rendering a page in a real browser (the run report, the list) ----------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]  # fmt: skip


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on PATH (Debian: apt-get install chromium); the page was not rendered")


def render_in_chromium(html_path, tmp_path, *mode):
    """Run headless Chromium on a page: (stdout, console messages logged as errors or uncaught exceptions)."""
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    proc = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *mode, html_path.as_uri()],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    errors = [line for line in console if "Uncaught" in line or "Error" in line]
    return proc, errors


def page_health(html_path, tmp_path):
    """What the page's own script recorded: (ready, images shown / total, errors caught on the page)."""
    proc, console_errors = render_in_chromium(html_path, tmp_path, "--dump-dom")
    dom = proc.stdout
    ready = 'data-ready="1"' in dom
    images = re.search(r'data-images="(\d+)/(\d+)"', dom)
    caught = re.search(r'data-errors="([^"]*)"', dom)
    return ready, images.groups() if images else None, (caught.group(1) if caught else None), console_errors


def made_once(tmp_path_factory, name: str, make):
    """``make(folder)`` run once per test session even when pytest-xdist splits it across processes.

    Without xdist it runs here. With it, the first worker to ask makes it under a file lock in the
    folder all workers share, and the others read what it returned (pickled beside it): each
    session fixture that starts a real run (40-70 s on 2 cores) is paid once, not once per worker.
    A ``make`` that fails leaves nothing behind, so the next worker to ask tries again and fails
    the same way.
    """
    import pickle

    from filelock import FileLock

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's own
    done = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if done.is_file():
            return pickle.loads(done.read_bytes())
        folder = shared / name
        if folder.exists():  # a make that failed in another worker
            import shutil

            shutil.rmtree(folder)
        folder.mkdir()
        value = make(folder)
        done.write_bytes(pickle.dumps(value))
        return value
