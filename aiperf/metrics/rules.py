"""The validity rules of a run, judged from its ledger.

A score means something only if the run reached a useful accuracy, trained in a real
floating-point precision, evaluated on data it did not train on, and completed work at
all, and recorded its end (a ``run_stop`` as its last record). A run that passes those is
valid; it is *official* when it is the official workload (``imagenet``) under that workload's
own rules and ran long enough for the search to matter. Thresholds come from the run's own
header (``run_start.rules``), so a ledger is judged by the rules it was run under; where those
differ from the rules the workload carries in code (:mod:`aiperf.metrics.workloads`), or the
run is no built-in workload, the verdict says "custom rules: not comparable".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TypedDict

from aiperf.errors import AiperfError
from aiperf.ledger.schema import (
    EpochRecord,
    Record,
    RecordType,
    RunStartRecord,
    RunStatus,
    RunStopRecord,
    TrialStartRecord,
    of_type,
    run_records,
)
from aiperf.metrics.score import Score, compute_score
from aiperf.metrics.workloads import NOT_COMPARABLE, OFFICIAL_WORKLOAD, identify

if TYPE_CHECKING:
    from aiperf.config import RulesConfig

# Keras dtype policies and the width of the floating-point format they train in.
FLOAT_POLICY_BITS = {
    "float16": 16,
    "bfloat16": 16,
    "mixed_float16": 16,
    "mixed_bfloat16": 16,
    "float32": 32,
    "float64": 64,
}
DURATION_RULE = "official duration"
RECORDED_END_RULE = "recorded end"
NODES_RULE = "planned nodes"
# Rules an unofficial run may fail and stay valid: its score is honest about the work it did, but it is no
# ranking of the system as planned (too short for the search to matter, or on fewer nodes than the job had).
OFFICIAL_ONLY = frozenset({DURATION_RULE, NODES_RULE})


@dataclass(frozen=True)
class RuleResult:
    """One rule: whether it passed, what was measured, what was required, and a one-line summary."""

    name: str
    passed: bool
    measured: str
    required: str
    summary: str = ""

    def to_dict(self) -> dict[str, str | bool]:
        return asdict(self)


class VerdictDict(TypedDict):
    """A :class:`Verdict` as the summary holds it."""

    valid: bool
    official: bool
    workload: str | None
    comparable: bool
    custom: list[str]
    headline: str
    rules: list[dict[str, str | bool]]  # RuleResult.to_dict()


@dataclass(frozen=True)
class Verdict:
    """All rules with their outcome, and whether the run is comparable with other runs of its workload.

    ``valid`` ignores the duration and planned-nodes rules (``OFFICIAL_ONLY``); ``official`` needs
    them too, and needs the run to be the official workload under that workload's own rules
    (:mod:`aiperf.metrics.workloads`).
    """

    valid: bool
    official: bool
    rules: tuple[RuleResult, ...]
    workload: str | None = None
    custom: tuple[str, ...] = ()

    @property
    def comparable(self) -> bool:
        return self.workload is not None and not self.custom

    def _custom_note(self) -> str:
        return f"{NOT_COMPARABLE} ({'; '.join(self.custom)})"

    def headline(self) -> str:
        """``valid (official)``, ``valid (unofficial: ...)``, ``valid (custom rules: not comparable (...))``
        or ``invalid: <each failed rule>``, with the custom-rules label whenever it applies."""
        if not self.valid:
            failed = [r.summary for r in self.rules if not r.passed and r.name not in OFFICIAL_ONLY]
            text = "invalid: " + "; ".join(failed)
            return f"{text}; {self._custom_note()}" if self.custom else text
        if self.custom:
            return f"valid ({self._custom_note()})"
        if self.official:
            return "valid (official)"
        why = [r.summary for r in self.rules if r.name in OFFICIAL_ONLY and not r.passed]
        if self.workload != OFFICIAL_WORKLOAD:
            why.append(f"workload {self.workload}, not the official {OFFICIAL_WORKLOAD}")
        return f"valid (unofficial: {'; '.join(why)})"

    def to_dict(self) -> VerdictDict:
        return {
            "valid": self.valid,
            "official": self.official,
            "workload": self.workload,
            "comparable": self.comparable,
            "custom": list(self.custom),
            "headline": self.headline(),
            "rules": [r.to_dict() for r in self.rules],
        }


def _number(value: float) -> str:
    """A threshold or measurement without float noise and without rounding it onto the threshold."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _header(records: list[Record]) -> RunStartRecord:
    start = next(iter(of_type(records, RunStartRecord)), None)
    if start is None:
        raise AiperfError("the ledger has no run_start record, so the rules it ran under are unknown")
    return start


