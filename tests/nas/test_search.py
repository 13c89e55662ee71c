"""The AutoML search behind the Proposer interface: policy, safety rules, determinism, quality."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter

import numpy as np
import pytest
from layer_flops import conv_dense_train_flops

from nas.errors import NasError
from nas.graph import Graph
from nas.hpo import HyperparameterSpace
from nas.limits import Limits
from nas.morph import apply_morph
from nas.proposer import HPARAM_KEYS, TrialProposal
from nas.random_search import ArchitectureStatus, grow
from nas.search import AutoMLSearch, SearchSettings, make_proposer
from nas.zoo import small_resnet

SEED = small_resnet(input_shape=(16, 16, 1))
SPACE = HyperparameterSpace(kernel_sizes=(1, 3, 5), epochs=(1, 3))


_flops = conv_dense_train_flops


LIMITS = Limits(max_layers=14, max_params=60_000, max_flops_per_image=4e7, flops_fn=_flops)


def _settings(**changes) -> SearchSettings:
    base = {"seed": 0, "candidates": 16, "landmarks": 12, "hparam_space": SPACE}
    return SearchSettings(**{**base, **changes})


def _score(graph: Graph) -> float:
    """A deterministic stand-in for trained accuracy."""
    return min(0.99, 0.4 + 0.03 * graph.depth + 0.02 * graph.count("add", "concat") + 0.01 * (len(graph) % 5))


def _run(search, trials: int, workers: int, score=_score):
    """Ask/tell like a master with ``workers`` busy workers: each trial ends ``workers`` asks later."""
    log, running = [], []
    for k in range(trials):
        trial_id = f"t{k:03d}"
        proposal = search.ask(trial_id)
        log.append((trial_id, proposal, {t for t, _ in running}, set(_finished(log, running))))
        running.append((trial_id, proposal))
        if len(running) >= workers:
            done_id, done = running.pop(0)
            search.tell(done_id, 0.5 * score(done.graph), False)
            search.tell(done_id, score(done.graph), True)
    return log


def _finished(log, running):
    running_ids = {t for t, _ in running}
    return [t for t, *_ in log if t not in running_ids]


def test_the_first_ask_is_the_seed():
    search = make_proposer(_settings(), SEED, LIMITS)
    first = search.ask("t0")
    assert first.kind == "seed" and first.parent is None and first.inherit is None and first.morphs == ()
    assert first.graph == SEED
    assert first.hparams == dict(_settings().default_hparams)


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_every_worker_gets_work_at_start_up_without_inheritance(strategy):
    search = make_proposer(_settings(strategy=strategy), SEED, LIMITS)
    proposals = [search.ask(f"t{k}") for k in range(40)]
    assert all(p.inherit is None for p in proposals)
    archs = [p for p in proposals if p.kind == "arch"]
    tunes = [p for p in proposals if p.kind == "tune"]
    assert len(tunes) == math.floor(0.25 * 39)
    assert all(t.graph == SEED and t.parent is None for t in tunes)
    assert all(a.parent == "t0" and len(a.morphs) >= 1 for a in archs)
    assert len({a.graph.key() for a in archs}) == len(archs)
    assert SEED.key() not in {a.graph.key() for a in archs}


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_asks_in_a_row_give_distinct_new_architectures(strategy):
    search = make_proposer(_settings(strategy=strategy, retune_fraction=0.0), SEED, LIMITS)
    trained = {p.graph.key() for _, p, *_ in _run(search, 6, workers=1)}
    proposals = [search.ask(f"n{k}") for k in range(20)]
    keys = [p.graph.key() for p in proposals]
    assert len(set(keys)) == 20
    assert not set(keys) & trained
    assert all(p.kind == "arch" and p.inherit is not None for p in proposals)


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_limits_are_never_exceeded(strategy):
    search = make_proposer(_settings(strategy=strategy, seed=4), SEED, LIMITS)
    log = _run(search, 50, workers=3)
    closest = 0.0
    for _, proposal, *_ in log:
        graph = proposal.graph
        assert LIMITS.reason(graph) == ""
        usage = (
            graph.depth / LIMITS.max_layers,
            graph.param_count / LIMITS.max_params,
            _flops(graph) / LIMITS.max_flops_per_image,
        )
        assert max(usage) <= 1.0
        closest = max(closest, *usage)
    assert closest > 0.85  # the search pressed against a limit, so the limits were binding


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_pending_and_trained_architectures_are_never_proposed_again(strategy):
    search = make_proposer(_settings(strategy=strategy, seed=2), SEED, LIMITS)
    log = _run(search, 60, workers=5)
    seen: set[str] = set()
    for _, proposal, _, _ in log:
        key = proposal.graph.key()
        if proposal.kind == "arch":
            assert key not in seen
        seen.add(key)


def test_children_inherit_only_from_completed_trials_and_their_hyperparameters():
    search = make_proposer(_settings(seed=1), SEED, LIMITS)
    log = _run(search, 50, workers=4)
    by_id = {t: p for t, p, *_ in log}
    for _, proposal, running, finished in log:
        if proposal.inherit is not None:
            assert proposal.inherit in finished and proposal.inherit not in running
        if proposal.kind == "arch" and proposal.inherit is not None:
            parent = by_id[proposal.inherit]
            assert proposal.parent == proposal.inherit
            assert proposal.hparams == parent.hparams  # the parent's best-known hyperparameters


def test_tune_trials_retrain_a_lineage_with_every_sampled_value():
    search = make_proposer(_settings(seed=5, retune_fraction=0.5), SEED, LIMITS)
    log = _run(search, 40, workers=2)
    roots = {
        (p.parent, tuple((m.kind, m.target, m.source) for m in p.morphs)): p for _, p, *_ in log if p.kind != "tune"
    }
    tunes = [p for _, p, *_ in log if p.kind == "tune"]
    assert len(tunes) == math.floor(0.5 * 39)
    kernels = set()
    for tune in tunes:
        assert tuple(tune.hparams) == HPARAM_KEYS
        root = roots[(tune.parent, tuple((m.kind, m.target, m.source) for m in tune.morphs))]
        assert tune.inherit == root.inherit  # the same starting weights as the trial it repeats
        kernels.add(tune.hparams["kernel_size"])
    assert kernels == {1, 3, 5}
    for _, proposal, *_ in log:
        graph = SEED if proposal.parent is None else next(p for t, p, *_ in log if t == proposal.parent).graph
        for morph in proposal.morphs:
            if morph.kind == "deeper" and len(graph.shape(morph.target)) == 3:
                assert morph.size == proposal.hparams["kernel_size"]
            graph, _ = apply_morph(graph, morph)
        assert graph.key() == proposal.graph.key()  # the morphs rebuild the proposed graph


def test_tpe_learns_the_gain_over_the_lineage_root_even_when_the_root_finishes_last():
    search = AutoMLSearch(_settings(retune_fraction=1.0), SEED, LIMITS)
    seed = search.ask("s")
    tune = search.ask("u")
    assert seed.kind == "seed" and tune.kind == "tune" and tune.graph == SEED
    search.tell("u", 0.70, True)
    assert search.tuner.best() is None  # held: no baseline yet
    search.tell("s", 0.60, True)
    best, gain = search.tuner.best()
    assert best == tune.hparams and gain == pytest.approx(0.10)


def test_a_failed_trial_frees_its_architecture_and_results_are_validated():
    search = make_proposer(_settings(retune_fraction=0.0), SEED, LIMITS)
    search.ask("s")
    child = search.ask("c")
    assert child.graph.key() in search._by_key
    search.forget("c")
    assert child.graph.key() not in search._by_key
    with pytest.raises(NasError, match="already ended"):
        search.tell("c", 0.5, True)
    with pytest.raises(NasError, match="unknown trial"):
        search.tell("nope", 0.5, True)
    with pytest.raises(NasError, match=r"\[0, 1\]"):
        search.tell("s", 1.5, True)
    with pytest.raises(NasError, match="already proposed"):
        search.ask("s")


def test_bad_settings_and_an_oversized_seed_are_one_line_errors():
    with pytest.raises(NasError, match="strategy"):
        SearchSettings(strategy="evolution")
    with pytest.raises(NasError, match="retune_fraction"):
        SearchSettings(retune_fraction=1.5)
    with pytest.raises(NasError, match="exactly the keys"):
        SearchSettings(default_hparams={"learning_rate": 0.1})
    with pytest.raises(NasError, match="over the search limits"):
        make_proposer(_settings(), SEED, Limits(max_layers=2, max_params=10**9, max_flops_per_image=1e15))
    with pytest.raises(NasError, match="max_params"):
        Limits(max_layers=3, max_params=0, max_flops_per_image=1.0)


def _signature(proposal: TrialProposal):
    return (
        proposal.kind,
        proposal.graph.key(),
        proposal.parent,
        proposal.inherit,
        tuple(tuple(m.to_dict().values()) for m in proposal.morphs),
        tuple(proposal.hparams.items()),
    )


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_a_seeded_run_repeats_itself(strategy):
    logs = [_run(make_proposer(_settings(strategy=strategy, seed=9), SEED, LIMITS), 30, workers=1) for _ in range(2)]
    first, second = ([_signature(p) for _, p, *_ in log] for log in logs)
    assert first == second
    assert len({s[1] for s in first}) > 10  # and it did explore


def test_restore_rebuilds_the_search_from_the_ledger():
    original = make_proposer(_settings(seed=6), SEED, LIMITS)
    log = _run(original, 25, workers=3)
    pending = set(original.pending)
    resumed = make_proposer(_settings(seed=6), SEED, LIMITS)
    for trial_id, proposal, *_ in log:
        final = trial_id not in pending
        resumed.restore(trial_id, proposal, _score(proposal.graph) if final else None, final)
    assert resumed.best() == original.best()
    assert set(resumed.pending) == pending
    taken = {p.graph.key() for _, p, *_ in log}
    fresh = [resumed.ask(f"r{k}") for k in range(8)]
    assert all(p.graph.key() not in taken for p in fresh if p.kind == "arch")


def test_the_first_waves_re_tunes_come_first_and_the_share_of_re_tunes_is_kept():
    # 40 workers, a quarter of the asks re-tunes: the first wave's 10 come before its start-up children,
    # then none until the asks catch up, then one in four again. A resumed search goes on alike.
    settings = _settings(seed=2, retune_fraction=0.25, first_wave_tunes=10)
    search = make_proposer(settings, SEED, LIMITS)
    proposals = [search.ask(f"t{k:03d}") for k in range(61)]
    kinds = [str(p.kind) for p in proposals]
    assert kinds[0] == "seed" and kinds[1:11] == ["tune"] * 10 and kinds[11:41] == ["arch"] * 30
    assert kinds[41:61].count("tune") == 5  # one in four from the 41st ask on: 15 of 60 in all
    assert kinds.count("tune") == math.floor(0.25 * 60)

    plain = make_proposer(_settings(seed=2, retune_fraction=0.25), SEED, LIMITS)
    usual = [plain.ask(f"t{k:03d}") for k in range(61)]
    assert [str(p.kind) for p in usual[1:4]] == ["arch"] * 3 and [p.kind for p in usual].count("tune") == 15
    children = [p.graph.key() for p in proposals if p.kind == "arch"]
    assert children == [p.graph.key() for p in usual if p.kind == "arch"], "the same start-up children, in order"

    resumed = make_proposer(settings, SEED, LIMITS)
    for k in range(25):
        resumed.restore(f"t{k:03d}", proposals[k], None, False)
    assert [str(resumed.ask(f"t{k:03d}").kind) for k in range(25, 61)] == kinds[25:]


def test_once_a_trial_has_completed_the_re_tunes_are_not_brought_forward():
    search = make_proposer(_settings(seed=2, retune_fraction=0.25, first_wave_tunes=50), SEED, LIMITS)
    first = search.ask("t000")
    search.tell("t000", _score(first.graph), True)  # the seed completed: the start-up is over
    kinds = [str(search.ask(f"t{k:03d}").kind) for k in range(1, 9)]
    assert kinds.count("tune") == 2, kinds


def _rescanned_status(search: AutoMLSearch, key: str) -> ArchitectureStatus | None:
    """What the search knows of ``key``, recomputed from all of its trials (the rule the aggregates keep)."""
    trials = [t for t in search.book.trials.values() if t.key == key and t.state != "failed"]
    finals = [t.value for t in trials if t.state == "final"]
    if finals:
        return ArchitectureStatus("final", max(finals))
    partial = [t for t in trials if t.value is not None]
    if partial:
        lead = max(partial, key=lambda t: (t.progress, t.value))
        return ArchitectureStatus("partial", lead.value, lead.progress)
    return ArchitectureStatus("pending") if trials else None


def test_running_aggregates_match_a_rescan_of_every_trial():
    search = AutoMLSearch(_settings(seed=3, retune_fraction=0.5), SEED, LIMITS)
    rng = np.random.default_rng(0)
    running, done_roots, forgotten = [], [], 0
    for k in range(60):
        trial_id = f"t{k:03d}"
        running.append((trial_id, search.ask(trial_id)))
        while len(running) > 4:
            trial_id, proposal = running.pop(int(rng.integers(len(running))))
            if rng.random() < 0.15:
                search.forget(trial_id)
                forgotten += 1
                continue
            search.tell(trial_id, 0.5 * _score(proposal.graph), False)
            search.tell(trial_id, _score(proposal.graph), True)  # _score ties often: tie-breaks matter
            if proposal.kind != "tune":
                done_roots.append(trial_id)
        trial_id, _ = running[int(rng.integers(len(running)))]
        search.tell(trial_id, float(rng.uniform(0.2, 0.6)), False)
        for key in {t.key for t in search.book.trials.values()}:
            assert search._status(key) == _rescanned_status(search, key)
        lineage_best = {
            root: max(t.value for t in search.book.trials.values() if t.root == root and t.state == "final")
            for root in done_roots
        }
        assert search._top_roots == heapq.nlargest(3, done_roots, key=lambda r: lineage_best[r])
    assert forgotten and len(done_roots) > 10
    trials_per_key = Counter(t.key for t in search.book.trials.values() if t.state != "failed")
    assert max(trials_per_key.values()) >= 3  # re-tunes repeated architectures


def test_forgetting_the_running_trials_of_a_much_retuned_architecture_does_not_rescan_them_each(monkeypatch):
    """The run's end forgets every running trial in proposal order: with thousands of equal partial results
    on the seed (every start-up tune), finding the next lead after each one was quadratic."""
    search = AutoMLSearch(_settings(retune_fraction=1.0), SEED, LIMITS)
    ids = [f"t{k:03d}" for k in range(200)]
    for trial_id in ids:
        search.ask(trial_id)
    key = search.book.trials[ids[0]].key
    assert {search.book.trials[t].key for t in ids} == {key}  # the seed and its re-tunes
    for trial_id in ids:
        search.tell(trial_id, 0.5, False)  # equal leads
    looked, real = [], search._lead_key
    monkeypatch.setattr(search, "_lead_key", lambda trial_id: looked.append(trial_id) or real(trial_id))
    for trial_id in ids:
        search.forget(trial_id)
        assert search._status(key) == _rescanned_status(search, key)
    assert len(looked) < 2 * len(ids), len(looked)


# --- quality --------------------------------------------------------------------------------


def _features(graph: Graph) -> np.ndarray:
    convs = [n for n in graph.nodes if n.op == "conv"]
    width = sum(n.attrs["filters"] for n in convs)
    kernel = float(np.mean([n.attrs["kernel"][0] for n in convs]))
    return np.array(
        [graph.depth, np.log2(width), graph.count("add"), graph.count("concat"), kernel, np.log10(graph.param_count)]
    )


def _surrogate_objective(seed: int):
    """A fixed random function of the architecture's features, with noise: a bump around the
    features of a random architecture eight morphs from the seed."""
    rng = np.random.default_rng(1000 + seed)
    limits = Limits(max_layers=30, max_params=2_000_000, max_flops_per_image=1e12)
    target_graph, _ = grow(SEED, rng, 8, 3, limits.admits)
    target = _features(target_graph)
    scale = 1.5 * rng.uniform(0.5, 1.5, size=len(target)) * np.array([3.0, 1.0, 1.5, 1.5, 1.0, 0.5])
    noise = np.random.default_rng(2000 + seed)

    def accuracy(graph: Graph) -> float:
        z = (_features(graph) - target) / scale
        return float(np.clip(0.5 + 0.45 * np.exp(-0.5 * z @ z) + noise.normal(0, 0.01), 0.0, 1.0))

    return accuracy, limits


def _best_found(strategy: str, seed: int, evaluations: int = 30, batch: int = 1) -> float:
    accuracy, limits = _surrogate_objective(seed)
    settings = SearchSettings(
        strategy=strategy, seed=seed, retune_fraction=0.0, candidates=24, landmarks=32, batch=batch
    )
    search = make_proposer(settings, SEED, limits)
    best = 0.0
    for k in range(evaluations):
        proposal = search.ask(f"t{k}")
        value = accuracy(proposal.graph)
        best = max(best, value)
        search.tell(f"t{k}", value, True)
    return best


@pytest.mark.slow
def test_bayesian_search_beats_random_search_on_a_surrogate_objective():
    seeds = range(10)
    bayesian = np.mean([_best_found("bayesian", s) for s in seeds])
    random = np.mean([_best_found("random", s) for s in seeds])
    assert bayesian > random + 0.02, (bayesian, random)


def test_a_failed_surrogate_fit_is_recorded_and_the_ask_still_gets_work(monkeypatch):
    from nas.gp import GPError

    search = make_proposer(_settings(retune_fraction=0.0), SEED, LIMITS)
    _run(search, 4, workers=1)
    search.ask("x")

    def broken_fit(*args, **kwargs):
        raise GPError("covariance matrix is not positive definite even with jitter 1e-01")

    monkeypatch.setattr(search.strategy._gp, "fit", broken_fit)
    search.tell("x", 0.7, True)  # new data: the next ask must refit
    proposal = search.ask("next")
    assert proposal.kind == "arch" and proposal.inherit is not None
    assert "surrogate fit failed" in proposal.info["reason"] and "random morphs" in proposal.info["reason"]
    assert search.strategy.stats.failure_count == 1


# --- batched proposals (search.batch) ------------------------------------------------------------


def test_a_batch_of_architectures_is_new_distinct_within_the_limits_and_repeats_with_its_seed():
    logs = [_run(make_proposer(_settings(seed=3, batch=6), SEED, LIMITS), 60, workers=8) for _ in range(2)]
    assert [_signature(p) for _, p, *_ in logs[0]] == [_signature(p) for _, p, *_ in logs[1]]
    seen: set[str] = set()
    batched = 0
    for _, proposal, _running, finished in logs[0]:
        key = proposal.graph.key()
        assert LIMITS.reason(proposal.graph) == ""
        if proposal.kind == "arch":
            assert key not in seen  # never a pending or trained architecture, even from an older batch
            if proposal.inherit is not None:
                assert proposal.inherit in finished  # inherits only what completed
                batched += "batch" in proposal.info
        seen.add(key)
    assert batched >= 20  # the arch asks after start-up came from batches


def test_one_fit_serves_a_whole_batch():
    search = make_proposer(_settings(seed=1, retune_fraction=0.0, batch=8), SEED, LIMITS)
    _run(search, 12, workers=1)
    fits = search.strategy.stats.fits
    proposals = [search.ask(f"b{k}") for k in range(8)]
    assert search.strategy.stats.fits - fits <= 2  # one fit (plus the one that believes the last pending)
    ranks = [p.info["batch"][0] for p in proposals]  # the rest of the last batch, then a new one
    assert ranks.count(0) <= 1 and all(b == a + 1 for a, b in itertools.pairwise(ranks) if b != 0)
    assert len({p.graph.key() for p in proposals}) == 8


def test_a_batch_pick_is_not_a_near_copy_of_an_earlier_pick():
    """GP-BUCB: after the best pick, its twin loses its uncertainty; a distant candidate wins."""
    from nas.bayesian import BayesianMorphSearch, _Node
    from nas.random_search import Origin

    strategy = BayesianMorphSearch(SEED, LIMITS.admits, np.random.default_rng(0), ucb_beta=2.0)
    graphs = [grow(SEED, np.random.default_rng(k), 2, 3, LIMITS.admits)[0] for k in range(3)]
    origin = Origin(SEED.key(), SEED, 0.5, 3)
    nodes = [_Node(g, (), origin, 0.0) for g in graphs]
    strategy._pool = {n.graph.key(): n for n in nodes}
    mean = np.array([0.0, 0.0, 0.0])
    # Candidates 0 and 1 are almost the same point (correlation 0.999); 2 is independent and a bit less uncertain.
    cov = np.array([[1.0, 0.999, 0.0], [0.999, 1.0, 0.0], [0.0, 0.0, 0.81]])
    picks = strategy._pick_batch(nodes, mean, np.sqrt(np.diag(cov)), cov.copy(), 2, 1e-4)
    assert [p[0] for p in picks] == [0, 2]
    plain = strategy._pick_batch(nodes, mean, np.sqrt(np.diag(cov)), None, 2, 1e-4)  # no conditioning: top UCB twice
    assert [p[0] for p in plain] == [0, 1]


@pytest.mark.slow
def test_batched_bayesian_search_still_beats_random_search_on_a_surrogate_objective():
    seeds = range(10)
    batched = np.mean([_best_found("bayesian", s, batch=4) for s in seeds])
    random = np.mean([_best_found("random", s) for s in seeds])
    assert batched > random + 0.02, (batched, random)


def test_start_up_children_cost_about_one_graph_build_each(monkeypatch):
    """A wave of start-up children (nothing completed yet) walks the seed's morph tree: no retry storms."""
    import nas.startup

    builds = 0
    real = nas.startup.try_morph

    def counted(*args, **kwargs):
        nonlocal builds
        builds += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(nas.startup, "try_morph", counted)
    search = make_proposer(_settings(retune_fraction=0.0), SEED, LIMITS)
    proposals = [search.ask(f"t{k}") for k in range(300)]
    children = [p for p in proposals if p.kind == "arch"]
    assert len(children) == 299 and len({p.graph.key() for p in proposals}) == 300
    assert all(LIMITS.reason(p.graph) == "" and p.inherit is None for p in children)
    assert builds <= 2 * len(children), builds
    assert {len(p.morphs) for p in children} >= {1, 2}  # the one-morph neighbourhood, then further out
