"""Ledger records: one typed model per record type, the shape writers append and readers get back.

A writer builds a record (``EpochRecord(trial=..., val_acc=...)``) and appends it; the ledger
adds the header (``seq``, ``t``, ``wall``, ``prev``, ``hash``) and writes exactly the fields the
writer set, so a field a writer leaves out is absent from the line, as before models existed.
A reader gets the same models back from :func:`aiperf.ledger.store.read_ledger` and uses
attributes and enums, never string keys.

The readers (summary, verify, report, audit, ``results.load``, ``--resume``) take a ledger from
disk, where anyone may have edited it, and then index into it, sum its numbers and format
them. A record with a valid hash chain but a string where a number belongs would otherwise
end deep inside one of them as a ``TypeError``. So every record is checked against its model
-- types, and ranges where arithmetic or a date conversion would overflow -- and the first
problem is reported as one line naming the record and the field. A field is required only
where a reader cannot do without it; the others are checked when present. Each model declares
every field its writers emit (docs/ledger.md lists them, and a test holds the two together);
fields no model declares, and record types this version does not know, pass unchecked (a
plain :class:`Record`), so newer writers can add to the format.

Numbers are ``int | float``: a ledger's ``1`` reads back as ``1`` and its ``1.0`` as ``1.0``,
so a record read and written again has the bytes, and the hash, it was read with.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Annotated, Any, Literal, TypeVar, cast, overload

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError

from aiperf.errors import AiperfError, excerpt
from aiperf.ledger.json_types import JSONObject
from nas.graph import NodeDoc

MAX_COUNT = 2**53  # integers beyond this lose precision as floats; no real count comes near
MAX_T = 1e10  # seconds on the master clock (317 years)
MAX_WALL = 253402300799.0  # 9999-12-31T23:59:59Z, the last second a date can show
MAX_QUANTITY = 1e300  # operations, seconds, bytes: sums of a few of these stay finite

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Niceness = Annotated[int, Field(ge=-20, le=19)]  # a Unix process's scheduling niceness


def _number(lowest: float, highest: float) -> PlainValidator:
    """A JSON number in ``[lowest, highest]``, kept as the int or float it was (so its bytes round-trip).

    One validator rather than pydantic's ``int | float`` union, whose errors name a union
    member ("val_acc.int: ...") instead of the field.
    """
    # Bounds show as pydantic shows them (an integral float as an integer), so messages are as before.
    shown_low, shown_high = (int(b) if float(b).is_integer() else b for b in (lowest, highest))

    def check(value: object) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PydanticCustomError("float_type", "Input should be a valid number")
        if isinstance(value, float) and not math.isfinite(value):
            raise PydanticCustomError("finite_number", "Input should be a finite number")
        if value < lowest:
            raise PydanticCustomError(
                "greater_than_equal", "Input should be greater than or equal to {ge}", {"ge": shown_low}
            )
        if value > highest:
            raise PydanticCustomError(
                "less_than_equal", "Input should be less than or equal to {le}", {"le": shown_high}
            )
        return value

    return PlainValidator(check, json_schema_input_type=float)


Quantity = Annotated[int | float, _number(0, MAX_QUANTITY)]
Number = Annotated[int | float, _number(-MAX_QUANTITY, MAX_QUANTITY)]
Fraction = Annotated[int | float, _number(0, 1)]
Seconds = Annotated[int | float, _number(0, MAX_T)]
WallTime = Annotated[int | float, _number(0, MAX_WALL)]

HEADER = ("seq", "type", "t", "wall", "prev", "hash")  # what the ledger adds to every record


# The names the writers put into records. They are StrEnums, so a record written with them
# serialises to exactly the bytes (and hash) of one written with the plain strings.
class RecordType(enum.StrEnum):
    """The ``type`` of a ledger record (docs/ledger.md, Record types)."""

    RUN_START = "run_start"
    TRIAL_START = "trial_start"
    EPOCH = "epoch"
    TRIAL_END = "trial_end"
    REQUEUE = "requeue"
    WORKER = "worker"
    WORKER_FAILED = "worker_failed"
    BAD_IMAGES = "bad_images"
    WEIGHTS = "weights"
    RESUME = "resume"
    RUN_STOP = "run_stop"
    AUDIT = "audit"  # after the run's end: binds audit.json to the ledger (docs/results.md, Audit)


class TrialStatus(enum.StrEnum):
    """How a trial attempt ended (``trial_end.status``)."""

    COMPLETED = "completed"
    FAILED = "failed"  # it raised; the run goes on
    LOST = "lost"  # its worker or the master died and it was not re-queued
    STOPPED = "stopped"  # the run ended while it trained or waited to be re-queued
    UNRESPONSIVE = "unresponsive"  # its worker stopped answering (docs/cluster.md, "When Ray stops answering")


class RunStatus(enum.StrEnum):
    """How a session of the run ended (``run_stop.status``)."""

    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"  # the run could not train (docs/cluster.md, Faults)


_PLAIN = frozenset((str, int, bool, type(None)))  # leaves JSON holds as they are: most of a graph's fields


@overload
def json_safe(value: dict[str, object]) -> dict[str, object]: ...
@overload
def json_safe(value: object) -> object: ...
def json_safe(value: object) -> object:
    """A value as JSON can hold it: NaN/inf become None, tuples lists, NumPy scalars Python numbers.

    Anything else (a string, a graph's node documents) is returned as it is: an object stays an
    object, which is all the record models need to know (pydantic checks the rest).
    """
    if type(value) in _PLAIN:  # first: the most common leaves
        return value
    if type(value) is NodeDoc:  # a graph's nodes, safe by construction: every trial's record carries its graph
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # NumPy scalar
        return json_safe(value.item())
    return value


class _Shape(BaseModel):
    # strict: no "1" -> 1 or True -> 1; allow: unknown fields are fine (newer writers add some).
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    def __init__(self, **fields: object) -> None:
        # What a writer hands over may hold NumPy scalars or a NaN loss: stored as JSON has them.
        super().__init__(**json_safe(fields))


# Status fields read a ledger's string into the enum (strict mode alone accepts only enum members).
TrialStatusField = Annotated[TrialStatus, Field(strict=False)]
RunStatusField = Annotated[RunStatus, Field(strict=False)]


class Record(_Shape):
    """A ledger record of any type; records of a type this version does not know are read as this.

    The header fields are filled in by :meth:`aiperf.ledger.store.LedgerWriter.append`; a
    writer sets ``t`` only to stamp a record with a time of its own clock.
    """

    seq: Count = 0
    type: str = ""
    t: Seconds = 0.0
    wall: WallTime = 0.0
    prev: str = ""
    hash: str = ""

    def to_dict(self) -> JSONObject:
        """The record as its JSON object: exactly the fields it was written or read with."""
        return self.model_dump(exclude_unset=True)

    def extra(self, name: str, default: object = None) -> object:
        """A field no model declares (one a newer writer added), or ``default``."""
        return (self.model_extra or {}).get(name, default)


RecordT = TypeVar("RecordT", bound=Record)


def of_type(records: Iterable[Record], kind: type[RecordT]) -> list[RecordT]:
    """The records of one type, typed as such (the readers' filter)."""
    return [r for r in records if isinstance(r, kind)]


class _RunSection(_Shape):
    name: str | None = None
    telemetry_interval_s: Quantity | None = None
    organization: str | None = None  # the MLPerf log's submission_org
    seed: int | None = None  # the run's seed (the MLPerf log's seed)
    time_budget_s: Quantity | None = None  # the size schedule's progress is master time over this


class _DatasetSection(_Shape):
    name: str | None = None
    max_bad_fraction: Fraction | None = None


class _SearchSection(_Shape):
    size_growth: Number | None = None  # the size schedule (docs/search.md); None: no schedule
    size_band: Number | None = None
    max_flops_per_image: Quantity | None = None  # caps the schedule's end


class ConfigHeader(_Shape):
    run: _RunSection = _RunSection()
    dataset: _DatasetSection = _DatasetSection()
    search: _SearchSection = _SearchSection()


class _Split(_Shape):
    method: str | None = None
    seed: int | None = None
    disjoint: bool | None = None


class _BadImagesAtLoad(_Shape):
    count: Count = 0
    files: list[str] = []
    max_fraction: Fraction | None = None
    missing_count: Count = 0  # of count: files gone when read (absent before 2026-11-26)
    missing: list[str] = []  # the first 100 of them


class DatasetHeader(_Shape):
    name: str | None = None
    storage: str | None = None
    bad_images: _BadImagesAtLoad | None = None
    fingerprint: str | None = None
    train_images: Count | None = None
    eval_images: Count | None = None
    num_classes: Count | None = None
    input_shape: list[Count] | None = None
    split: _Split | None = None
    source: str | None = None
    streaming: bool | None = None
    # A language-model workload (RunStartRecord.family "language"): its tokens instead of images.
    train_tokens: Count | None = None
    eval_tokens: Count | None = None
    vocab_size: Count | None = None
    tokenizer: str | None = None
    bytes_per_token: Quantity | None = None  # text bytes per token: bits per byte = nats per token / ln 2 / this


class _Node(_Shape):
    node_id: str = ""
    hostname: str | None = None
    cpus: Quantity = 0
    gpus: Quantity = 0
    accelerator: str | None = None
    cpu_model: str | None = None
    memory_bytes: Quantity | None = None


class PlanHeader(_Shape):
    backend: str | None = None
    nodes: list[_Node] = []  # the nodes at the run's start
    planned_nodes: Count | None = None  # cluster.planned_nodes: the nodes the job was given (absent: none stated)
    concurrency: Count | None = None
    placement: str | None = None
    actors: str | None = None  # per_worker | per_node (absent before 2026-11-26: per_worker)
    precision: str | None = None
    batch_size: Count | None = None
    threads_per_trial: Count | None = None
    compile_ahead: bool | None = None  # train.compile_ahead as the plan resolved it (absent before 2026-12-07)
    compile_ahead_why: str | None = None  # the plan's reason for it
    workload: str | None = None  # the config chosen for the host where no --config was named (from 2026-12-08)
    workload_why: str | None = None  # why that one
    trial_sizing: str | None = None  # how a trial's epochs were sized (from 2026-12-08)


class RulesHeader(_Shape):
    min_accuracy: Fraction | None = None
    official_min_duration_s: Quantity | None = None
    min_precision_bits: Count | None = None


class PeakFigureHeader(_Shape):
    """One device's peak at one precision (aiperf.system.peak.PeakFigure)."""

    flops_per_s: Quantity
    arithmetic: str | None = None
    source: str | None = None  # table | formula | declared
    reference: str | None = None


class _KindPeaks(_Shape):
    accelerator: str | None = None  # the kind's accelerator model (None: a CPU-only kind)
    per_accelerator: dict[str, PeakFigureHeader | None] = {}  # precision -> figure (None: unknown)
    cpu: str | None = None
    per_core: dict[str, PeakFigureHeader | None] = {}


class _CacheLevel(_Shape):
    level: Count | None = None
    type: str | None = None
    size_bytes: Count | None = None
    instances: Count | None = None


class _CpuDescription(_Shape):
    model: str | None = None
    vendor: str | None = None
    architecture: str | None = None
    family: Count | None = None
    sockets: Count | None = None
    cores: Count | None = None
    threads: Count | None = None
    base_mhz: Quantity | None = None
    max_mhz: Quantity | None = None
    clock_source: str | None = None
    vector_isa: str | None = None
    flags: list[str] = []
    sve_vector_bits: Count | None = None
    caches: list[_CacheLevel] = []


class _AcceleratorDescription(_Shape):
    index: Count | None = None
    name: str | None = None
    memory_bytes: Quantity | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    compute_capability: list[Count] | None = None
    max_sm_mhz: Quantity | None = None
    max_memory_mhz: Quantity | None = None
    memory_bus_bits: Count | None = None
    pci_bus_id: str | None = None
    pcie_generation: Count | None = None
    pcie_width: Count | None = None
    nvlinks_active: Count | None = None
    nvlink_version: Count | None = None
    power_limit_w: Quantity | None = None
    source: str | None = None


class NodeDescriptionHeader(_Shape):
    """One node measured from the inside (aiperf.system.node.NodeDescription; docs/system.md)."""

    hostname: str | None = None
    cpu: _CpuDescription | None = None
    memory_bytes: Quantity | None = None
    accelerators: list[_AcceleratorDescription] = []
    accelerator_topology: dict[str, str] = {}
    operating_system: str | None = None
    kernel: str | None = None
    software: dict[str, str] = {}
    commit: str | None = None


class NodeKindHeader(_Shape):
    """Identical nodes (aiperf.system.kinds.NodeKind): the devices a run trains on and their peaks."""

    count: Count
    nodes: list[str] = []
    hostnames: list[str] = []
    description: NodeDescriptionHeader = NodeDescriptionHeader()
    used_accelerators: Count = 0
    used_cores: Count = 0
    peaks: _KindPeaks = _KindPeaks()


class _SystemNode(_Shape):
    node_id: str | None = None
    address: str | None = None
    hostname: str | None = None
    cpus: Quantity | None = None
    gpus: Quantity | None = None
    memory_bytes: Quantity | None = None
    cpu_model: str | None = None
    accelerators: list[dict[str, Any]] = []
    resources: dict[str, Number] = {}
    is_head: bool | None = None


class SystemHeader(_Shape):
    """``run_start.system`` and ``resume.system``: the machine a session ran on."""

    head: str | None = None
    platform: str | None = None
    nodes: list[_SystemNode] | Count = []  # Ray's view of each node; a simulated run records its node count
    simulated: bool | None = None
    kinds: list[NodeKindHeader] = []  # absent in ledgers written before 2026-11-25
    commit: str | None = None  # the head's source commit (aiperf.system.software.source_commit)
    declared_peak: dict[str, dict[str, Quantity]] = {}  # the site file's, device -> precision -> FLOP/s


class _SizeRate(_Shape):
    n: Positive
    flops_per_s: Quantity
    reps: Count | None = None


class CeilingHeader(_Shape):
    """A worker's measured dense matmul ceiling (aiperf.system.ceiling.Ceiling)."""

    flops_per_s: Quantity | None = None  # per device; None when the measurement failed
    dtype: str | None = None
    backend: str | None = None
    seconds: Quantity | None = None
    rates: list[_SizeRate] = []
    devices: Positive = 1
    device_ids: str = ""
    error: str | None = None


class RunStartRecord(Record):
    type: Literal[RecordType.RUN_START] = RecordType.RUN_START
    run_id: str
    config: ConfigHeader = ConfigHeader()
    dataset: DatasetHeader = DatasetHeader()
    plan: PlanHeader = PlanHeader()
    rules: RulesHeader = RulesHeader()
    versions: dict[str, Any] = {}
    system: SystemHeader = SystemHeader()
    # image: convolutional networks on images (nas.graph); language: transformer LMs on tokens (nas.language.spec).
    # Absent before 2026-11-26: image.
    family: Literal["image", "language"] = "image"
    seed_architecture: dict[str, Any] | None = None  # the family's own format: a graph, or a transformer spec


class TrialFlops(_Shape):
    """Operations per example: per image for an image trial, per token (at the trial's seq_len) for a language one."""

    forward: Quantity | None = None
    backward: Quantity | None = None
    update_per_step: Quantity | None = None
    train_per_image: Quantity | None = None  # an image trial's (required there: verify checks it)
    eval_per_image: Quantity | None = None
    train_per_token: Quantity | None = None  # a language trial's, its optimizer update spread over a step's tokens
    eval_per_token: Quantity | None = None


class TrialHparams(_Shape):
    learning_rate: Quantity | None = None
    batch_size: Positive | None = None
    weight_decay: Quantity | None = None
    dropout: Fraction | None = None
    kernel_size: Positive | None = None
    epochs: Positive | None = None
    warmup_fraction: Fraction | None = None  # language trials: share of the updates that warm the rate up
    seq_len: Positive | None = None  # language trials: tokens per training sequence


class TrialStartRecord(Record):
    type: Literal[RecordType.TRIAL_START] = RecordType.TRIAL_START
    trial: str
    kind: str
    parent: str | None = None
    inherit: str | None = None
    morphs: list[dict[str, Any]] = []
    lineage: list[str] = []
    arch_id: str
    graph: dict[str, Any] | None = None  # an image trial's architecture (nas.serialize)
    transformer: dict[str, Any] | None = None  # a language trial's (nas.language.spec, format aiperf-transformer)
    hparams: TrialHparams = TrialHparams()
    flops: TrialFlops
    params: Count
    worker: str | None = None
    node: str | None = None
    attempt: Count = 0
    start_epoch: Count = 0
    seed: Annotated[int, Field(ge=-MAX_COUNT, le=MAX_COUNT)] | None = None  # training seed (`aiperf audit --retrain`)
    # The share of the time budget whose size band the trial was proposed for: when its training was
    # expected to end (absent before 2026-12-07).
    aimed_at: Fraction | None = None
    weights_lost: str | None = None  # weights sent that could not be fetched (their node is gone): what it started from
    info: dict[str, Any] = {}


class EpochRecord(Record):
    type: Literal[RecordType.EPOCH] = RecordType.EPOCH
    trial: str
    epoch: Positive
    attempt: Count = 0
    train_images: Count | None = None
    steps: Count | None = None  # training steps of the epoch (the worker's report; null from the simulator)
    eval_images: Count | None = None
    batch_size: Positive | None = None
    train_ops: Quantity | None = None
    eval_ops: Quantity | None = None
    ops: Quantity | None = None
    aiperf_ops: Quantity | None = None
    # The validation quality the search maximises and the score regulates: top-1 accuracy for an
    # image trial; 1 - bits_per_byte / 8 for a language one (docs/llm.md, "Quality").
    val_acc: Fraction
    train_acc: Number | None = None
    train_loss: Number | None = None
    val_loss: Number | None = None
    bits_per_byte: Quantity | None = None  # language trials: validation bits per byte of text
    train_tokens: Count | None = None  # language trials: tokens trained on (train_images: their sequences)
    eval_tokens: Count | None = None
    train_s: Quantity | None = None
    eval_s: Quantity | None = None
    data_wait_s: Quantity | None = None
    input: str | None = None
    skipped_images: Count = 0
    missing_images: Count = 0  # of skipped_images: files deleted since the run began (absent before 2026-11-26)
    precision: str
    oom_retries: Count = 0
    idle_before_s: Number | None = None
    # Of train_s + eval_s, the tracing/compilation this epoch disclosed (absent before 2026-12-07).
    compile_s: Quantity | None = None
    # First epoch of an attempt: of idle_before_s, the wait for its steps to finish compiling ahead.
    compile_wait_s: Quantity | None = None
    worker: str | None = None
    node: str | None = None


class TrialEndRecord(Record):
    type: Literal[RecordType.TRIAL_END] = RecordType.TRIAL_END
    trial: str
    status: TrialStatusField
    reason: str | None = None
    attempt: Count = 0
    epochs: Count | None = None
    best_val_acc: Fraction | None = None
    worker: str | None = None
    startup_s: Quantity | None = None
    first_step_s: Quantity | None = None
    compile_s: Quantity | None = None
    step_reused: bool | None = None
    batch_size: Positive | None = None
    requested_batch_size: Positive | None = None


class RequeueRecord(Record):
    type: Literal[RecordType.REQUEUE] = RecordType.REQUEUE
    trial: str
    attempt: Count | None = None
    from_epoch: Count | None = None
    reason: str | None = None
    worker: str | None = None


class IdleGaps(_Shape):
    mean_s: Quantity | None = None


class WorkerRecord(Record):
    type: Literal[RecordType.WORKER] = RecordType.WORKER
    worker: str
    node: str | None = None
    hostname: str | None = None
    device: dict[str, Any] = {}
    busy_s: Quantity | None = None
    alive_s: Quantity | None = None
    compile_s: Quantity | None = None
    busy_fraction: Quantity | None = None
    steady_busy_fraction: Quantity | None = None
    idle_gaps: IdleGaps = IdleGaps()
    decode_threads: Positive | None = None
    precision: str | None = None
    init_s: Quantity | None = None
    ceiling: CeilingHeader | None = None  # absent in ledgers written before 2026-11-25
    niceness: Niceness | None = None  # the worker process's Unix niceness (absent before 2026-12-07)
    worker_reported: dict[str, Any] | None = None
    retired: str | None = None


class WorkerFailedRecord(Record):
    type: Literal[RecordType.WORKER_FAILED] = RecordType.WORKER_FAILED
    worker: str
    node: str | None = None
    hostname: str | None = None
    cause: str


class BadImagesRecord(Record):
    type: Literal[RecordType.BAD_IMAGES] = RecordType.BAD_IMAGES
    trial: str | None = None
    worker: str | None = None
    node: str | None = None
    files: list[str] = []
    count: Count = 0
    epoch_count: Count | None = None
    over_limit: bool = False
    missing: list[str] = []  # of files: those that no longer exist (absent before 2026-11-26)


class ResumeRecord(Record):
    type: Literal[RecordType.RESUME] = RecordType.RESUME
    gap_s: Quantity | None = None
    from_seq: Count | None = None
    weights_skipped: list[str] = []  # kept weights files that could not be read back (their children start afresh)
    plan: dict[str, Any] = {}
    system: SystemHeader = SystemHeader()


class RunStopRecord(Record):
    type: Literal[RecordType.RUN_STOP] = RecordType.RUN_STOP
    status: RunStatusField
    reason: str | None = None
    control_plane_silent_t: Seconds | None = None  # when Ray's control plane first stopped answering (absent: never)
    control_plane_silent_s: Quantity | None = None  # how long, in all, it did not answer this session
    # telemetry.jsonl as the run stopped: its size and SHA-256 (absent before 2026-12-07, and when telemetry
    # stopped early): the energy and utilisation figures come from that prefix only, unchanged.
    telemetry_bytes: Count | None = None
    telemetry_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


class WeightsRecord(Record):
    """A weights file the master wrote (``aiperf audit`` re-evaluates it and checks its hash)."""

    type: Literal[RecordType.WEIGHTS] = RecordType.WEIGHTS
    trial: str
    attempt: Count = 0
    epoch: Positive  # the epoch after which these weights were taken
    file: str  # relative to the run directory: weights/<trial>.npz
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    bytes: Count


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class AuditRecord(Record):
    """``aiperf audit`` appends one after the run's end: the hash of the ``audit.json`` it wrote, so the
    report shows an audit as passed only when that file is the one the ledger names."""

    type: Literal[RecordType.AUDIT] = RecordType.AUDIT
    audited_hash: Sha256  # the hash of the run's last record (before any audit record) it audited
    result_sha256: Sha256  # SHA-256 of audit.json's bytes as written
    ok: bool


def run_records(records: list[RecordT]) -> list[RecordT]:
    """The run's own records: the ledger without the audit records appended after its end."""
    return [r for r in records if r.type != RecordType.AUDIT]


SHAPES: dict[str, type[Record]] = {
    RecordType.RUN_START: RunStartRecord,
    RecordType.TRIAL_START: TrialStartRecord,
    RecordType.EPOCH: EpochRecord,
    RecordType.TRIAL_END: TrialEndRecord,
    RecordType.REQUEUE: RequeueRecord,
    RecordType.WORKER: WorkerRecord,
    RecordType.RESUME: ResumeRecord,
    RecordType.RUN_STOP: RunStopRecord,
    RecordType.WORKER_FAILED: WorkerFailedRecord,
    RecordType.BAD_IMAGES: BadImagesRecord,
    RecordType.WEIGHTS: WeightsRecord,
    RecordType.AUDIT: AuditRecord,
}


SHAPES_TYPE: dict[str, RecordType] = {t.value: t for t in RecordType}


def _where(record: Mapping[str, object], index: int) -> str:
    seq, rtype = record.get("seq"), record.get("type")
    seq_text = str(seq) if isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq < 10**12 else excerpt(seq)
    kind = rtype if isinstance(rtype, str) and rtype.isidentifier() and len(rtype) <= 20 else excerpt(rtype)
    return f"record {index + 1} (seq {seq_text}, {kind})"


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) if isinstance(p, int) or (isinstance(p, str) and len(p) <= 40) else excerpt(p) for p in loc)


