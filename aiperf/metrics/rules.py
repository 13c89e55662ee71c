"""The validity rules of a run, judged from its ledger.

A score means something only if the run reached a useful accuracy, trained in a real
floating-point precision, evaluated on data it did not train on, and completed work at
all. A run that passes those is valid; it is *official* when it also ran long enough for
the search to matter (shorter runs are valid but labelled unofficial). Thresholds come
from the run's own header (``run_start.rules``), so a ledger is judged by the rules it
was run under.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from aiperf.errors import AiperfError
from aiperf.metrics.score import Score, compute_score

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


@dataclass(frozen=True)
class RuleResult:
    """One rule: whether it passed, what was measured, what was required, and a one-line summary."""

    name: str
    passed: bool
    measured: str
    required: str
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """All rules with their outcome; ``valid`` ignores the duration rule, ``official`` needs it too."""

    valid: bool
    official: bool
    rules: tuple[RuleResult, ...]

    def headline(self) -> str:
        """``valid``, ``valid (unofficial: run 300 s < 3600 s)`` or ``invalid: <each failed rule>``."""
        if not self.valid:
            failed = [r.summary for r in self.rules if not r.passed and r.name != DURATION_RULE]
            return "invalid: " + "; ".join(failed)
        if not self.official:
            duration = next(r for r in self.rules if r.name == DURATION_RULE)
            return f"valid (unofficial: {duration.summary})"
        return "valid"

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "official": self.official,
            "headline": self.headline(),
            "rules": [r.to_dict() for r in self.rules],
        }


def _number(value: float) -> str:
    """A threshold or measurement without float noise and without rounding it onto the threshold."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _thresholds(records: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    from pydantic import ValidationError

    from aiperf.config import RulesConfig

    start = next((r for r in records if r.get("type") == "run_start"), None)
    if start is None:
        raise AiperfError("the ledger has no run_start record, so the rules it ran under are unknown")
    given = start.get("rules") or {}
    if not isinstance(given, dict):
        raise AiperfError("run_start.rules must be a mapping of thresholds")
    try:
        rules = RulesConfig(**{k: v for k, v in given.items() if k in RulesConfig.model_fields})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise AiperfError(f"run_start.rules.{err['loc'][0]}: {err['msg']}") from None
    dataset = start.get("dataset") if isinstance(start.get("dataset"), dict) else {}
    return rules, dataset


def _accuracy_rule(score: Score, minimum: float) -> RuleResult:
    best = score.best_val_acc
    measured = "none" if best is None else _number(best)
    passed = best is not None and best >= minimum
    return RuleResult("accuracy", passed, measured, _number(minimum), f"accuracy {measured} < {_number(minimum)}")


def _precision_rule(epochs: list[dict[str, Any]], min_bits: int) -> RuleResult:
    required = f"{min_bits}-bit float"
    policies = [r.get("precision") if isinstance(r.get("precision"), str) else "unrecorded" for r in epochs]
    if not policies:
        return RuleResult("precision", False, "none", required, f"precision none recorded < {required}")
    weakest = min(policies, key=lambda p: FLOAT_POLICY_BITS.get(p, 0))
    passed = FLOAT_POLICY_BITS.get(weakest, 0) >= min_bits
    return RuleResult("precision", passed, weakest, required, f"precision {weakest} < {required}")


def _held_out_rule(dataset: dict[str, Any]) -> RuleResult:
    split = dataset.get("split") if isinstance(dataset.get("split"), dict) else {}
    disjoint = split.get("disjoint")
    measured = "disjoint" if disjoint is True else "overlapping" if disjoint is False else "not recorded"
    return RuleResult(
        "held-out evaluation",
        disjoint is True,
        measured,
        "disjoint",
        f"evaluation split {measured}, must be disjoint from training",
    )


def _epochs_rule(score: Score) -> RuleResult:
    return RuleResult(
        "completed epochs", score.epochs >= 1, str(score.epochs), "1", f"completed epochs {score.epochs} < 1"
    )


def _real_training_rule(plan: dict[str, Any]) -> RuleResult:
    # A simulated pool (tests, scaling studies) produces well-formed ledgers that trained nothing.
    backend = plan.get("backend") if isinstance(plan, dict) else None
    measured = str(backend or "not recorded")
    passed = backend not in (None, "simulated")
    return RuleResult("real training", passed, measured, "a Keras backend", f"backend {measured}, not real training")


def _duration_rule(score: Score, minimum_s: float) -> RuleResult:
    # Truncated, not rounded, so a run short of the minimum never prints as equal to it.
    measured, required = f"{_number(math.floor(score.wall_s * 10) / 10)} s", f"{_number(minimum_s)} s"
    return RuleResult(DURATION_RULE, score.wall_s >= minimum_s, measured, required, f"run {measured} < {required}")


def evaluate_rules(records: Iterable[dict[str, Any]], score: Score | None = None) -> Verdict:
    """Judge a ledger (record dicts in file order); ``score`` saves recomputing it when known."""
    records = list(records)
    rules, dataset = _thresholds(records)
    if score is None:
        score = compute_score(records)
    epochs = [r for r in records if r.get("type") == "epoch"]
    results = (
        _accuracy_rule(score, rules.min_accuracy),
        _precision_rule(epochs, rules.min_precision_bits),
        _held_out_rule(dataset),
        _epochs_rule(score),
        _real_training_rule(records[0].get("plan") or {}),
        _duration_rule(score, rules.official_min_duration_s),
    )
    valid = all(r.passed for r in results if r.name != DURATION_RULE)
    official = valid and all(r.passed for r in results)
    return Verdict(valid, official, results)
