"""aiperf: an AutoML benchmark for AI supercomputers, scored in counted operations per second.

The packages, bottom layer first (a module never imports from a layer above its own; the
contracts in ``.importlinter`` state this and CI checks it):

* ``aiperf.errors``, ``aiperf.config`` -- the one user-facing error type; the typed run config.
* ``aiperf.ledger`` -- the typed ledger records every layer reads and writes, the hash-chained
  file, whole-file writes, the run lock, inert text.
* ``aiperf.metrics`` -- the score, the validity rules, the workloads' rules.
* ``aiperf.datasets`` -- image classification datasets from local files, split and fingerprinted.
* ``aiperf.training`` -- what every family's training shares: trial specs, backends and devices.
* ``aiperf.families`` -- one subpackage per workload family (image, language): its model
  builder, trainer, input, data and operation counting, behind one ``Family`` interface.
* ``aiperf.system`` -- what a node is: CPUs, accelerators, peaks, the measured ceiling, the site.
* ``aiperf.sampling`` -- what a run samples beside its ledger: telemetry, energy.
* ``aiperf.results`` -- views computed from a ledger: summary, verify, report, tables, MLPerf log.
* ``aiperf.cluster`` -- Ray: session, node discovery, sizing plan, long-lived workers, pools.
* ``aiperf.engine`` -- the master loop, a whole run (and its resume), weight store, audit, scaling.
* ``aiperf.submission`` -- packages of runs, their checker and the ranked list.
* ``aiperf.cli`` -- the ``aiperf`` command.

The names below are the public API, imported lazily so that ``import aiperf`` stays cheap (no
Ray, no deep-learning framework until a name that needs one is used). The search algorithms
live in the sibling package ``nas``.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

DISTRIBUTION = "aiperf-hpc"  # installed under this name: "aiperf" on the package index is another project

try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # a source checkout on PYTHONPATH without an install
    __version__ = "0+unknown"

_EXPORTS = {
    "AiperfError": "aiperf.errors",
    "Config": "aiperf.config",
    "load_config": "aiperf.config",
    "Dataset": "aiperf.datasets",
    "load_dataset": "aiperf.datasets",
    "count_flops": "aiperf.families.image.flops",
    "compute_score": "aiperf.metrics.score",
    "evaluate_rules": "aiperf.metrics.rules",
    "read_ledger": "aiperf.ledger.store",
    "build_summary": "aiperf.results.summary",
    "verify_run": "aiperf.results.verify",
    "load_results": "aiperf.results.tables",
    "write_report": "aiperf.results.report",
    "run_benchmark": "aiperf.engine.run",
}
_RENAMED = {"load_results": "load"}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'aiperf' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