# --- the fast path: the most frequent record types checked without pydantic -------------------------
#
# Epochs, trial starts and trial ends are nearly all of a long ledger, and validating them with pydantic
# cost more than reading them (benchmarks/RESULTS.md, "The ledger at 10 million records"). Their fields are
# checked here with the same rules as their models (strict types, the same ranges) and, when every field
# passes, the model is built without validating again. A ledger's records of one type share a few layouts
# (the same keys, each value of the same JSON type), so what a layout needs checked -- the ranges of its
# numbers, the members of its lists, its enum -- is worked out once per layout (a _Plan) and each record
# pays only for those checks. Anything the fast path does not accept -- a wrong type, a value out of
# range, a field it has no rule for -- goes to pydantic, which decides and words the problem: the fast
# path can only be stricter, never more lenient, than the models.

_NONE = type(None)
_INT, _NUM = (int,), (int, float)


@dataclass(frozen=True)
class _Rule:
    """One field's rule, as its model states it: the JSON types it takes, a range, None allowed."""

    types: tuple[type, ...]
    low: float | None = None
    high: float | None = None
    optional: bool = False
    items: type | None = None  # a list's members: all of this type
    members: frozenset[str] | None = None  # an enum's values


def _ranged(types: tuple[type, ...], low: float, high: float, optional: bool = False) -> _Rule:
    return _Rule(types, low, high, optional)


