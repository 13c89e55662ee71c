"""`aiperf run` compiles each worker's queued trial ahead: on TensorFlow with one actor per worker, on JAX with node
agents."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest
from helpers import REPO, aiperf_cmd, cli_env, ledger_records, two_trial_smoke_run

pytestmark = pytest.mark.slow
NO_JAX = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the jax backend is not installed")


@pytest.mark.parametrize(
    ("backend", "actors"), [("tensorflow", "per_worker"), pytest.param("jax", "per_node", marks=NO_JAX)]
)
def test_every_trial_after_a_worker_s_first_starts_on_steps_compiled_ahead(tmp_path, backend, actors):
    # One slot of one core: each trial after the first waits behind another, and the other core is free, so
    # train.compile_ahead "auto" compiles ahead. No compiled models kept: a trial on steps already compiled can
    # only have been compiled ahead.
    settings = [f"model.backend={backend}", f"cluster.actors={actors}", "cluster.max_concurrent_trials=1"]
    settings.append("cluster.cpus_per_trial=1")
    run = two_trial_smoke_run(tmp_path, *settings, "train.compiled_models=0", trials=3)
    records = ledger_records(run)
    ends = [r for r in records if r["type"] == "trial_end" and r["status"] == "completed"]
    assert len(ends) == 3
    first_epochs = {}
    for r in records:
        if r["type"] == "epoch":
            first_epochs.setdefault(r["trial"], r)
    table = [(e["trial"], e["attempt"], e["step_reused"], first_epochs[e["trial"]]["compile_s"]) for e in ends]
    # A trial queued behind a running one starts on steps built meanwhile. Which ones were queued in time, and
    # the order a node agent runs two of the master's calls in, vary: at least one; and at least one compiled as
    # it started (the worker's first, or one whose model a trial before it took). The ledger's order is the
    # order the master heard of them, not the order they ran in.
    reused = [first_epochs[e["trial"]] for e in ends if e["step_reused"]]
    fresh = [first_epochs[e["trial"]] for e in ends if not e["step_reused"]]
    assert reused and fresh, table
    assert all(r["compile_s"] < f["compile_s"] for r in reused for f in fresh), table
    assert next(r for r in records if r["type"] == "run_start")["plan"]["compile_ahead"] is True
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"]["compile_critical_fraction"] is not None
    verify = subprocess.run(aiperf_cmd("verify", str(run)), capture_output=True, text=True, env=cli_env(), cwd=REPO)
    assert verify.returncode == 0, verify.stdout + verify.stderr
