"""TPE through Optuna's ask/tell: the space, the proposal form, concurrency, learning, quietness."""

from __future__ import annotations

import math

import pytest

from nas.errors import NasError
from nas.hpo import HyperparameterSpace, HyperparameterTuner, normalise_hparams
from nas.proposer import HPARAM_KEYS

SPACE = HyperparameterSpace(
    learning_rate=(1e-3, 0.2),
    weight_decay=(1e-6, 1e-2),
    dropout=(0.0, 0.5),
    batch_sizes=(32, 64, 128),
    kernel_sizes=(1, 3, 5),
    epochs=(1, 4),
)


def _inside(h: dict) -> bool:
    return (
        SPACE.learning_rate[0] <= h["learning_rate"] <= SPACE.learning_rate[1]
        and SPACE.weight_decay[0] <= h["weight_decay"] <= SPACE.weight_decay[1]
        and SPACE.dropout[0] <= h["dropout"] <= SPACE.dropout[1]
        and h["batch_size"] in SPACE.batch_sizes
        and h["kernel_size"] in SPACE.kernel_sizes
        and SPACE.epochs[0] <= h["epochs"] <= SPACE.epochs[1]
    )


def test_asks_carry_exactly_the_trainer_keys_as_plain_values_inside_the_space():
    tuner = HyperparameterTuner(SPACE, seed=0)
    for k in range(15):
        h = tuner.ask(f"t{k}")
        assert tuple(h) == HPARAM_KEYS
        assert [type(h[key]) for key in HPARAM_KEYS] == [float, int, float, float, int, int]
        assert _inside(h)
        tuner.tell(f"t{k}", 0.5)


def test_concurrent_asks_differ():
    tuner = HyperparameterTuner(SPACE, seed=0)
    for k in range(12):  # past TPE's random start-up phase
        tuner.ask(f"w{k}")
        tuner.tell(f"w{k}", 0.1 * (k % 5))
    pending = [tuner.ask(f"p{k}") for k in range(8)]
    assert len({h["learning_rate"] for h in pending}) == 8


def test_same_seed_same_samples():
    def run():
        tuner = HyperparameterTuner(SPACE, seed=7)
        out = []
        for k in range(14):
            h = tuner.ask(f"t{k}")
            out.append(h)
            tuner.tell(f"t{k}", -abs(math.log10(h["learning_rate"]) + 1.5))
        return out

    assert run() == run()


def test_tpe_concentrates_where_results_are_good():
    tuner = HyperparameterTuner(SPACE, seed=3)
    distances = []
    for k in range(60):
        h = tuner.ask(f"t{k}")
        gap = abs(math.log10(h["learning_rate"]) - math.log10(0.05))
        distances.append(gap)
        tuner.tell(f"t{k}", 1.0 - gap)
    assert sum(distances[-20:]) / 20 < 0.5 * sum(distances[:10]) / 10
    best, value = tuner.best()
    assert abs(math.log10(best["learning_rate"]) - math.log10(0.05)) < 0.1 and value > 0.9


def test_failed_trials_and_restored_trials():
    tuner = HyperparameterTuner(SPACE, seed=0)
    tuner.ask("a")
    tuner.fail("a")
    assert not tuner.is_running("a") and tuner.completed == 0
    good = {
        "learning_rate": 0.01,
        "batch_size": 64,
        "weight_decay": 1e-4,
        "dropout": 0.1,
        "kernel_size": 3,
        "epochs": 2,
    }
    assert tuner.add_completed(good, 0.7)
    assert not tuner.add_completed({**good, "batch_size": 4096}, 0.9)  # outside today's space
    assert tuner.completed == 1
    assert tuner.best() == (good, 0.7)