_COUNT, _POSITIVE = _ranged(_INT, 0, MAX_COUNT), _ranged(_INT, 1, MAX_COUNT)
_QTY, _FRACTION_R = _ranged(_NUM, 0, MAX_QUANTITY), _ranged(_NUM, 0, 1)
_OPT_COUNT, _OPT_POSITIVE = _ranged(_INT, 0, MAX_COUNT, True), _ranged(_INT, 1, MAX_COUNT, True)
_OPT_QTY, _OPT_NUMBER = _ranged(_NUM, 0, MAX_QUANTITY, True), _ranged(_NUM, -MAX_QUANTITY, MAX_QUANTITY, True)
_OPT_FRACTION = _ranged(_NUM, 0, 1, True)
_STR, _OPT_STR, _OPT_BOOL, _DICT = (
    _Rule((str,)),
    _Rule((str,), optional=True),
    _Rule((bool,), optional=True),
    _Rule((dict,)),
)
_HEADER_RULES: dict[str, _Rule] = {
    "seq": _COUNT,
    "t": _ranged(_NUM, 0, MAX_T),
    "wall": _ranged(_NUM, 0, MAX_WALL),
    "prev": _STR,
    "hash": _STR,
    "type": _STR,  # the value the record was dispatched on
}
_FAST_RULES: dict[str, dict[str, _Rule]] = {
    RecordType.EPOCH: {
        "trial": _STR,
        "epoch": _POSITIVE,
        "attempt": _COUNT,
        "train_images": _OPT_COUNT,
        "steps": _OPT_COUNT,
        "eval_images": _OPT_COUNT,
        "batch_size": _OPT_POSITIVE,
        "train_ops": _OPT_QTY,
        "eval_ops": _OPT_QTY,
        "ops": _OPT_QTY,
        "aiperf_ops": _OPT_QTY,
        "val_acc": _FRACTION_R,
        "train_acc": _OPT_NUMBER,
        "train_loss": _OPT_NUMBER,
        "val_loss": _OPT_NUMBER,
        "bits_per_byte": _OPT_QTY,
        "train_tokens": _OPT_COUNT,
        "eval_tokens": _OPT_COUNT,
        "train_s": _OPT_QTY,
        "eval_s": _OPT_QTY,
        "data_wait_s": _OPT_QTY,
        "input": _OPT_STR,
        "skipped_images": _COUNT,
        "missing_images": _COUNT,
        "precision": _STR,
        "oom_retries": _COUNT,
        "idle_before_s": _OPT_NUMBER,
        "worker": _OPT_STR,
        "node": _OPT_STR,
    },
    RecordType.TRIAL_END: {
        "trial": _STR,
        "status": _Rule((str,), members=frozenset(s.value for s in TrialStatus)),
        "reason": _OPT_STR,
        "attempt": _COUNT,
        "epochs": _OPT_COUNT,
        "best_val_acc": _OPT_FRACTION,
        "worker": _OPT_STR,
        "startup_s": _OPT_QTY,
        "first_step_s": _OPT_QTY,
        "compile_s": _OPT_QTY,
        "step_reused": _OPT_BOOL,
        "batch_size": _OPT_POSITIVE,
        "requested_batch_size": _OPT_POSITIVE,
    },
    RecordType.TRIAL_START: {
        "trial": _STR,
        "kind": _STR,
        "parent": _OPT_STR,
        "inherit": _OPT_STR,
        "morphs": _Rule((list,), items=dict),
        "lineage": _Rule((list,), items=str),
        "arch_id": _STR,
        "graph": _Rule((dict,), optional=True),
        "transformer": _Rule((dict,), optional=True),
        "params": _COUNT,
        "worker": _OPT_STR,
        "node": _OPT_STR,
        "attempt": _COUNT,
        "start_epoch": _COUNT,
        "seed": _ranged(_INT, -MAX_COUNT, MAX_COUNT, True),
        "weights_lost": _OPT_STR,
        "info": _DICT,
    },
}
# Nested models of the fast-path types (checked by their own plans): field -> (model, rules).
_NESTED_RULES: dict[str, dict[str, tuple[type[_Shape], dict[str, _Rule]]]] = {
    RecordType.TRIAL_START: {
        "hparams": (
            TrialHparams,
            {
                "learning_rate": _OPT_QTY,
                "batch_size": _OPT_POSITIVE,
                "weight_decay": _OPT_QTY,
                "dropout": _OPT_FRACTION,
                "kernel_size": _OPT_POSITIVE,
                "epochs": _OPT_POSITIVE,
                "warmup_fraction": _OPT_FRACTION,
                "seq_len": _OPT_POSITIVE,
            },
        ),
        "flops": (
            TrialFlops,
            {
                "forward": _OPT_QTY,
                "backward": _OPT_QTY,
                "update_per_step": _OPT_QTY,
                "train_per_image": _OPT_QTY,
                "eval_per_image": _OPT_QTY,
                "train_per_token": _OPT_QTY,
                "eval_per_token": _OPT_QTY,
            },
        ),
    },
}
_TRIAL_STATUSES: dict[str, TrialStatus] = {s.value: s for s in TrialStatus}
_ENUMS: dict[str, Mapping[str, enum.StrEnum]] = {"status": _TRIAL_STATUSES}


