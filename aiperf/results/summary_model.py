"""The shape of ``summary.json``: one set of types from the writer to every reader in this process.

:class:`DigestSummary` is what :meth:`aiperf.results.summary.RunDigest.summary` computes from
the ledger alone; :class:`RunSummary` adds what :func:`aiperf.results.summary.build_summary`
reads beside it (telemetry and energy) and is what ``summary.json`` holds. ``NotRequired`` keys
are written only sometimes (each says when): a summary published before they existed still
verifies, because its recomputation has none of them either. docs/results.md ("What
summary.json holds") lists the top-level keys; tests/results/test_summary_model.py holds each
type to written summaries and to that table.

These types describe what this process builds. A ``summary.json`` read from a file someone else
wrote (a submission package, ``aiperf list``) is untrusted JSON and is checked as such
(:mod:`aiperf.ledger.json_types`), never taken for a :class:`RunSummary`.

No ``from __future__ import annotations`` here, unlike the rest of aiperf: with it, Python 3.11
cannot see ``NotRequired`` in a TypedDict's (then textual) annotations, and every key would be
listed in ``__required_keys__``, which the tests compare with a written summary.
"""

from typing import NotRequired, TypedDict

from aiperf.metrics.rules import VerdictDict
from aiperf.metrics.score import ScoreDict
from aiperf.metrics.steadiness import SteadinessDict
from aiperf.results.device_time import DeviceTimeSummary
from aiperf.results.efficiency import EfficiencySummary
from aiperf.results.size_pace import SizePaceSummary
from aiperf.sampling.energy import EnergySummary
from aiperf.sampling.telemetry import TelemetrySummary


class DatasetSummary(TypedDict):
    """The summary's ``dataset`` section: the ``run_start`` header's dataset, as it states it."""

    name: str | None
    train_images: int | None
    eval_images: int | None
    input_shape: list[int] | None
    num_classes: int | None
    fingerprint: str | None
    # A language run's only (family "language"): an image run's summary keeps exactly the keys above.
    train_tokens: NotRequired[int | None]
    eval_tokens: NotRequired[int | None]
    vocab_size: NotRequired[int | None]
    tokenizer: NotRequired[str | None]
    bytes_per_token: NotRequired[float | None]


class PlannedNodes(TypedDict, total=False):
    """The nodes the job was given and those trials ran on: both where the run states a plan, else neither."""

    planned_nodes: int
    trained_nodes: int


class DeviceSummary(TypedDict):
    """The summary's ``devices`` section."""

    nodes: int  # at the run's start
    planned_nodes: NotRequired[int]  # the nodes the job was given (cluster.planned_nodes), where stated
    trained_nodes: NotRequired[int]  # the nodes trials started on, where a plan is stated
    cpus: float
    gpus: float
    accelerators: list[str]
    concurrency: int | None
    placement: str | None
    workers_by_device: dict[str, int]  # "kind: name" -> workers


class ScoreSummary(ScoreDict):
    """The summary's ``score`` section: :class:`aiperf.metrics.score.Score`'s figures and three for people."""

    ops_human: str
    regulated_human: str
    aiperf_regulated_human: str


class VerdictSummary(VerdictDict):
    """The summary's ``verdict`` section: the rules' verdict, and what the telemetry adds beside it."""

    # Where the telemetry shows a machine shared with other work (its headline then ends with them too).
    notes: NotRequired[list[str]]


class TrialsSummary(TypedDict):
    """The summary's ``trials`` section."""

    started: int
    by_status: dict[str, int]  # a trial_end status -> trial_end records with it
    distinct_architectures: int
    epochs_counted: int


class BestTrial(TypedDict):
    """The summary's ``best`` section: the best epoch (highest ``val_acc``, the earliest of equals) and its trial."""

    trial: str
    epoch: int
    val_acc: float
    arch_id: str
    params: int
    kind: str
    lineage: list[str]
    flops_train_per_image: NotRequired[float | None]  # an image run's
    flops_train_per_token: NotRequired[float | None]  # a language run's, with bits_per_byte
    bits_per_byte: NotRequired[float | None]


