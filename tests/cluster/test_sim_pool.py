"""The simulated pool's clock, and the scale simulation's start-up measurement built on it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from aiperf.cluster.sim_pool import HybridClock

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_a_cpu_clock_counts_the_master_s_work_and_the_jumps_but_not_its_waits():
    clock = HybridClock(cpu=True)
    start = clock()
    time.sleep(0.05)  # another process's time, on a shared box: not the master's
    assert clock() - start < 0.03
    clock.jump_to(clock() + 10.0)
    assert clock() - start >= 10.0


def test_the_start_up_measurement_ends_when_every_worker_has_its_first_trial(tmp_path):
    from scale_sim import simulate

    result = simulate(64, 600.0, 5, 3.0, 0, tmp_path, startup_only=True, cpu_clock=True)
    assert result.first_trial_all_busy_s is not None and result.epochs == 0
    assert 64 <= result.trials_started < 128  # the first trial of every worker (and those held for a worker)
    assert result.run_s < 600.0  # long before any trial ends