class _Plan:
    """What one layout of a record (its keys and their JSON types) needs checked, and how its model is built."""

    __slots__ = ("enums", "extra", "fixed", "items", "mutable", "nested", "ranges", "shape", "type_value")

    def __init__(self, shape: type[_Shape], rules: dict[str, _Rule], keys: tuple[str, ...], types: tuple[type, ...]):
        fields = shape.model_fields
        by_range: dict[tuple[float, float], list[str]] = {}
        self.items: list[tuple[str, type]] = []
        self.enums: list[tuple[str, Mapping[str, enum.StrEnum]]] = []
        self.nested: list[tuple[str, type[_Shape], dict[str, _Rule]]] = []
        nested = {name: spec for spec_of in _NESTED_RULES.values() for name, spec in spec_of.items()}
        for name, kind in zip(keys, types, strict=True):
            rule = rules.get(name)
            if rule is None:
                if name in nested and name in fields and kind is dict and shape in (TrialStartRecord,):
                    self.nested.append((name, *nested[name]))
                    continue
                if name in fields:
                    raise _NoPlan  # a declared field without a rule here: pydantic checks it
                continue  # a field no model declares: kept, unchecked, as pydantic keeps it
            if kind is _NONE:
                if not rule.optional:
                    raise _NoPlan
                continue
            if kind not in rule.types:
                raise _NoPlan
            if rule.low is not None and rule.high is not None:
                by_range.setdefault((rule.low, rule.high), []).append(name)
            if rule.items is not None:
                self.items.append((name, rule.items))
            if rule.members is not None:
                self.enums.append((name, _ENUMS[name]))
        required = {name for name, field in fields.items() if field.is_required()}
        if not required <= set(keys):
            raise _NoPlan
        self.ranges = [(itemgetter(*names), len(names) == 1, low, high) for (low, high), names in by_range.items()]
        self.shape = shape
        self.type_value = SHAPES_TYPE.get(shape.model_fields["type"].default) if "type" in fields else None
        defaults = _defaults(shape)
        self.fixed = {name: value for name, value in defaults[0].items() if name not in keys}
        self.mutable = [name for name in defaults[1] if name not in keys]
        self.extra = [name for name in keys if name not in fields]  # kept, unchecked, as pydantic keeps them

    def build(self, record: Mapping[str, Any]) -> _Shape | None:
        """The model of ``record`` if its values pass, else None.

        ``record`` has this plan's layout, so each value is of the JSON type the plan was made for: the
        code below relies on that (a list iterated, a string looked up), which a static type cannot say.
        """
        for getter, single, low, high in self.ranges:
            if single:
                value = getter(record)
                if not low <= value <= high:  # NaN fails both comparisons
                    return None
            else:
                values = getter(record)
                try:
                    total = sum(values)
                except OverflowError:  # an integer too large for a float beside floats: pydantic words it
                    return None
                if total != total or min(values) < low or max(values) > high:  # NaN, or out of range
                    return None
        for name, kind in self.items:
            if not all(type(item) is kind for item in record[name]):
                return None
        data = {**self.fixed, **record}
        for name, members in self.enums:
            member = members.get(record[name])
            if member is None:
                return None
            data[name] = member
        for name, model, rules in self.nested:
            built = _fast_build(model, rules, record[name])
            if built is None:
                return None
            data[name] = built
        if self.type_value is not None:
            data["type"] = self.type_value
        for name in self.mutable:
            data[name] = self.shape.model_fields[name].get_default(call_default_factory=True)
        extra = {name: data.pop(name) for name in self.extra}
        obj = self.shape.__new__(self.shape)
        object.__setattr__(obj, "__dict__", data)
        object.__setattr__(obj, "__pydantic_fields_set__", set(record))  # extra fields count as set, as in pydantic
        object.__setattr__(obj, "__pydantic_extra__", extra)
        object.__setattr__(obj, "__pydantic_private__", None)
        return obj


