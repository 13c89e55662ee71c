"""The trained sizes against the size schedule per tenth of a run (aiperf.results.size_pace), and the master's
clock for the schedule: the band a proposal is chosen in is the one it will train in."""

from __future__ import annotations

import pytest
from helpers import SIM_DATASET

from aiperf.cluster.sim_pool import HybridClock, SimulatedWorkerPool
from aiperf.config import load_config
from aiperf.engine.master import Master, MasterSettings
from aiperf.engine.scaling import SimulationSettings, simulate_run
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.ledger.schema import EpochRecord, RunStartRecord, TrialStartRecord
from aiperf.ledger.store import LedgerWriter
from aiperf.results.size_pace import PACE_THRESHOLD, SizePace, format_size_pace
from aiperf.results.verify import verify_run
from nas import zoo

SEED_SIZE = 3e6  # forward 1e6 + backward 2e6, update 1e5 over a batch of 100: 3.001e6 as the schedule counts


def _header(family: str = "image", growth: float | None = 4.0) -> RunStartRecord:
    search = {"size_growth": growth, "size_band": 2.0, "max_flops_per_image": 1e12}
    config = {"run": {"time_budget_s": 100.0}, "search": search}
    return RunStartRecord(run_id="r", config=config, plan={"batch_size": 100}, family=family)


def _start(trial: str, scale: float, kind: str = "arch") -> TrialStartRecord:
    flops = {"forward": 1e6 * scale, "backward": 2e6 * scale, "update_per_step": 1e5, "train_per_image": 3e6 * scale}
    return TrialStartRecord(trial=trial, kind=kind, arch_id=trial, flops=flops, params=1)


def _epoch(trial: str, t: float) -> EpochRecord:
    return EpochRecord(trial=trial, epoch=1, val_acc=0.5, precision="float32", t=t)


def test_each_tenth_s_epochs_are_weighed_against_the_band_at_its_midpoint():
    pace = SizePace(_header())
    pace.add_start(_start("t0", 1.0, "seed"))
    pace.add_start(_start("t1", 2.0))
    pace.add_start(_start("t2", 3.0))
    for t in (5.0, 8.0):
        pace.add_epoch(_epoch("t0", t))
    pace.add_epoch(_epoch("t1", 45.0))
    pace.add_epoch(_epoch("t2", 46.0))
    pace.add_epoch(_epoch("t2", 100.0))  # at the budget's end: the last tenth
    section = pace.summary()
    assert section is not None
    start = 3e6 + 1e5 / 100
    assert section["start"] == pytest.approx(start) and section["end"] == pytest.approx(4 * start)
    first, fifth, last = section["per_tenth"][0], section["per_tenth"][4], section["per_tenth"][9]
    assert first["epochs"] == 2 and first["ratio"] == pytest.approx(1.0)  # the band starts at the seed
    # tenth 5 (midpoint 0.45): centre 4 ** 0.45 x start, low edge centre / sqrt(2)
    low = start * 4**0.45 / 2**0.5
    assert fifth["low"] == pytest.approx(low)
    assert fifth["mean_flops"] == pytest.approx((2 * 3e6 + 3 * 3e6 + 2 * 1e5 / 100) / 2)
    assert fifth["ratio"] == pytest.approx(fifth["mean_flops"] / low)
    assert last["epochs"] == 1
    assert [t["tenth"] for t in section["per_tenth"] if t["epochs"] == 0] == [2, 3, 4, 6, 7, 8, 9]
    assert section["kept_pace"] is True and section["behind"] == []  # tenths without epochs are not behind


def test_a_tenth_below_the_threshold_is_named_and_the_run_did_not_keep_pace():
    pace = SizePace(_header())
    pace.add_start(_start("t0", 1.0, "seed"))
    pace.add_epoch(_epoch("t0", 55.0))  # the seed's size in tenth 6: far below the band there
    section = pace.summary()
    assert section is not None
    assert section["behind"] == [6] and not section["kept_pace"]
    assert section["lowest_ratio"] == pytest.approx(section["per_tenth"][5]["ratio"])
    assert section["lowest_ratio"] < PACE_THRESHOLD
    assert "fell below 0.9 x the band's low edge in tenth(s) [6]" in format_size_pace(section)


@pytest.mark.parametrize("header", [_header(growth=None), _header(family="language")])
def test_a_run_without_a_size_schedule_has_no_section(header):
    pace = SizePace(header)
    pace.add_start(_start("t0", 1.0, "seed"))
    pace.add_epoch(_epoch("t0", 5.0))
    assert pace.summary() is None and format_size_pace(None) is None


def test_verify_names_a_run_whose_search_fell_behind_its_band(tmp_path):
    # A schedule no search can follow: a thousandfold growth in 120 s on slow simulated devices.
    cfg = load_config(
        "default", ["run.time_budget_s=120", "search.size_growth=1000", "search.max_flops_per_image=1e12"]
    )
    sim = SimulationSettings(workers_per_node=2, device_ops_per_s=3e9, startup_s=0.5)
    summary = simulate_run(cfg, 1, tmp_path / "run", zoo.small_resnet((8, 8, 1), 10, width=8), SIM_DATASET, sim)
    assert summary["size_pace"]["kept_pace"] is False
    ok, report = verify_run(tmp_path / "run")
    assert ok, report  # falling behind is no forgery: the run verifies, with a note
    assert "note: size schedule: fell below 0.9 x the band's low edge" in report


def test_the_master_asks_for_the_band_a_trial_will_end_its_training_in(tmp_path):
    cfg = load_config("default", ["run.time_budget_s=600"])
    proposer = make_search(cfg, zoo.small_resnet((8, 8, 1), 10, width=8), 64)
    asked: list[tuple[float, float]] = []
    clock = HybridClock()
    told = proposer.at

    def at(progress: float) -> None:
        asked.append((clock() / 600.0, progress))
        told(progress)

    proposer.at = at  # type: ignore[method-assign]
    pool = SimulatedWorkerPool(2, clock, epoch_s=4.0, queue_depth=2)
    ledger = LedgerWriter(tmp_path)
    ledger.append(RunStartRecord(run_id="sim", config=cfg.to_dict(), plan=pool.plan.to_dict()))
    settings = MasterSettings(time_budget_s=600.0, max_trials=12, queue_depth=2)
    Master(settings, proposer, pool, ledger, WeightStore(8), clock=clock).run()
    ledger.close()
    assert asked[0] == (pytest.approx(0.0, abs=0.01), pytest.approx(0.0, abs=0.01))  # nothing measured yet
    later = asked[6:]
    assert later and all(target > now for now, target in later)
    # a trial of the seed's work takes 3 epochs x 4 s: it ends 1.5 of them (half the running one, then its own) on
    for now, target in later:
        assert 600 * (target - now) == pytest.approx(1.5 * 12.0, rel=0.5)
