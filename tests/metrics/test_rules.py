"""Validity rules: a valid run, then each rule failing on purpose; workloads and custom rules."""

from __future__ import annotations

import copy

import pytest

from aiperf.config import BUILTIN_CONFIGS, load_config
from aiperf.errors import AiperfError
from aiperf.ledger.schema import AuditRecord, EpochRecord, RunStartRecord, RunStopRecord, TrialStartRecord
from aiperf.metrics.rules import evaluate_rules
from aiperf.metrics.score import compute_score
from aiperf.metrics.workloads import WORKLOADS, identify

RULES = {"min_accuracy": 0.7, "official_min_duration_s": 3600.0, "min_precision_bits": 16}  # imagenet's


def trial_start(t, trial):
    return TrialStartRecord(t=t, trial=trial, kind="seed", arch_id="a", flops={"train_per_image": 1.0}, params=1)


def run(acc=0.97, precision="mixed_bfloat16", disjoint=True, last_t=4000.0, rules=None, backend="jax", stop=True):
    """An ``imagenet`` run (the official workload) of two epochs."""
    records = [
        RunStartRecord(
            t=0.0,
            run_id="r",
            config={
                "run": {"name": "imagenet"},
                "dataset": {"name": "image_folder"},
                "search": {"size_growth": 2.0, "size_band": 1.5},
            },
            rules=dict(RULES if rules is None else rules),
            dataset={
                "name": "image_folder",
                "train_images": 1_281_167,
                "eval_images": 50_000,
                "split": {"method": "folders", "seed": 0, "disjoint": disjoint},
            },
            plan={"backend": backend},
        ),
        trial_start(1.0, "t00000"),
        EpochRecord(t=100.0, trial="t00000", epoch=1, ops=1e12, val_acc=0.5, precision="float32"),
        EpochRecord(t=last_t, trial="t00000", epoch=2, ops=1e12, val_acc=acc, precision=precision),
        RunStopRecord(t=last_t, status="completed"),  # the run ends with its last epoch: last_t is its duration
    ]
    return records if stop else records[:-1]


def edit_header(records, edit):
    """``records`` with their run_start rebuilt from its fields after ``edit`` changed them."""
    fields = copy.deepcopy(records[0].to_dict())
    edit(fields)
    records[0] = RunStartRecord(**fields)
    return records


def by_name(verdict):
    return {r.name: r for r in verdict.rules}


def test_a_good_long_run_is_valid_and_official():
    v = evaluate_rules(run())
    assert (v.valid, v.official, v.headline()) == (True, True, "valid (official)")
    assert (v.workload, v.comparable, v.custom) == ("imagenet", True, ())
    assert all(r.passed for r in v.rules)
    assert [r.name for r in v.rules] == [
        "accuracy",
        "precision",
        "held-out evaluation",
        "completed epochs",
        "real training",
        "recorded end",
        "official duration",
    ]
    assert by_name(v)["accuracy"].measured == "0.97"
    assert by_name(v)["precision"].measured == "mixed_bfloat16"  # weaker than the other epoch's float32


def test_low_accuracy_is_invalid():
    v = evaluate_rules(run(acc=0.61))
    assert not v.valid and not v.official
    assert not by_name(v)["accuracy"].passed
    assert v.headline() == "invalid: best validation top-1 0.61 < 0.7 required"


def test_accuracy_just_below_the_threshold_is_not_rounded_up():
    v = evaluate_rules(run(acc=0.69999))
    assert v.headline() == "invalid: best validation top-1 0.69999 < 0.7 required"


@pytest.mark.parametrize("policy", ["int8", "mixed_int8", "float8_e4m3fn", "uint8"])
def test_sub_16_bit_or_integer_training_is_invalid(policy):
    v = evaluate_rules(run(precision=policy))
    assert not by_name(v)["precision"].passed
    assert by_name(v)["precision"].measured == policy
    assert v.headline().startswith(f"invalid: weakest precision {policy} (")
    assert v.headline().endswith("< 16-bit float required")