class _NoPlan(Exception):
    """A layout the fast path leaves to pydantic."""


_DEFAULTS: dict[
    type[_Shape], tuple[dict[str, object], dict[str, object]]
] = {}  # shape -> (immutable, mutable) defaults


def _defaults(shape: type[_Shape]) -> tuple[dict[str, object], dict[str, object]]:
    found = _DEFAULTS.get(shape)
    if found is None:
        fixed: dict[str, object] = {}
        mutable: dict[str, object] = {}
        for name, field in shape.model_fields.items():
            if not field.is_required():
                default = field.get_default(call_default_factory=True)
                (mutable if isinstance(default, (list, dict, set, BaseModel)) else fixed)[name] = default
        found = _DEFAULTS[shape] = (fixed, mutable)
    return found


_PLANS: dict[tuple[type[_Shape], tuple[str, ...], tuple[type, ...]], _Plan | None] = {}
MAX_PLANS = 4096  # layouts remembered; a ledger has a handful per record type


def _fast_build(shape: type[_Shape], rules: dict[str, _Rule], record: Mapping[str, object]) -> _Shape | None:
    key = (shape, tuple(record), tuple(map(type, record.values())))
    try:
        plan = _PLANS[key]
    except KeyError:
        try:
            plan = _Plan(shape, rules, key[1], key[2])
        except _NoPlan:
            plan = None
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return None if plan is None else plan.build(record)


