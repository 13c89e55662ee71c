"""The LM architecture search: policy, limits, inheritance, TPE re-tunes, determinism, resume, quality."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nas.errors import NasError
from nas.gp import GaussianProcess, GPError
from nas.language.flops import transformer_flops
from nas.language.hpo import LM_HPARAM_KEYS, LMHyperparameterSpace
from nas.language.morph import apply_spec_morph
from nas.language.search import LMLimits, LMSearch, LMSearchSettings, LMTrialProposal, make_lm_search
from nas.language.spec import TransformerSpec, seed_spec

SEED = seed_spec()  # 2 blocks, width 128, 4 heads of 32, MLP 512; 0.33 M params, 2.1 M training FLOPs per token
SPACE = LMHyperparameterSpace(batch_sizes=(16, 32, 64), seq_lens=(64, 128), epochs=(1, 3), max_batch_tokens=4096)
LIMITS = LMLimits(max_blocks=6, max_params=3_000_000, max_train_flops_per_token=2.5e7)


def _settings(**changes) -> LMSearchSettings:
    base = {"seed": 0, "candidates": 24, "landmarks": 12, "hparam_space": SPACE}
    return LMSearchSettings(**{**base, **changes})


def _score(spec: TransformerSpec) -> float:
    """A stand-in for minus validation bits per byte: best at width 512, 6 blocks, MLP 4x width."""
    width = math.log2(spec.width / 512)
    depth = (spec.n_blocks - 6) / 2
    mlp = math.log2(float(np.mean(spec.mlp_hidden)) / (4 * spec.width))
    return -(width * width) - depth * depth - 0.25 * mlp * mlp


def _run(search: LMSearch, trials: int, workers: int, score=_score):
    """Ask/tell like a master with ``workers`` busy workers: each trial ends ``workers`` asks later."""
    log, running = [], []
    for k in range(trials):
        trial_id = f"t{k:03d}"
        proposal = search.ask(trial_id)
        finished = {t for t, *_ in log} - {t for t, _ in running}
        log.append((trial_id, proposal, {t for t, _ in running}, finished))
        running.append((trial_id, proposal))
        if len(running) >= workers:
            done_id, done = running.pop(0)
            search.tell(done_id, score(done.spec) - 0.5, False)
            search.tell(done_id, score(done.spec), True)
    return log


def _signature(p: LMTrialProposal):
    return (p.kind, p.spec.key(), p.parent, p.inherit, p.morphs, tuple(p.hparams.items()))


def test_the_first_ask_is_the_seed_and_start_up_children_train_from_scratch():
    search = make_lm_search(_settings(), SEED, LIMITS)
    first = search.ask("t0")
    assert first.kind == "seed" and first.spec == SEED and first.parent is None and first.morphs == ()
    assert first.hparams == dict(_settings().default_hparams)
    proposals = [search.ask(f"t{k}") for k in range(1, 30)]
    archs = [p for p in proposals if p.kind == "arch"]
    tunes = [p for p in proposals if p.kind == "tune"]
    assert len(tunes) == math.floor(0.25 * 29)
    assert all(t.spec == SEED and t.parent is None and t.inherit is None for t in tunes)
    assert all(a.parent == "t0" and a.inherit is None and 1 <= len(a.morphs) <= 3 for a in archs)
    assert len({a.spec.key() for a in archs}) == len(archs) and SEED.key() not in {a.spec.key() for a in archs}
    depths = [len(a.morphs) for a in archs]
    assert depths == sorted(depths) and depths[0] == 1  # breadth first: every one-morph child before two


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_asks_in_a_row_give_distinct_new_architectures(strategy):
    search = make_lm_search(_settings(strategy=strategy, retune_fraction=0.0), SEED, LIMITS)
    trained = {p.spec.key() for _, p, *_ in _run(search, 6, workers=1)}
    proposals = [search.ask(f"n{k}") for k in range(15)]
    keys = [p.spec.key() for p in proposals]
    assert len(set(keys)) == 15 and not set(keys) & trained
    assert all(p.kind == "arch" and p.inherit is not None for p in proposals)


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_limits_are_never_exceeded_and_are_binding(strategy):
    search = make_lm_search(_settings(strategy=strategy, seed=4), SEED, LIMITS)
    closest = 0.0
    for _, proposal, *_ in _run(search, 40, workers=3):
        spec = proposal.spec
        usage = (
            spec.n_blocks / LIMITS.max_blocks,
            spec.params() / LIMITS.max_params,
            transformer_flops(spec).training() / LIMITS.max_train_flops_per_token,
        )
        assert max(usage) <= 1.0 and LIMITS.reason(spec) == ""
        closest = max(closest, *usage)
    assert closest > 0.8  # the search pressed against a limit


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_children_inherit_only_from_completed_trials_and_their_morphs_rebuild_the_spec(strategy):
    search = make_lm_search(_settings(strategy=strategy, seed=1), SEED, LIMITS)
    log = _run(search, 40, workers=4)
    by_id = {t: p for t, p, *_ in log}
    seen: set[str] = set()
    for _, proposal, running, finished in log:
        if proposal.inherit is not None:
            assert proposal.inherit in finished and proposal.inherit not in running
        if proposal.kind == "arch":
            assert proposal.spec.key() not in seen  # never an architecture pending or trained
            if proposal.inherit is not None:
                assert proposal.parent == proposal.inherit
                assert proposal.hparams == by_id[proposal.inherit].hparams
                assert 1 <= len(proposal.morphs) <= 2
        seen.add(proposal.spec.key())
        spec = SEED if proposal.parent is None else by_id[proposal.parent].spec
        for morph in proposal.morphs:
            spec = apply_spec_morph(spec, morph)
        assert spec == proposal.spec


def test_re_tunes_repeat_a_lineage_with_tpe_samples_inside_the_space():
    search = make_lm_search(_settings(seed=5, retune_fraction=0.5), SEED, LIMITS)
    log = _run(search, 40, workers=2)
    roots = {(p.parent, p.morphs): (t, p) for t, p, *_ in log if p.kind != "tune"}
    tunes = [p for _, p, *_ in log if p.kind == "tune"]
    assert len(tunes) == math.floor(0.5 * 39)
    for tune in tunes:
        assert tuple(tune.hparams) == LM_HPARAM_KEYS and SPACE.contains(tune.hparams)
        root_id, root = roots[(tune.parent, tune.morphs)]
        assert tune.info["retunes"] == root_id
        assert (tune.spec, tune.inherit) == (root.spec, root.inherit)
    assert len({t.hparams["learning_rate"] for t in tunes}) == len(tunes)  # sampled, not copied
    assert len({t.info["retunes"] for t in tunes}) >= 3  # several good lineages


def test_tpe_learns_the_gain_over_the_lineage_root_even_when_the_root_finishes_last():
    search = LMSearch(_settings(retune_fraction=1.0), SEED, LIMITS)
    search.ask("s")
    tune = search.ask("u")
    assert tune.kind == "tune" and tune.spec == SEED
    search.tell("u", -1.2, True)
    assert search.tuner.best() is None  # held: no baseline yet
    search.tell("s", -1.5, True)
    best, gain = search.tuner.best()  # type: ignore[misc]
    assert best == tune.hparams and gain == pytest.approx(0.3)


@pytest.mark.parametrize("strategy", ["bayesian", "random"])
def test_a_seeded_run_repeats_itself_exactly(strategy):
    runs = [_run(make_lm_search(_settings(strategy=strategy, seed=9), SEED, LIMITS), 30, workers=2) for _ in range(2)]
    first, second = ([_signature(p) for _, p, *_ in log] for log in runs)
    assert first == second
    assert [p.info for _, p, *_ in runs[0]] == [p.info for _, p, *_ in runs[1]]
    other_log = _run(make_lm_search(_settings(strategy=strategy, seed=10), SEED, LIMITS), 30, workers=2)
    other = [_signature(p) for _, p, *_ in other_log]
    assert other != first and len({s[1] for s in first}) > 15


def _state(search: LMSearch):
    archs = {
        key: (a.spec, sorted(a.running), a.best_final, a.best_trial, a.lead, a.fantasy)
        for key, a in search._archs.items()
    }
    return (
        archs,
        search.book.roots,
        search.book.lineage_best,
        search.book.tunes_per_root,
        search.book.asks,
        search.book.tunes,
        search.pending,
        search.best(),
        search.tuner.completed,
        search.tuner.best(),
    )


def test_restore_from_a_json_ledger_gives_the_state_asking_gave():
    original = make_lm_search(_settings(seed=6, retune_fraction=0.3), SEED, LIMITS)
    log = _run(original, 30, workers=3)
    pending = set(original.pending)
    resumed = make_lm_search(_settings(seed=6, retune_fraction=0.3), SEED, LIMITS)
    for trial_id, proposal, *_ in log:
        read_back = LMTrialProposal.from_dict(json.loads(json.dumps(proposal.to_dict())))
        assert _signature(read_back) == _signature(proposal)
        final = trial_id not in pending
        if final:
            resumed.restore(trial_id, read_back, _score(proposal.spec) - 0.5, False)
            resumed.tell(trial_id, _score(proposal.spec), True)
        else:
            resumed.restore(trial_id, read_back, None, False)
    assert _state(resumed) == _state(original)
    taken = {p.spec.key() for _, p, *_ in log}
    fresh = [resumed.ask(f"r{k}") for k in range(6)]
    assert all(p.spec.key() not in taken for p in fresh if p.kind == "arch")
    assert all(p.inherit is None or p.inherit in {t for t, *_ in log} - pending for p in fresh)


def test_forget_frees_an_architecture_and_results_are_validated():
    search = make_lm_search(_settings(retune_fraction=0.0), SEED, LIMITS)
    search.ask("s")
    child = search.ask("c")
    assert search._taken(child.spec.key())
    search.forget("c")
    assert not search._taken(child.spec.key())
    with pytest.raises(NasError, match="already ended"):
        search.tell("c", 0.5, True)
    with pytest.raises(NasError, match="unknown trial"):
        search.tell("nope", 0.5, True)
    with pytest.raises(NasError, match="finite"):
        search.tell("s", float("nan"), True)
    with pytest.raises(NasError, match="already proposed"):
        search.ask("s")
    search.tell("s", -2.0, True)
    again = [search.ask(f"a{k}") for k in range(40)]  # the freed child is proposable again
    assert child.spec.key() in {p.spec.key() for p in again}


def test_a_failed_surrogate_fit_falls_back_to_random_morphs(monkeypatch):
    search = make_lm_search(_settings(retune_fraction=0.0), SEED, LIMITS)
    _run(search, 5, workers=1)

    def broken(*args, **kwargs):
        raise GPError("covariance matrix is not positive definite")

    monkeypatch.setattr(GaussianProcess, "fit", broken)
    proposal = search.ask("x")
    assert proposal.kind == "arch" and proposal.inherit is not None
    assert "surrogate fit failed" in proposal.info["reason"]
    assert search.surrogate is not None and search.surrogate.failures


def test_bad_settings_limits_and_ledger_entries_are_one_line_errors():
    for changes, field in (
        ({"strategy": "evolution"}, "strategy"),
        ({"retune_fraction": 1.5}, "retune_fraction"),
        ({"max_morphs_per_child": 0}, "max_morphs_per_child"),
        ({"candidates": True}, "candidates"),
        ({"widen_factor": 1.0}, "widen_factor"),
        ({"default_hparams": {"learning_rate": 0.1}}, "exactly the keys"),
        ({"hparam_space": {}}, "hparam_space"),
    ):
        with pytest.raises(NasError, match=field):
            _settings(**changes)
    with pytest.raises(NasError, match="max_blocks"):
        LMLimits(max_blocks=0, max_params=1, max_train_flops_per_token=1.0)
    with pytest.raises(NasError, match="max_train_flops_per_token"):
        LMLimits(max_blocks=1, max_params=1, max_train_flops_per_token=float("inf"))
    with pytest.raises(NasError, match="over the search limits"):
        make_lm_search(_settings(), SEED, LMLimits(max_blocks=1, max_params=10**9, max_train_flops_per_token=1e12))
    short = TransformerSpec(256, 32, 128, 32, (4,), (512,))
    with pytest.raises(NasError, match="seq_lens"):
        make_lm_search(_settings(), short, LIMITS)
    good = make_lm_search(_settings(), SEED, LIMITS).ask("t0").to_dict()
    for change, field in (
        ({"kind": "grow"}, "kind"),
        ({"kind": ["seed"]}, "kind"),
        ({"extra": 1}, "unknown key"),
        ({"parent": 3}, "parent"),
        ({"morphs": [{"kind": "deeper", "block": -1}]}, "block"),
        ({"hparams": {**good["hparams"], "epochs": 0}}, "epochs"),
        ({"spec": {**good["spec"], "width": "wide"}}, "width"),
    ):
        with pytest.raises(NasError, match=field):
            LMTrialProposal.from_dict({**good, **change})
    search = make_lm_search(_settings(), SEED, LIMITS)
    with pytest.raises(NasError, match="spec must be a TransformerSpec"):
        search.restore("t0", LMTrialProposal("spec", "seed", dict(good["hparams"])), None, False)  # type: ignore[arg-type]


def _best_found(strategy: str, seed: int, evaluations: int = 30) -> float:
    limits = LMLimits(max_blocks=10, max_params=20_000_000, max_train_flops_per_token=2e8)
    settings = LMSearchSettings(strategy=strategy, seed=seed, retune_fraction=0.0, candidates=32, landmarks=16)
    search = make_lm_search(settings, SEED, limits)
    best = -math.inf
    for k in range(evaluations):
        proposal = search.ask(f"t{k}")
        value = _score(proposal.spec)
        best = max(best, value)
        search.tell(f"t{k}", value, True)
    return best


def test_the_gp_search_beats_random_morphs_on_a_synthetic_objective():
    # Best score in 30 sequential trials (optimum 0, seed -8), seeds 0-4, measured:
    #   bayesian [-0.000 -0.280 -0.250 -0.009 -0.003] mean -0.109
    #   random   [-1.501 -1.276 -0.790 -0.500 -0.399] mean -0.893
    # (seeds 5-9: bayesian -0.018, random -1.139.)
    seeds = range(5)
    bayesian = float(np.mean([_best_found("bayesian", s) for s in seeds]))
    random = float(np.mean([_best_found("random", s) for s in seeds]))
    assert bayesian > random + 0.5, (bayesian, random)