class WorkerLife(TypedDict):
    """One worker's life as its last ``worker`` record states it."""

    node: str | None
    busy_fraction: float | None
    busy_s: float | None
    compile_s: float | None
    alive_s: float | None
    idle_gap_mean_s: float | None
    # Where the summary has a device_time section (aiperf.results.device_time.WorkerTime).
    steady_s: NotRequired[float]
    compile_critical_s: NotRequired[float]


class WorkersSummary(TypedDict):
    """The summary's ``workers`` section."""

    count: int
    busy_fraction_mean: float | None
    busy_fraction_min: float | None
    steady_busy_fraction_mean: float | None
    idle_gap_mean_s: float | None
    trials_step_reused: int
    trials_step_known: int
    per_worker: dict[str, WorkerLife]
    compile_critical_fraction: NotRequired[float | None]  # where the summary has a device_time section


class InputSummary(TypedDict):
    """The summary's ``input`` section: how long the training loops waited for input."""

    storage: str
    epochs_measured: int
    data_wait_s: float
    train_s: float
    wait_fraction: float | None
    per_worker_wait_fraction: dict[str, float | None]
    starved_workers: list[str]
    starved_threshold: float
    decode_threads: list[int]


class BadImagesSummary(TypedDict):
    """The summary's ``bad_images`` section: images skipped because they could not be decoded."""

    count: int
    fraction: float | None
    files: list[str]  # the first 20
    max_fraction: float | None
    missing: int  # of count: files deleted since the run began (the rest could not be decoded)


class StartFailure(TypedDict):
    worker: str
    hostname: str | None
    node: str | None
    cause: str


class StartFailures(TypedDict):
    """The summary's ``worker_start_failures`` section."""

    count: int
    first: StartFailure | None


class LedgerAnchor(TypedDict):
    """The summary's ``ledger`` section: what anchors the summary to its ledger."""

    records: int
    last_hash: str


class LanguageSummary(TypedDict):
    """The summary's ``language`` section (a language run's only): tokens and bits per byte."""

    tokens: int  # training tokens of the counted epochs
    eval_tokens: int  # validation tokens of the counted epochs
    tokens_per_s: float  # tokens / the score's duration (score.wall_s, the run's recorded end)
    best_bits_per_byte: float | None  # the lowest validation bits per byte of any counted epoch
    best_bits_per_byte_trial: str | None
    best_bits_per_byte_epoch: int | None


class DigestSummary(TypedDict):
    """What the ledger alone gives (:meth:`aiperf.results.summary.RunDigest.summary`, ``summarize``)."""

    run_id: str
    name: str | None  # run.name, as the run_start header states it
    status: str  # the run_stop's status, or "running or killed"
    stop_reason: str | None
    dataset: DatasetSummary
    backend: str | None
    precision: list[str]
    devices: DeviceSummary
    score: ScoreSummary
    steadiness: SteadinessDict | None  # None: too few counted epochs
    efficiency: EfficiencySummary
    verdict: VerdictSummary
    trials: TrialsSummary
    best: BestTrial | None  # None: no epoch counted
    workers: WorkersSummary
    input: InputSummary
    bad_images: BadImagesSummary
    worker_start_failures: StartFailures
    ledger: LedgerAnchor
    device_time: NotRequired[DeviceTimeSummary]  # where the epochs carry compile_s (from 2026-12-07)
    size_pace: NotRequired[SizePaceSummary]  # with device_time, where the workload has a size schedule
    family: NotRequired[str]  # "language" for a language run; an image run's has none
    language: NotRequired[LanguageSummary]  # a language run's only


class RunSummary(DigestSummary):
    """``summary.json``: the ledger's summary, its telemetry where it has any, and its energy."""

    telemetry: NotRequired[TelemetrySummary]  # where telemetry.jsonl has samples
    energy: EnergySummary  # always: "not measured" with its reason where there is no figure