def _fast(rtype: str, record: Mapping[str, object]) -> Record | None:
    rules = _FAST_RULES_ALL.get(rtype)
    if rules is None:
        return None
    return cast(Record | None, _fast_build(SHAPES[rtype], rules, record))


_FAST_RULES_ALL: dict[str, dict[str, _Rule]] = {
    rtype: {**_HEADER_RULES, **rules} for rtype, rules in _FAST_RULES.items()
}


def _parse(record: Mapping[str, object], index: int) -> Record | str:
    """The record as its model, or what is wrong with it (one line)."""
    missing = next((name for name in HEADER if name not in record), None)
    if missing is not None:
        return f"{_where(record, index)}: {missing}: field required (missing)"
    rtype = record["type"]
    if type(rtype) is str:
        fast = _fast(rtype, record)
        if fast is not None:
            return fast
    shape = SHAPES.get(rtype, Record) if isinstance(rtype, str) else Record
    try:
        return shape.model_validate(record)
    except ValidationError as exc:
        err = exc.errors()[0]
        got = "missing" if err["type"] == "missing" else f"got {excerpt(err.get('input'))}"
        return f"{_where(record, index)}: {_field(err['loc'])}: {err['msg'].lower()} ({got})"


def checked_record(record: Mapping[str, object], index: int = 0) -> Record | str:
    """One ledger JSON object as its typed record, or what is wrong with its shape (one line)."""
    return _parse(record, index)


