"""The shape of each ledger record, checked before anything computes from a ledger.

The readers (summary, verify, report, ``results.load``, ``--resume``) take a ledger from
disk, where anyone may have edited it, and then index into it, sum its numbers and format
them. A record with a valid hash chain but a string where a number belongs would otherwise
end deep inside one of them as a ``TypeError``. So every record is checked against the
fields those readers use -- their types, and ranges where arithmetic or a date conversion
would overflow -- and the first problem is reported as one line naming the record and the
field. A field is required only where a reader cannot do without it; the others are checked
when present. Each model declares every field its writers emit (docs/ledger.md lists them,
and a test holds the two together); fields no model declares, and record types this version
does not know, pass unchecked, so newer writers can add to the format.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aiperf.errors import AiperfError, excerpt

MAX_COUNT = 2**53  # integers beyond this lose precision as floats; no real count comes near
MAX_T = 1e10  # seconds on the master clock (317 years)
MAX_WALL = 253402300799.0  # 9999-12-31T23:59:59Z, the last second a date can show
MAX_QUANTITY = 1e300  # operations, seconds, bytes: sums of a few of these stay finite

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Quantity = Annotated[float, Field(ge=0, le=MAX_QUANTITY)]
Number = Annotated[float, Field(ge=-MAX_QUANTITY, le=MAX_QUANTITY)]
Fraction = Annotated[float, Field(ge=0, le=1)]


# The names the writers put into records. They are StrEnums, so a record written with them
# serialises to exactly the bytes (and hash) of one written with the plain strings, and a
# reader may compare a string read back from a ledger with them directly.
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


class TrialStatus(enum.StrEnum):
    """How a trial attempt ended (``trial_end.status``)."""

    COMPLETED = "completed"
    FAILED = "failed"  # it raised; the run goes on
    LOST = "lost"  # its worker or the master died and it was not re-queued
    STOPPED = "stopped"  # the run ended while it trained or waited to be re-queued


class RunStatus(enum.StrEnum):
    """How a session of the run ended (``run_stop.status``)."""

    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"  # the run could not train (docs/cluster.md, Faults)


class _Shape(BaseModel):
    # strict: no "1" -> 1 or True -> 1; allow: unknown fields are fine (newer writers add some).
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class _Record(_Shape):
    seq: Count
    type: str
    t: Annotated[float, Field(ge=0, le=MAX_T)]
    wall: Annotated[float, Field(ge=0, le=MAX_WALL)]
    prev: str
    hash: str


class _RunSection(_Shape):
    name: str | None = None
    telemetry_interval_s: Quantity | None = None


class _ConfigHeader(_Shape):
    run: _RunSection = _RunSection()


class _Split(_Shape):
    disjoint: bool | None = None


class _BadImagesAtLoad(_Shape):
    count: Count = 0
    files: list[str] = []
    max_fraction: Fraction | None = None


class _DatasetHeader(_Shape):
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


class _Node(_Shape):
    node_id: str = ""
    hostname: str | None = None
    cpus: Quantity = 0
    gpus: Quantity = 0
    accelerator: str | None = None
    cpu_model: str | None = None
    memory_bytes: Quantity | None = None


class _Plan(_Shape):
    backend: str | None = None
    nodes: list[_Node] = []
    concurrency: Count | None = None
    placement: str | None = None
    precision: str | None = None
    batch_size: Count | None = None


class _Rules(_Shape):
    min_accuracy: Fraction | None = None
    official_min_duration_s: Quantity | None = None
    min_precision_bits: Count | None = None


class RunStart(_Record):
    run_id: str
    config: _ConfigHeader = _ConfigHeader()
    dataset: _DatasetHeader = _DatasetHeader()
    plan: _Plan = _Plan()
    rules: _Rules = _Rules()
    versions: dict[str, Any] = {}
    system: dict[str, Any] = {}
    seed_architecture: dict[str, Any] | None = None


class _Flops(_Shape):
    forward: Quantity | None = None
    backward: Quantity | None = None
    update_per_step: Quantity | None = None
    train_per_image: Quantity
    eval_per_image: Quantity | None = None


class _Hparams(_Shape):
    learning_rate: Quantity | None = None
    batch_size: Positive | None = None
    weight_decay: Quantity | None = None
    dropout: Fraction | None = None
    kernel_size: Positive | None = None
    epochs: Positive | None = None


class TrialStart(_Record):
    trial: str
    kind: str
    parent: str | None = None
    inherit: str | None = None
    morphs: list[dict[str, Any]] = []
    lineage: list[str] = []
    arch_id: str
    graph: dict[str, Any] | None = None
    hparams: _Hparams = _Hparams()
    flops: _Flops
    params: Count
    worker: str | None = None
    node: str | None = None
    attempt: Count = 0
    start_epoch: Count = 0
    seed: Annotated[int, Field(ge=-MAX_COUNT, le=MAX_COUNT)] | None = None  # training seed (`aiperf audit --retrain`)
    info: dict[str, Any] = {}


class Epoch(_Record):
    trial: str
    epoch: Positive
    attempt: Count = 0
    train_images: Count | None = None
    eval_images: Count | None = None
    batch_size: Positive | None = None
    train_ops: Quantity | None = None
    eval_ops: Quantity | None = None
    ops: Quantity | None = None
    aiperf_ops: Quantity | None = None
    val_acc: Fraction
    train_acc: Number | None = None
    train_loss: Number | None = None
    val_loss: Number | None = None
    train_s: Quantity | None = None
    eval_s: Quantity | None = None
    data_wait_s: Quantity | None = None
    input: str | None = None
    skipped_images: Count = 0
    precision: str
    oom_retries: Count = 0
    idle_before_s: Number | None = None
    worker: str | None = None
    node: str | None = None


class TrialEnd(_Record):
    trial: str
    status: str
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


class Requeue(_Record):
    trial: str
    attempt: Count | None = None
    from_epoch: Count | None = None
    reason: str | None = None
    worker: str | None = None


class _IdleGaps(_Shape):
    mean_s: Quantity | None = None


class Worker(_Record):
    worker: str
    node: str | None = None
    hostname: str | None = None
    device: dict[str, Any] = {}
    busy_s: Quantity | None = None
    alive_s: Quantity | None = None
    compile_s: Quantity | None = None
    busy_fraction: Quantity | None = None
    steady_busy_fraction: Quantity | None = None
    idle_gaps: _IdleGaps = _IdleGaps()
    decode_threads: Positive | None = None
    precision: str | None = None
    init_s: Quantity | None = None
    worker_reported: dict[str, Any] | None = None
    retired: str | None = None


class WorkerFailed(_Record):
    worker: str
    node: str | None = None
    hostname: str | None = None
    cause: str


class BadImages(_Record):
    trial: str | None = None
    worker: str | None = None
    node: str | None = None
    files: list[str] = []
    count: Count = 0
    epoch_count: Count | None = None
    over_limit: bool = False


class Resume(_Record):
    gap_s: Quantity | None = None
    from_seq: Count | None = None
    plan: dict[str, Any] = {}
    system: dict[str, Any] = {}


class RunStop(_Record):
    status: str
    reason: str | None = None


class WeightsFile(_Record):
    """A weights file the master wrote (``aiperf audit`` re-evaluates it and checks its hash)."""

    trial: str
    attempt: Count = 0
    epoch: Positive  # the epoch after which these weights were taken
    file: str  # relative to the run directory: weights/<trial>.npz
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    bytes: Count


SHAPES: dict[str, type[_Record]] = {
    RecordType.RUN_START: RunStart,
    RecordType.TRIAL_START: TrialStart,
    RecordType.EPOCH: Epoch,
    RecordType.TRIAL_END: TrialEnd,
    RecordType.REQUEUE: Requeue,
    RecordType.WORKER: Worker,
    RecordType.RESUME: Resume,
    RecordType.RUN_STOP: RunStop,
    RecordType.WORKER_FAILED: WorkerFailed,
    RecordType.BAD_IMAGES: BadImages,
    RecordType.WEIGHTS: WeightsFile,
}


def _where(record: dict[str, Any], index: int) -> str:
    seq, rtype = record.get("seq"), record.get("type")
    seq_text = str(seq) if isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq < 10**12 else excerpt(seq)
    kind = rtype if isinstance(rtype, str) and rtype.isidentifier() and len(rtype) <= 20 else excerpt(rtype)
    return f"record {index + 1} (seq {seq_text}, {kind})"


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) if isinstance(p, int) or (isinstance(p, str) and len(p) <= 40) else excerpt(p) for p in loc)


def record_problem(record: dict[str, Any], index: int = 0) -> str | None:
    """What is wrong with one record's shape (one line), or None."""
    rtype = record.get("type")
    shape = SHAPES.get(rtype, _Record) if isinstance(rtype, str) else _Record
    try:
        shape.model_validate(record)
    except ValidationError as exc:
        err = exc.errors()[0]
        got = "missing" if err["type"] == "missing" else f"got {excerpt(err.get('input'))}"
        return f"{_where(record, index)}: {_field(err['loc'])}: {err['msg'].lower()} ({got})"
    return None


def shape_problems(records: list[dict[str, Any]], limit: int = 10) -> list[str]:
    """Up to ``limit`` shape problems, in file order (``verify`` lists them)."""
    problems = []
    if records and records[0].get("type") != "run_start":
        problems.append("the ledger does not begin with a run_start record")
    for index, record in enumerate(records):
        problem = record_problem(record, index)
        if problem:
            problems.append(problem)
            if len(problems) >= limit:
                break
    return problems


def check_shapes(records: list[dict[str, Any]], source: Any = "the ledger") -> None:
    """Raise :class:`AiperfError` (unreadable input) naming the first malformed record."""
    if not records:
        raise AiperfError(f"{source}: the ledger has no complete record")
    problems = shape_problems(records, limit=1)
    if problems:
        raise AiperfError(f"{source}: {problems[0]}")