def _thresholds(start: RunStartRecord) -> RulesConfig:
    from pydantic import ValidationError

    from aiperf.config import RulesConfig

    # The thresholds the header states; those it leaves out take the config's defaults.
    given = start.rules.model_dump(exclude_unset=True, include=set(RulesConfig.model_fields))
    try:
        return RulesConfig(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise AiperfError(f"run_start.rules.{err['loc'][0]}: {err['msg']}") from None


def _compare(measured: str, passed: bool, required: str) -> str:
    """``X ≥ Y required`` or ``X < Y required``: reads right whether the rule passed or not."""
    return f"{measured} {'≥' if passed else '<'} {required} required"


def _accuracy_rule(score: Score, minimum: float, family: str = "image", official_s: float = 0.0) -> RuleResult:
    """Best validation top-1 of an image run; of a language run its quality, 1 - bits per byte / 8 (docs/llm.md).

    A language run below its quality says the limit in bits per byte too, and, when it ran shorter than
    the workload's official duration, that the shortened budget is the likely cause.
    """
    best = score.best_val_acc
    measured = "none" if best is None else _number(best)
    passed = best is not None and best >= minimum
    if family == "language":
        bits = "" if best is None else f" ({_number(round(8 * (1 - best), 4))} bits per byte)"
        limit = f"{_number(minimum)} ({_number(round(8 * (1 - minimum), 4))} bits per byte)"
        text = _compare(f"best validation quality {measured}{bits}", passed, limit)
        if not passed and 0 < score.wall_s < official_s:
            text += f" (a {score.wall_s:.0f} s run, shorter than the workload's {official_s:.0f} s, trains too little)"
        return RuleResult("quality", passed, measured, _number(minimum), text)
    text = _compare(f"best validation top-1 {measured}", passed, _number(minimum))
    return RuleResult("accuracy", passed, measured, _number(minimum), text)


def _precision_rule(epochs: list[EpochRecord], min_bits: int) -> RuleResult:
    required = f"{min_bits}-bit float"
    # precision is required by the record's shape; a record built without validation may still lack one.
    policies = [r.precision if isinstance(r.precision, str) else "unrecorded" for r in epochs]
    if not policies:
        return RuleResult("precision", False, "none", required, f"no training precision recorded ({required} required)")
    weakest = min(policies, key=lambda p: FLOAT_POLICY_BITS.get(p, 0))
    bits = FLOAT_POLICY_BITS.get(weakest, 0)
    passed = bits >= min_bits
    measured = f"{weakest} ({bits}-bit float)" if bits else f"{weakest} (not a floating-point policy)"
    return RuleResult(
        "precision", passed, weakest, required, _compare(f"weakest precision {measured}", passed, required)
    )


def _held_out_rule(start: RunStartRecord) -> RuleResult:
    split = start.dataset.split
    disjoint = split.disjoint if split is not None else None
    measured = "disjoint" if disjoint is True else "overlapping" if disjoint is False else "not recorded"
    text = (
        "evaluation split disjoint from training, as required"
        if disjoint is True
        else f"evaluation split {measured}; it must be disjoint from training"
    )
    return RuleResult("held-out evaluation", disjoint is True, measured, "disjoint", text)


def _epochs_rule(score: Score) -> RuleResult:
    passed = score.epochs >= 1
    return RuleResult(
        "completed epochs", passed, str(score.epochs), "1", _compare(f"{score.epochs} completed epochs", passed, "1")
    )


def _real_training_rule(start: RunStartRecord) -> RuleResult:
    # A simulated pool (tests, scaling studies) produces well-formed ledgers that trained nothing.
    backend = start.plan.backend
    measured = str(backend or "not recorded")
    passed = backend not in (None, "simulated")
    text = (
        f"trained with backend {measured}, as required"
        if passed
        else f"backend {measured}: nothing was trained; a Keras backend is required"
    )
    return RuleResult("real training", passed, measured, "a Keras backend", text)


def _recorded_end_rule(records: list[Record]) -> RuleResult:
    # A ledger cut after its best prefix (``head -n 78``) has an intact chain; it has no run_stop.
    ran = run_records(records)  # an audit appended after the end is not the run's end
    last = ran[-1] if ran else None
    required = f"{RecordType.RUN_STOP.value} ({RunStatus.COMPLETED.value})"
    if isinstance(last, RunStopRecord):
        status = last.status.value
        if last.status == RunStatus.COMPLETED:
            return RuleResult(
                RECORDED_END_RULE,
                True,
                f"run_stop ({status})",
                required,
                f"the run recorded its end (run_stop, {status})",
            )
        why = f": {last.reason}" if last.reason else ""
        return RuleResult(
            RECORDED_END_RULE,
            False,
            f"run_stop ({status})",
            required,
            f"the run ended {status}{why}; only a completed run is valid (an interrupted one can be resumed)",
        )
    return RuleResult(
        RECORDED_END_RULE,
        False,
        "no run_stop",
        required,
        "the ledger does not end with run_stop: the run was interrupted and not resumed, or the ledger was cut short",
    )


def _duration_rule(score: Score, minimum_s: float) -> RuleResult:
    # Truncated, not rounded, so a run short of the minimum never prints as equal to it.
    measured, required = f"{_number(math.floor(score.wall_s * 10) / 10)} s", f"{_number(minimum_s)} s"
    passed = score.wall_s >= minimum_s
    return RuleResult(DURATION_RULE, passed, measured, required, _compare(f"run {measured}", passed, required))


def trained_nodes(records: Iterable[Record]) -> int:
    """How many nodes trials started on (the nodes that did the run's work)."""
    return len({r.node for r in of_type(records, TrialStartRecord) if r.node})


def _nodes_rule(start: RunStartRecord, trained: int) -> RuleResult | None:
    """Trials started on as many nodes as the job was given (None: the run states no plan, as on one machine)."""
    planned = start.plan.planned_nodes
    if planned is None:
        return None
    passed = trained >= planned
    measured, required = f"{trained} node(s)", f"{planned} planned"
    summary = f"trials ran on {trained} of the {planned} node(s) the job was given"
    return RuleResult(NODES_RULE, passed, measured, required, summary if not passed else f"{summary} (all)")


def evaluate_rules(records: Iterable[Record], score: Score | None = None, nodes: int | None = None) -> Verdict:
    """Judge a ledger (its records in file order); ``score`` and ``nodes`` (:func:`trained_nodes`) save
    recomputing them when known."""
    records = list(records)
    start = _header(records)
    rules = _thresholds(start)
    if score is None:
        score = compute_score(records)
    results: tuple[RuleResult, ...] = (
        _accuracy_rule(score, rules.min_accuracy, start.family, rules.official_min_duration_s),
        _precision_rule(of_type(records, EpochRecord), rules.min_precision_bits),
        _held_out_rule(start),
        _epochs_rule(score),
        _real_training_rule(start),
        _recorded_end_rule(records),
        _duration_rule(score, rules.official_min_duration_s),
    )
    planned = _nodes_rule(start, trained_nodes(records) if nodes is None else nodes)
    if planned is not None:
        results = (*results, planned)
    workload = identify(start)
    valid = all(r.passed for r in results if r.name not in OFFICIAL_ONLY)
    official = valid and workload.official_workload and all(r.passed for r in results)
    return Verdict(valid, official, results, workload.workload, workload.reasons)