def test_an_epoch_without_a_recorded_precision_is_invalid():
    records = run()
    records[2] = records[2].model_copy(update={"precision": None})  # unchecked: the shape requires one
    v = evaluate_rules(records)
    assert by_name(v)["precision"].measured == "unrecorded"
    assert not v.valid


def test_a_stricter_precision_threshold_rejects_16_bit():
    v = evaluate_rules(run(rules={**RULES, "min_precision_bits": 32}))
    assert v.headline() == (
        "invalid: weakest precision mixed_bfloat16 (16-bit float) < 32-bit float required; "
        "custom rules: not comparable (rules.min_precision_bits 32 instead of 16)"
    )
    wide = evaluate_rules(run(precision="float64", rules={**RULES, "min_precision_bits": 32}))
    assert wide.valid
    assert by_name(wide)["precision"].measured == "float32"  # the weakest of float32 and float64


@pytest.mark.parametrize(("disjoint", "measured"), [(False, "overlapping"), (None, "not recorded")])
def test_evaluation_must_be_on_the_held_out_split(disjoint, measured):
    v = evaluate_rules(run(disjoint=disjoint))
    rule = by_name(v)["held-out evaluation"]
    assert (rule.passed, rule.measured) == (False, measured)
    assert v.headline() == f"invalid: evaluation split {measured}; it must be disjoint from training"


def test_a_run_without_completed_epochs_is_invalid():
    records = [r for r in run() if not isinstance(r, EpochRecord)]
    v = evaluate_rules(records)
    assert not by_name(v)["completed epochs"].passed
    assert v.headline() == (
        "invalid: best validation top-1 none < 0.7 required; no training precision recorded "
        "(16-bit float required); 0 completed epochs < 1 required"
    )


def test_a_simulated_run_is_never_valid():
    v = evaluate_rules(run(backend="simulated"))
    assert not v.valid and not v.official
    assert by_name(v)["real training"].measured == "simulated"
    assert v.headline() == "invalid: backend simulated: nothing was trained; a Keras backend is required"


def test_a_short_run_is_valid_but_unofficial():
    v = evaluate_rules(run(last_t=300.0))
    assert (v.valid, v.official) == (True, False)
    assert v.headline() == "valid (unofficial: run 300 s < 3600 s required)"


def test_a_run_just_short_of_the_minimum_never_prints_as_equal():
    v = evaluate_rules(run(last_t=3599.96))
    assert v.headline() == "valid (unofficial: run 3599.9 s < 3600 s required)"


def test_several_failures_are_all_listed_and_an_invalid_run_is_never_official():
    v = evaluate_rules(run(acc=0.61, precision="int8", last_t=300.0))
    assert v.headline() == (
        "invalid: best validation top-1 0.61 < 0.7 required; "
        "weakest precision int8 (not a floating-point policy) < 16-bit float required"
    )
    assert not v.official


def test_thresholds_come_from_the_ledger():
    lenient = {"min_accuracy": 0.6, "official_min_duration_s": 60.0, "min_precision_bits": 16}
    v = evaluate_rules(run(acc=0.61, last_t=300.0, rules=lenient))
    assert by_name(v)["accuracy"].passed and by_name(v)["official duration"].passed
    # ... but rules of the user's making are not the workload's: valid, never official, labelled.
    assert (v.valid, v.official, v.comparable) == (True, False, False)
    assert v.headline() == (
        "valid (custom rules: not comparable (rules.min_accuracy 0.6 instead of 0.7; "
        "rules.official_min_duration_s 60 instead of 3600))"
    )


def test_a_given_score_is_used_as_is():
    records = run()
    score = compute_score(records)
    assert evaluate_rules(records, score) == evaluate_rules(records)


def test_to_dict_lists_every_rule_and_the_headline():
    d = evaluate_rules(run(acc=0.61)).to_dict()
    assert d["valid"] is False and d["headline"] == "invalid: best validation top-1 0.61 < 0.7 required"
    assert (d["workload"], d["comparable"], d["custom"]) == ("imagenet", True, [])
    assert len(d["rules"]) == 7 and {"name", "passed", "measured", "required"} <= set(d["rules"][0])


