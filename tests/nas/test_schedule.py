"""The size schedule: the band of FLOPs per image moves on a fixed timetable, and the search follows it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from layer_flops import conv_dense_train_flops

from nas.errors import NasError
from nas.limits import Limits
from nas.proposer import TrialKind
from nas.schedule import SizeSchedule
from nas.search import AutoMLSearch, SearchSettings
from nas.zoo import small_resnet

SEED = small_resnet(input_shape=(16, 16, 1), width=8)


_flops = conv_dense_train_flops


LIMITS = Limits(max_layers=40, max_params=2_000_000, max_flops_per_image=1e9, flops_fn=_flops)
START = _flops(SEED)


def test_the_band_starts_at_the_seed_and_ends_at_its_end():
    s = SizeSchedule(start=1e6, end=16e6, width=4.0)
    assert s.band(0.0) == (1e6, 2e6)  # clipped below at the start
    assert s.band(1.0) == (8e6, 16e6)  # clipped above at the end
    low, high = s.band(0.5)
    assert low == pytest.approx(2e6) and high == pytest.approx(8e6)  # centre 4e6, x/÷ 2
    assert s.band(-3) == s.band(0) and s.band(7) == s.band(1)  # progress is clamped
    assert s.admits(8e6, 0.5) and not s.admits(8.1e6, 0.5)
    assert s.shortfall(3e6, 0.5) == 0.0
    assert s.shortfall(1e6, 0.5) == pytest.approx(math.log(2.0))


@pytest.mark.parametrize(
    "start, end, width",
    [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (1.0, 2.0, 0.5), (1.0, math.inf, 2.0), (True, 2.0, 2.0)],
)
def test_an_impossible_schedule_is_refused(start, end, width):
    with pytest.raises(NasError, match="size schedule"):
        SizeSchedule(start, end, width)


def test_a_schedule_needs_a_flops_counter():
    with pytest.raises(NasError, match="flops_fn"):
        AutoMLSearch(SearchSettings(), SEED, Limits(40, 10**7, 1e12), SizeSchedule(1.0, 2.0, 2.0))


def _drive(search: AutoMLSearch, trials: int, workers: int = 4) -> list[tuple[float, TrialKind, float]]:
    """A master's ask/tell over ``trials`` asks spread evenly over the run; accuracy grows with size."""
    rng = np.random.default_rng(0)
    running: list[tuple[str, float]] = []
    out = []
    for k in range(trials):
        progress = k / trials
        search.at(progress)
        proposal = search.ask(f"t{k:03d}")
        flops = _flops(proposal.graph)
        out.append((progress, proposal.kind, flops))
        running.append((f"t{k:03d}", flops))
        if len(running) >= workers:
            done, size = running.pop(0)
            search.tell(done, min(0.99, 0.6 + 0.05 * math.log(size / START) + rng.normal(0, 0.01)), True)
    return out


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_proposals_never_exceed_the_band_and_follow_it_once_running(strategy):
    schedule = SizeSchedule(START, 16 * START, 2.0)
    shares = []
    for seed in (3, 4, 5):  # one seed's 63 late proposals are too few to judge a share by
        settings = SearchSettings(strategy=strategy, seed=seed, candidates=24, landmarks=8)
        log = _drive(AutoMLSearch(settings, SEED, LIMITS, schedule), 90)
        for progress, _, flops in log:
            assert flops <= schedule.band(progress)[1] * (1 + 1e-9)
        late = [(p, f) for p, kind, f in log if p >= 0.3]
        shares.append(sum(f >= schedule.band(p)[0] for p, f in late) / len(late))
        assert any(kind == TrialKind.TUNE for p, kind, _ in log if p >= 0.3), "re-tuning goes on under the schedule"
    assert np.mean(shares) >= 0.8, f"the search should keep up with the band: {shares}"


def test_seeds_train_similar_sizes_under_a_schedule():
    """The point of the schedule: the sizes a run trains do not depend on the search's luck."""

    def mean_log_size(seed: int, schedule: SizeSchedule | None) -> float:
        settings = SearchSettings(seed=seed, candidates=24, landmarks=8)
        log = _drive(AutoMLSearch(settings, SEED, LIMITS, schedule), 60)
        return float(np.mean([math.log(f) for _, _, f in log]))

    schedule = SizeSchedule(START, 16 * START, 2.0)
    scheduled = [mean_log_size(seed, schedule) for seed in range(3)]
    assert max(scheduled) - min(scheduled) < math.log(1.3)
    centre = np.mean([math.log(schedule.centre(k / 60)) for k in range(60)])
    assert abs(np.mean(scheduled) - centre) < math.log(1.6), "sizes follow the band's centre"


@pytest.mark.parametrize("schedule", [None, SizeSchedule(START, 16 * START, 2.0)])
def test_the_search_refuses_a_graph_within_the_limits_exactly_when_its_flops_exceed_its_ceiling(schedule):
    # The start-up expansion processes leave children above this ceiling pickled (nas.startup.Packed):
    # the master must refuse exactly what it says, at every progress, or the walk would change.
    from nas.startup import expand

    graphs = [item.graph for item in expand(SEED, 3, 1, None)]
    graphs += [item.graph for g in graphs[:6] for item in expand(g, 3, 1, None)]
    largest = sorted(_flops(g) for g in graphs)[-len(graphs) // 20]  # one in twenty is over the limits
    limits = Limits(max_layers=30, max_params=2_000_000, max_flops_per_image=largest, flops_fn=_flops)
    search = AutoMLSearch(SearchSettings(seed=1), SEED, limits, schedule)
    outcomes = set()
    for progress in (0.0, 0.05, 0.3, 1.0):
        search.at(progress)
        for graph in graphs:
            within = not limits.reason(graph)
            expected = within and limits.flops(graph) <= search._flops_ceiling()
            assert search._admits_now(graph) == expected
            outcomes.add((within, expected))
    assert (True, True) in outcomes and (False, False) in outcomes
    if schedule is not None:
        assert (True, False) in outcomes  # within the limits but above the band
    else:
        assert search._flops_ceiling() == math.inf


def test_a_search_far_behind_its_band_proposes_inside_it_with_more_morphs_than_usual():
    """Trials lengthen as networks grow, so a search can find every completed net far below the band: its
    next children must reach the band, not creep towards it two morphs a generation (issue 52)."""
    schedule = SizeSchedule(START, 16 * START, 2.0)
    settings = SearchSettings(seed=1, candidates=24, landmarks=8)
    search = AutoMLSearch(settings, SEED, LIMITS, schedule)
    for k in range(6):  # the start-up: nets near the seed's size complete
        search.at(0.0)
        search.ask(f"t{k}")
        search.tell(f"t{k}", 0.6 + 0.01 * k, True)
    search.at(0.6)  # the band's low edge is now 16 ** 0.6 / sqrt(2) = 3.7 x the seed
    low, high = schedule.band(0.6)
    arch = [p for p in (search.ask(f"u{k}") for k in range(6)) if p.kind == TrialKind.ARCH]
    assert arch, "under a band no completed net is in, the asks are new architectures"
    assert all(low <= _flops(p.graph) <= high for p in arch), [_flops(p.graph) / low for p in arch]
    assert max(len(p.morphs) for p in arch) > settings.max_morphs_per_child