def test_optuna_stays_quiet(capfd):
    tuner = HyperparameterTuner(SPACE, seed=0)
    for k in range(3):
        tuner.ask(f"t{k}")
        tuner.tell(f"t{k}", 0.5)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"learning_rate": (0.0, 0.1)}, "positive"),
        ({"dropout": (0.2, 1.0)}, "dropout"),
        ({"kernel_sizes": (2, 3)}, "odd"),
        ({"batch_sizes": ()}, "non-empty"),
        ({"epochs": (3, 1)}, "exceeds"),
        ({"epochs": (0, 2)}, "epochs"),
    ],
)
def test_bad_spaces_are_one_line_errors(changes, message):
    with pytest.raises(NasError, match=message):
        HyperparameterSpace(**changes)


def test_space_normalisation_and_hparam_validation():
    space = HyperparameterSpace(learning_rate=[0.001, 0.1], batch_sizes=[64, 32], kernel_sizes=[3], epochs=[2, 2])
    assert space.batch_sizes == (32, 64) and space.learning_rate == (0.001, 0.1)
    with pytest.raises(NasError, match="exactly the keys"):
        normalise_hparams({"learning_rate": 0.1})
    with pytest.raises(NasError, match="odd"):
        normalise_hparams(
            {"learning_rate": 0.1, "batch_size": 8, "weight_decay": 0.0, "dropout": 0.0, "kernel_size": 4, "epochs": 1}
        )


SMALL_HISTORY = {"keep_best": 4, "keep_recent": 8, "keep_running": 4, "rebuild_every": 8}


def _objective(h: dict) -> float:
    return 1.0 - abs(math.log10(h["learning_rate"]) - math.log10(0.05))


def test_the_study_stays_bounded_and_keeps_the_best_and_the_latest_results():
    tuner = HyperparameterTuner(SPACE, seed=1, **SMALL_HISTORY)
    running, told = [], []
    for k in range(150):
        running.append((f"t{k}", tuner.ask(f"t{k}")))
        if len(running) > 6:  # six trials in flight, as under a busy master
            trial_id, h = running.pop(0)
            value = _objective(h)
            tuner.tell(trial_id, value)
            told.append((value, h))
        assert tuner.study_trials == len(tuner._study.get_trials(deepcopy=False)) <= 4 + 8 + 4 + 8
    assert tuner.rebuilds >= 10
    assert tuner.completed == len(told)
    top_value, top_params = max(told, key=lambda t: t[0])
    assert tuner.best() == (top_params, top_value)  # over the whole history, not only what the study holds
    in_study = sorted(t.value for t in tuner._study.get_trials(deepcopy=False) if t.value is not None)
    assert in_study[-4:] == sorted(v for v, _ in told)[-4:]  # the best four are always kept
    assert {_objective(h) for _, h in told[-8:]} <= set(in_study)  # and the latest results


def test_trials_asked_before_a_rebuild_can_still_be_told_or_failed():
    tuner = HyperparameterTuner(SPACE, seed=2, **SMALL_HISTORY)
    early = [tuner.ask(f"early{k}") for k in range(6)]
    for k in range(40):
        tuner.ask(f"t{k}")
        tuner.tell(f"t{k}", 0.1)
    assert tuner.rebuilds >= 2
    assert all(tuner.is_running(f"early{k}") for k in range(6))
    tuner.tell("early0", 0.9)  # left out of the rebuilt study: its result is added to it
    tuner.fail("early1")
    assert tuner.completed == 41 and not tuner.is_running("early1")
    assert tuner.best() == (early[0], 0.9)
    assert 0.9 in {t.value for t in tuner._study.get_trials(deepcopy=False)}
    with pytest.raises(NasError, match="not running"):
        tuner.tell("early1", 0.5)


def test_same_seed_same_samples_across_rebuilds():
    def run():
        tuner = HyperparameterTuner(SPACE, seed=7, **SMALL_HISTORY)
        out, running = [], []
        for k in range(60):
            running.append((f"t{k}", tuner.ask(f"t{k}")))
            out.append(running[-1][1])
            if len(running) > 3:
                trial_id, h = running.pop(0)
                tuner.tell(trial_id, _objective(h))
        return out, tuner.rebuilds

    first, rebuilds = run()
    assert rebuilds > 0
    assert run() == (first, rebuilds)


