"""Validity rules: a valid run, then each rule failing on purpose."""

from __future__ import annotations

import copy

import pytest

from aiperf.errors import AiperfError
from aiperf.metrics.rules import evaluate_rules
from aiperf.metrics.score import compute_score

RULES = {"min_accuracy": 0.95, "official_min_duration_s": 3600.0, "min_precision_bits": 16}


def run(acc=0.97, precision="mixed_bfloat16", disjoint=True, last_t=4000.0, rules=None, backend="jax"):
    records = [
        {
            "type": "run_start",
            "t": 0.0,
            "rules": dict(RULES if rules is None else rules),
            "dataset": {"name": "mnist", "split": {"method": "random", "seed": 0, "disjoint": disjoint}},
            "plan": {"backend": backend},
        },
        {"type": "trial_start", "t": 1.0, "trial": "t00000"},
        {
            "type": "epoch",
            "t": 100.0,
            "trial": "t00000",
            "epoch": 1,
            "ops": 1e12,
            "val_acc": 0.5,
            "precision": "float32",
        },
        {
            "type": "epoch",
            "t": last_t,
            "trial": "t00000",
            "epoch": 2,
            "ops": 1e12,
            "val_acc": acc,
            "precision": precision,
        },
        {"type": "run_stop", "t": last_t + 5},
    ]
    return records


def by_name(verdict):
    return {r.name: r for r in verdict.rules}


def test_a_good_long_run_is_valid_and_official():
    v = evaluate_rules(run())
    assert (v.valid, v.official, v.headline()) == (True, True, "valid")
    assert all(r.passed for r in v.rules)
    assert [r.name for r in v.rules] == [
        "accuracy",
        "precision",
        "held-out evaluation",
        "completed epochs",
        "real training",
        "official duration",
    ]
    assert by_name(v)["accuracy"].measured == "0.97"
    assert by_name(v)["precision"].measured == "mixed_bfloat16"  # weaker than the other epoch's float32


def test_low_accuracy_is_invalid():
    v = evaluate_rules(run(acc=0.91))
    assert not v.valid and not v.official
    assert not by_name(v)["accuracy"].passed
    assert v.headline() == "invalid: accuracy 0.91 < 0.95"


def test_accuracy_just_below_the_threshold_is_not_rounded_up():
    v = evaluate_rules(run(acc=0.94999))
    assert v.headline() == "invalid: accuracy 0.94999 < 0.95"


@pytest.mark.parametrize("policy", ["int8", "mixed_int8", "float8_e4m3fn", "uint8"])
def test_sub_16_bit_or_integer_training_is_invalid(policy):
    v = evaluate_rules(run(precision=policy))
    assert not by_name(v)["precision"].passed
    assert by_name(v)["precision"].measured == policy
    assert v.headline() == f"invalid: precision {policy} < 16-bit float"


def test_an_epoch_without_a_recorded_precision_is_invalid():
    records = run()
    del records[2]["precision"]
    v = evaluate_rules(records)
    assert by_name(v)["precision"].measured == "unrecorded"
    assert not v.valid


def test_a_stricter_precision_threshold_rejects_16_bit():
    v = evaluate_rules(run(rules={**RULES, "min_precision_bits": 32}))
    assert v.headline() == "invalid: precision mixed_bfloat16 < 32-bit float"
    wide = evaluate_rules(run(precision="float64", rules={**RULES, "min_precision_bits": 32}))
    assert wide.valid
    assert by_name(wide)["precision"].measured == "float32"  # the weakest of float32 and float64


@pytest.mark.parametrize(("disjoint", "measured"), [(False, "overlapping"), (None, "not recorded")])
def test_evaluation_must_be_on_the_held_out_split(disjoint, measured):
    v = evaluate_rules(run(disjoint=disjoint))
    rule = by_name(v)["held-out evaluation"]
    assert (rule.passed, rule.measured) == (False, measured)
    assert v.headline() == f"invalid: evaluation split {measured}, must be disjoint from training"


def test_a_run_without_completed_epochs_is_invalid():
    records = [r for r in run() if r["type"] != "epoch"]
    v = evaluate_rules(records)
    assert not by_name(v)["completed epochs"].passed
    assert v.headline() == (
        "invalid: accuracy none < 0.95; precision none recorded < 16-bit float; completed epochs 0 < 1"
    )


def test_a_simulated_run_is_never_valid():
    v = evaluate_rules(run(backend="simulated"))
    assert not v.valid and not v.official
    assert by_name(v)["real training"].measured == "simulated"
    assert v.headline() == "invalid: backend simulated, not real training"


def test_a_short_run_is_valid_but_unofficial():
    v = evaluate_rules(run(last_t=300.0))
    assert (v.valid, v.official) == (True, False)
    assert v.headline() == "valid (unofficial: run 300 s < 3600 s)"


def test_a_run_just_short_of_the_minimum_never_prints_as_equal():
    v = evaluate_rules(run(last_t=3599.96))
    assert v.headline() == "valid (unofficial: run 3599.9 s < 3600 s)"


def test_several_failures_are_all_listed_and_an_invalid_run_is_never_official():
    v = evaluate_rules(run(acc=0.91, precision="int8", last_t=300.0))
    assert v.headline() == "invalid: accuracy 0.91 < 0.95; precision int8 < 16-bit float"
    assert not v.official


def test_thresholds_come_from_the_ledger():
    lenient = {"min_accuracy": 0.9, "official_min_duration_s": 60.0, "min_precision_bits": 16}
    v = evaluate_rules(run(acc=0.91, last_t=300.0, rules=lenient))
    assert (v.valid, v.official) == (True, True)


def test_a_given_score_is_used_as_is():
    records = run()
    score = compute_score(records)
    assert evaluate_rules(records, score) == evaluate_rules(records)


def test_to_dict_lists_every_rule_and_the_headline():
    d = evaluate_rules(run(acc=0.91)).to_dict()
    assert d["valid"] is False and d["headline"] == "invalid: accuracy 0.91 < 0.95"
    assert len(d["rules"]) == 6 and {"name", "passed", "measured", "required"} <= set(d["rules"][0])


def test_a_ledger_without_a_header_or_with_bad_thresholds_is_a_one_line_error():
    with pytest.raises(AiperfError, match="no run_start"):
        evaluate_rules(run()[1:])
    bad = copy.deepcopy(run())
    bad[0]["rules"]["min_accuracy"] = 2.0
    with pytest.raises(AiperfError, match="min_accuracy"):
        evaluate_rules(bad)
