"""aiperf: an AutoML benchmark for AI supercomputers, scored in counted operations per second.

The packages, bottom layer first (a module never imports from a layer above its own):

* ``aiperf.errors``, ``aiperf.config`` -- the one user-facing error type; the typed run config;
  ``aiperf.record.schema``, the typed ledger records every layer reads and writes (it imports
  nothing of aiperf but ``errors``, so it sits at the bottom although it lives beside the ledger).
* ``aiperf.metrics`` -- analytic FLOPs per layer, the score, the validity rules.
* ``aiperf.datasets`` -- image classification datasets from local files, split and fingerprinted.
* ``aiperf.training`` -- trial specs, graph -> Keras models, the trainer, input pipelines, backends.
* ``aiperf.record`` -- the hash-chained ledger and everything read from it: summary, verify,
  results tables, MLPerf-style log, telemetry, report.
* ``aiperf.cluster`` -- Ray: session, node discovery, sizing plan, long-lived workers, pools.
* ``aiperf.engine`` -- the master loop, a whole run (and its resume), weight store, scaling study.
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
    "read_ledger": "aiperf.record.ledger",
    "build_summary": "aiperf.record.summary",
    "verify_run": "aiperf.record.verify",
    "load_results": "aiperf.record.results",
    "write_report": "aiperf.record.report",
    "run_benchmark": "aiperf.engine.run",
}
_RENAMED = {"load_results": "load"}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'aiperf' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