def test_tpe_still_learns_with_a_bounded_history():
    tuner = HyperparameterTuner(SPACE, seed=3, keep_best=8, keep_recent=16, keep_running=4, rebuild_every=8)
    gaps = []
    for k in range(90):
        h = tuner.ask(f"t{k}")
        gaps.append(1.0 - _objective(h))
        tuner.tell(f"t{k}", _objective(h))
    assert tuner.rebuilds >= 5
    assert sum(gaps[-20:]) / 20 < 0.5 * sum(gaps[:10]) / 10


def test_bad_history_bounds_are_one_line_errors():
    with pytest.raises(NasError, match="keep_best"):
        HyperparameterTuner(SPACE, seed=0, keep_best=0)
    with pytest.raises(NasError, match="rebuild_every"):
        HyperparameterTuner(SPACE, seed=0, rebuild_every=1.5)


def test_asks_before_any_result_are_uniform_draws_over_the_space_as_tpe_would_make_them():
    """Start-up asks are sampled outside Optuna: independent, uniform on the log scale where the space is."""
    tuner = HyperparameterTuner(SPACE, seed=5)
    draws = [tuner.ask(f"s{k}") for k in range(4000)]
    assert all(_inside(h) for h in draws) and tuner.study_trials == 0  # none went through Optuna
    logs = sorted(math.log(h["learning_rate"]) for h in draws)
    middle = (math.log(SPACE.learning_rate[0]) + math.log(SPACE.learning_rate[1])) / 2
    assert abs(logs[len(logs) // 2] - middle) < 0.15  # the median of a log-uniform draw
    dropouts = sorted(h["dropout"] for h in draws)
    assert abs(dropouts[len(dropouts) // 2] - 0.25) < 0.02
    for key, choices in (("batch_size", SPACE.batch_sizes), ("kernel_size", SPACE.kernel_sizes)):
        counts = [sum(h[key] == c for h in draws) for c in choices]
        assert min(counts) > 0.8 * len(draws) / len(choices), (key, counts)
    assert {h["epochs"] for h in draws} == set(range(SPACE.epochs[0], SPACE.epochs[1] + 1))
    assert len({h["learning_rate"] for h in draws}) == len(draws)
    again = HyperparameterTuner(SPACE, seed=5)
    assert [again.ask(f"s{k}") for k in range(50)] == draws[:50]


def test_once_results_arrive_tpe_models_them_and_the_trials_still_running_are_its_lies():
    tuner = HyperparameterTuner(SPACE, seed=9)
    early = [f"s{k}" for k in range(300)]
    for trial in early:
        tuner.ask(trial)
    for trial in early[:10]:  # enough results for TPE; 290 trials asked outside the study still run
        tuner.tell(trial, 0.5)
    tuner.ask("first-tpe")
    running = [t for t in tuner._study.trials if t.state.name == "RUNNING"]
    # The latest of the outside trials (up to keep_running) joined the study as lies, plus the new ask.
    assert len(running) == 128 + 1
    for trial in early[10:]:  # every outside trial can still be told or failed
        if trial.endswith("7"):
            tuner.tell(trial, 0.4)
        else:
            tuner.fail(trial)
    assert tuner.completed == 10 + sum(t.endswith("7") for t in early[10:])
    # and TPE learns from then on: the later asks gather where results are good
    tuner.fail("first-tpe")
    gaps = []
    for k in range(60):
        h = tuner.ask(f"t{k}")
        gaps.append(abs(math.log10(h["learning_rate"]) - math.log10(0.05)))
        tuner.tell(f"t{k}", 1.0 - gaps[-1])
    assert sum(gaps[-20:]) / 20 < 0.5 * sum(gaps[:10]) / 10