def parse_record(record: Mapping[str, object], index: int = 0, source: object = "the ledger") -> Record:
    """One ledger JSON object as its typed record; :class:`AiperfError` names what is wrong with it."""
    result = _parse(record, index)
    if isinstance(result, str):
        raise AiperfError(f"{source}: {result}")
    return result


def record_problem(record: Mapping[str, object], index: int = 0) -> str | None:
    """What is wrong with one record's shape (one line), or None."""
    parsed = _parse(record, index)
    return parsed if isinstance(parsed, str) else None


def shape_problems(records: Sequence[Mapping[str, object]], limit: int = 10) -> list[str]:
    """Up to ``limit`` shape problems, in file order (``verify`` lists them)."""
    problems = []
    if records and records[0].get("type") != RecordType.RUN_START:
        problems.append("the ledger does not begin with a run_start record")
    for index, record in enumerate(records):
        problem = record_problem(record, index)
        if problem:
            problems.append(problem)
            if len(problems) >= limit:
                break
    return problems


def parse_records(records: Sequence[Mapping[str, object]], source: object = "the ledger") -> list[Record]:
    """A ledger's JSON objects as typed records; :class:`AiperfError` names the first malformed one."""
    if not records:
        raise AiperfError(f"{source}: the ledger has no complete record")
    if records[0].get("type") != RecordType.RUN_START:
        raise AiperfError(f"{source}: the ledger does not begin with a run_start record")
    parsed: list[Record] = []
    for index, record in enumerate(records):
        result = _parse(record, index)
        if isinstance(result, str):
            raise AiperfError(f"{source}: {result}")
        parsed.append(result)
    return parsed