def test_a_ledger_without_a_header_or_with_bad_thresholds_is_a_one_line_error():
    with pytest.raises(AiperfError, match="no run_start"):
        evaluate_rules(run()[1:])
    bad = run()
    # Unchecked: the ledger's shape check refuses such a header before the rules see it.
    bad[0] = bad[0].model_copy(update={"rules": bad[0].rules.model_copy(update={"min_accuracy": 2.0})})
    with pytest.raises(AiperfError, match="min_accuracy"):
        evaluate_rules(bad)


def test_passed_rules_read_as_passed():
    texts = {r.name: r.summary for r in evaluate_rules(run()).rules}
    assert texts == {
        "accuracy": "best validation top-1 0.97 ≥ 0.7 required",
        "precision": "weakest precision mixed_bfloat16 (16-bit float) ≥ 16-bit float required",
        "held-out evaluation": "evaluation split disjoint from training, as required",
        "completed epochs": "2 completed epochs ≥ 1 required",
        "real training": "trained with backend jax, as required",
        "recorded end": "the run recorded its end (run_stop, completed)",
        "official duration": "run 4000 s ≥ 3600 s required",
    }


def test_a_ledger_without_run_stop_is_not_valid():
    v = evaluate_rules(run(stop=False))
    assert not v.valid and not by_name(v)["recorded end"].passed
    assert v.headline() == (
        "invalid: the ledger does not end with run_stop: the run was interrupted and not resumed, "
        "or the ledger was cut short"
    )


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_a_run_that_did_not_end_completed_is_never_valid(status):
    """The issue's case: 19 % of a streamed folder deleted mid-run ended "failed" and printed "valid"."""
    records = run()
    records[-1] = RunStopRecord(t=records[-1].t, status=status, reason="8 of 31 images are missing")
    v = evaluate_rules(records)
    assert not v.valid and not by_name(v)["recorded end"].passed
    assert by_name(v)["recorded end"].measured == f"run_stop ({status})"
    assert v.headline().startswith(f"invalid: the run ended {status}: 8 of 31 images are missing")


def test_an_audit_appended_after_a_completed_end_leaves_the_recorded_end():
    records = run()
    records.append(AuditRecord(t=4100.0, audited_hash="0" * 64, result_sha256="1" * 64, ok=True))
    assert by_name(evaluate_rules(records))["recorded end"].passed


def test_records_after_run_stop_are_not_a_recorded_end():
    records = run()
    records.append(trial_start(4010.0, "t00001"))
    assert not evaluate_rules(records).valid


@pytest.mark.parametrize("name", BUILTIN_CONFIGS)
def test_every_built_in_config_is_its_workload_under_the_workloads_rules(name):
    cfg = load_config(name)
    workload = WORKLOADS[name]
    assert cfg.rules.model_dump() == workload.rules
    train, evaluation = workload.split or (workload.total_images - 1000, 1000)
    dataset = {"name": cfg.dataset.name, "train_images": train, "eval_images": evaluation}
    if cfg.family == "language":
        dataset = {"name": cfg.dataset.name, "train_tokens": 9_000_000, "eval_tokens": 480_000}
    start = RunStartRecord(
        run_id="r", config=cfg.to_dict(), rules=cfg.rules.model_dump(), dataset=dataset, family=cfg.family
    )
    assert (identify(start).workload, identify(start).reasons) == (name, ())


def test_a_language_workload_needs_a_language_run_with_its_tokens_recorded():
    cfg = load_config("llm")
    header = {"run_id": "r", "config": cfg.to_dict(), "rules": cfg.rules.model_dump()}
    images = RunStartRecord(**header, dataset={"name": "text", "train_tokens": 10, "eval_tokens": 1})
    assert identify(images).reasons == ("a run of image models, not language models",)
    untold = RunStartRecord(**header, family="language", dataset={"name": "text"})
    assert identify(untold).reasons == ("dataset size not recorded",)


