"""The figures of one GPU batch (benchmarks/gpu_batch.sh) from its run directories, as one JSON file.

For each run (the image workload at its GPU default, the language workload): the whole run's
counted OPS over the devices' dense Rpeak at the precision they computed in (issue 44's targets:
image >= 20 %, language >= 40 %), where the devices' time went (summary.json's ``device_time``),
compile on the critical path over the workers' lives (target <= 5 %), the engine's efficiency,
NVML utilisation (target >= 90 %), and whether ``aiperf verify`` and ``aiperf audit`` passed
(their exit codes, as the batch script recorded them). Every figure is read from the run's own
summary, which ``aiperf verify`` recomputes from the ledger: nothing here is measured anew.

    python benchmarks/gpu_figures.py --run image=RUN_DIR --check image=verify:0,audit:0 \
        --run language=RUN_DIR --json benchmarks/gpu/2026-12-07-h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import common

TARGETS = {
    "image": {"ops_over_rpeak": 0.20, "compile_critical_fraction": 0.05, "accelerator_util": 0.90},
    "language": {"ops_over_rpeak": 0.40, "compile_critical_fraction": 0.05, "accelerator_util": 0.90},
}


def run_figures(run: Path, checks: dict[str, int]) -> dict[str, Any]:
    """One run's figures from its summary.json (and what the batch script recorded of verify and audit)."""
    summary = json.loads((run / "summary.json").read_text())
    efficiency = summary.get("efficiency") or {}
    telemetry = summary.get("telemetry") or {}
    util = telemetry.get("accelerator_util_mean_percent")
    return {
        "run": str(run),
        "run_id": summary["run_id"],
        "status": summary["status"],
        "verdict": summary["verdict"]["headline"],
        "ops_per_s": summary["score"]["ops_per_s"],
        "wall_s": summary["score"]["wall_s"],
        "precision": summary["precision"],
        "rpeak_flops": efficiency.get("rpeak_flops"),
        "ops_over_rpeak": efficiency.get("ops_over_rpeak"),
        "ceiling_flops": efficiency.get("ceiling_flops"),
        "ops_over_ceiling": efficiency.get("ops_over_ceiling"),
        "engine_efficiency": efficiency.get("engine"),
        "compile_critical_fraction": (summary.get("workers") or {}).get("compile_critical_fraction"),
        "device_time": summary.get("device_time"),
        "accelerator_util": util / 100 if util is not None else None,
        "trials": summary["trials"],
        "checks": checks,
    }


def verdicts(name: str, figures: dict[str, Any]) -> dict[str, bool | None]:
    """Each target of the workload met (True), missed (False) or not measured (None)."""
    out: dict[str, bool | None] = {}
    for key, target in TARGETS.get(name, {}).items():
        value = figures.get(key)
        if value is None:
            out[key] = None
        elif key == "compile_critical_fraction":
            out[key] = value <= target
        else:
            out[key] = value >= target
    out["verified"] = figures["checks"].get("verify") == 0 if "verify" in figures["checks"] else None
    out["audited"] = figures["checks"].get("audit") == 0 if "audit" in figures["checks"] else None
    return out


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"gpu_figures: --{what} takes NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=[], help="NAME=RUN_DIR (image, language)")
    parser.add_argument("--check", action="append", default=[], help="NAME=verify:RC,audit:RC")
    parser.add_argument("--json", required=True, help="where to write the figures")
    args = parser.parse_args(argv)
    runs = _pairs(args.run, "run")
    checks = {
        name: {k: int(v) for k, _, v in (p.partition(":") for p in text.split(",") if p)}
        for name, text in _pairs(args.check, "check").items()
    }
    out: dict[str, Any] = {"machine": common.machine_facts(), "runs": {}, "targets": TARGETS}
    for name, path in runs.items():
        run = Path(path)
        if not (run / "summary.json").is_file():
            out["runs"][name] = {"run": path, "error": "no summary.json: the run did not finish"}
            continue
        figures = run_figures(run, checks.get(name, {}))
        figures["met"] = verdicts(name, figures)
        out["runs"][name] = figures
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    for name, figures in out["runs"].items():
        print(name, json.dumps({k: figures.get(k) for k in ("ops_over_rpeak", "engine_efficiency", "met")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