def test_a_non_imagenet_workload_is_valid_but_never_official():
    def smoke(s):
        s["config"] = {"run": {"name": "smoke"}, "dataset": {"name": "digits"}}
        s["dataset"].update(train_images=1438, eval_images=359)
        s["rules"]["min_accuracy"] = 0.8

    records = edit_header(run(), smoke)
    v = evaluate_rules(records)
    assert (v.valid, v.official, v.comparable) == (True, False, True)
    assert v.headline() == "valid (unofficial: workload smoke, not the official imagenet)"


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda s: s["config"]["run"].update(name="mine"), "config mine on dataset image_folder is not a built-in"),
        (lambda s: s["dataset"].update(train_images=128_000), "dataset of 178,000 images instead of 1,331,167"),
        (lambda s: s["rules"].update(official_min_duration_s=10.0), "rules.official_min_duration_s 10 instead of 3600"),
        (lambda s: s["config"]["search"].update(size_growth=4), "search.size_growth 4 instead of 2"),
        (lambda s: s["config"].pop("search"), "search.size_growth null (no schedule) instead of 2"),
        (lambda s: s["config"]["search"].update(size_band=9.0), "search.size_band 9 instead of 1.5"),
    ],
)
def test_a_custom_config_dataset_or_rule_is_not_comparable(edit, reason):
    records = edit_header(run(), edit)
    v = evaluate_rules(records)
    assert v.valid and not v.official and not v.comparable
    assert "custom rules: not comparable (" in v.headline() and reason in v.headline()


def test_a_language_run_below_its_quality_gives_the_limit_in_bits_per_byte_and_names_a_short_budget():
    def language(records):
        return edit_header(records, lambda h: h.update(family="language"))

    short = by_name(evaluate_rules(language(run(acc=0.55, last_t=240.0))))["quality"]
    assert not short.passed
    assert "best validation quality 0.55 (3.6 bits per byte) < 0.7 (2.4 bits per byte) required" in short.summary
    assert "a 240 s run, shorter than the workload's 3600 s, trains too little" in short.summary
    full = by_name(evaluate_rules(language(run(acc=0.55, last_t=4000.0))))["quality"]
    assert not full.passed and "trains too little" not in full.summary  # a full-length run: no such excuse
    assert by_name(evaluate_rules(language(run(acc=0.75, last_t=240.0))))["quality"].passed


def _on_nodes(records, planned, nodes):
    """``records`` with ``planned`` nodes in the header and one trial started on each of ``nodes``."""
    records = edit_header(records, lambda f: f["plan"].update(planned_nodes=planned))
    starts = [
        TrialStartRecord(t=1.0, trial=f"t{k:05d}", kind="seed", arch_id="a", flops={"train_per_image": 1.0}, params=1,
                         node=node)
        for k, node in enumerate(nodes, start=1)
    ]  # fmt: skip
    return [records[0], *starts, *records[1:]]


def test_a_run_that_trained_on_every_planned_node_stays_official_and_says_so():
    v = evaluate_rules(_on_nodes(run(), 3, ["n1", "n2", "n3", "n1"]))
    assert (v.valid, v.official, v.headline()) == (True, True, "valid (official)")
    rule = by_name(v)["planned nodes"]
    assert rule.passed and (rule.measured, rule.required) == ("3 node(s)", "3 planned")


def test_a_run_on_fewer_nodes_than_its_job_had_is_valid_but_unofficial_with_the_count():
    v = evaluate_rules(_on_nodes(run(), 4, ["n1", "n2", "n2"]))
    assert (v.valid, v.official) == (True, False), "the score is honest about the work; it ranks no 4-node system"
    assert v.headline() == "valid (unofficial: trials ran on 2 of the 4 node(s) the job was given)"
    bad = evaluate_rules(_on_nodes(run(acc=0.5), 4, ["n1"]))
    assert bad.headline() == "invalid: best validation top-1 0.5 < 0.7 required", "an invalid run names what broke it"


def test_a_run_without_a_plan_has_no_planned_nodes_rule_and_a_given_count_is_used_as_is():
    assert "planned nodes" not in by_name(evaluate_rules(run()))
    records = _on_nodes(run(), 2, [])
    assert not by_name(evaluate_rules(records))["planned nodes"].passed
    assert by_name(evaluate_rules(records, nodes=2))["planned nodes"].passed  # the summary counts while it reads
