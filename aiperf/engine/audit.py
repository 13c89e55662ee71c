"""``aiperf audit``: check a run by doing its work again.

``aiperf verify`` re-derives what a ledger claims from the ledger itself, and a keyless hash
chain only catches accidents and naive edits: a ledger rewritten with fresh hashes and a
matching ``summary.json`` verifies. The audit goes back to the evidence:

1. the cheap checks first: the run must pass ``aiperf verify`` (called, not repeated here);
2. every stored weights file is hashed and compared with the ``weights`` record the master
   wrote the moment it saved the file (a file changed afterwards fails, by name);
3. re-evaluation: the best trial and a seeded sample of other completed trials are rebuilt
   from their recorded architecture with their stored weights (each file's headers checked
   against that architecture before anything in it is unpacked), evaluated on the held-out
   split the run used (the dataset reloaded from the recorded config, its fingerprint
   checked) under the recorded precision policy, and must give the ``val_acc`` recorded for
   the epoch whose weights were stored (the trial's last epoch); a language run's trials
   (``run_start.family`` ``language``, docs/llm.md) are rebuilt from their recorded
   transformer and evaluated on the run's fixed validation windows by the trainer's own
   evaluation (:mod:`aiperf.families.language.evaluate`), their bits per byte compared;
4. ``--retrain K``: K sampled trials are trained again from their recorded spec
   (architecture, hyperparameters, seed, inherited parent weights) through the workers' own
   code (:class:`~aiperf.cluster.worker.TrialWorker`), in this process; each epoch's
   ``val_acc`` must agree within :data:`RETRAIN_ACC_TOLERANCE` and the recorded seconds per
   epoch must not be more than ``speed_factor`` times faster than this machine's.

The result is written beside the run as ``audit.json`` and shown by ``aiperf report``
(:mod:`aiperf.ledger.audit_file` reads it).
Unreadable input (no run, no dataset, another dataset) raises
:class:`~aiperf.errors.AiperfError` (exit 2); a check that fails is exit 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, overload

from aiperf import cli_limits as limits
from aiperf.engine.weights import file_sha256
from aiperf.errors import AiperfError, excerpt, first_line
from aiperf.families import family_for
from aiperf.ledger.audit_file import AUDIT_NAME, audited_end, write_bound_audit
from aiperf.ledger.files import write_atomic
from aiperf.ledger.inert import inert
from aiperf.ledger.schema import (
    EpochRecord,
    Record,
    RecordType,
    RequeueRecord,
    RunStartRecord,
    RunStatus,
    TrialEndRecord,
    TrialStartRecord,
    TrialStatus,
    WeightsRecord,
    of_type,
    parse_records,
)
from aiperf.ledger.store import LEDGER_NAME, read_raw_ledger
from aiperf.results.verify import verify_run

if TYPE_CHECKING:  # imported where they are used: the frameworks load only when the audit re-executes
    from aiperf.cluster.worker import TrialWorker, WorkerSettings
    from aiperf.config import Config
    from aiperf.datasets.base import Dataset
    from aiperf.engine.weights import LMWeights, Weights
    from aiperf.families.language.data import LanguageData
    from aiperf.families.language.trainer import LMData
    from nas.graph import Graph
    from nas.language.spec import TransformerSpec

# Re-evaluation is deterministic given the weights, the data and the code; what can differ on
# another machine (or thread count) is the summation order inside the framework's kernels, which
# moves logits by ~1e-6 and can flip the arg-max of an image whose top two logits are that close.
# So the re-evaluated accuracy may differ from the recorded one by at most this many validation
# images. (What the development box measured: benchmarks/RESULTS.md, "Figures moved from code comments".)
REEVAL_TOLERANCE_IMAGES = 1
# Per-epoch val_acc of a re-trained trial. Re-training on the machine and libraries that recorded
# a run reproduces its epochs (benchmarks/RESULTS.md), but CPU training is not
# bit-reproducible across CPU models, libraries and devices, and a small divergence grows over an
# epoch of SGD: 0.03 (11 of the 359 digits validation images) is a judgement for that case, not a
# measured bound (docs/results.md).
RETRAIN_ACC_TOLERANCE = 0.03
# A language trial's re-evaluation: its validation loss is a mean over every validation token, not
# a count, so the same summation-order noise moves it continuously rather than by whole examples
# (float32 on the machine that recorded it reproduces it to rounding, tests/engine/test_lm_audit.py);
# across devices, TF32 matmuls (float32 on recent GPUs) and bf16 rounding flips move it further.
# 0.01 bits per byte (val_acc 0.00125) is a judgement above that noise and far below any edit worth
# making (a val_acc forged 0.01 higher is 0.08 bits per byte), not a measured bound.
REEVAL_TOLERANCE_BITS_PER_BYTE = 0.01
DEFAULT_SAMPLE = 4
DEFAULT_SPEED_FACTOR = 4.0
MAX_LISTED = 10


@dataclass
class TrialCheck:
    """One re-evaluated or re-trained trial: what the ledger says, what this machine measured."""

    trial: str
    check: str  # "reevaluate" | "retrain"
    status: str  # "pass" | "fail" | "skipped"
    detail: str
    epoch: int | None = None
    recorded: object = None  # what the ledger says (a number, or the files' names)
    measured: object = None


@dataclass
class AuditResult:
    ok: bool
    message: str
    data: dict[str, Any] = field(default_factory=dict)


# --- reading the ledger -------------------------------------------------------------------------


@dataclass
class _Trial:
    start: TrialStartRecord  # the latest trial_start
    requeued: bool = False  # a later attempt resumed it (from an in-memory checkpoint no file keeps)
    status: TrialStatus | None = None
    epochs: dict[tuple[int, int], EpochRecord] = field(default_factory=dict)  # (attempt, epoch) -> record
    weights: WeightsRecord | None = None


def _trials(records: list[Record]) -> dict[str, _Trial]:
    trials: dict[str, _Trial] = {}
    for rec in records:
        if isinstance(rec, TrialStartRecord):
            prior = trials.get(rec.trial)
            trials[rec.trial] = _Trial(rec, requeued=prior is not None and prior.requeued)
            if prior:
                trials[rec.trial].epochs = prior.epochs
        elif isinstance(rec, (EpochRecord, TrialEndRecord, WeightsRecord, RequeueRecord)) and rec.trial in trials:
            t = trials[rec.trial]
            if isinstance(rec, EpochRecord):
                t.epochs[(rec.attempt, rec.epoch)] = rec
            elif isinstance(rec, TrialEndRecord):
                t.status = rec.status
            elif isinstance(rec, WeightsRecord):
                t.weights = rec
            else:
                t.requeued = True
    return trials


def _weights_path(run_dir: Path, rec: WeightsRecord) -> Path | None:
    """The file a ``weights`` record names, or None unless it is ``RUN_DIR/weights/<its trial>.npz``."""
    if not rec.file.isprintable() or len(rec.file) > 200:
        return None
    parts = PurePosixPath(rec.file).parts
    if parts != ("weights", f"{rec.trial}.npz"):  # each trial's own file, nothing else
        return None
    return run_dir / parts[0] / parts[1]


def check_weight_files(run_dir: Path, trials: dict[str, _Trial]) -> tuple[list[str], dict[str, str], list[str]]:
    """Hash every file the ledger names; returns (problems, {trial: 'ok'|'missing'}, unrecorded files)."""
    problems: list[str] = []
    state: dict[str, str] = {}
    named: set[Path] = set()
    for trial, t in trials.items():
        rec = t.weights
        if rec is None:
            continue
        path = _weights_path(run_dir, rec)
        if path is None:
            name = excerpt(rec.file)
            problems.append(f"trial {trial}: its weights record (seq {rec.seq}) names {name}, not a file in weights/")
            state[trial] = "bad"
            continue
        named.add(path)
        try:
            digest, size = file_sha256(path)
        except FileNotFoundError:
            state[trial] = "missing"  # evicted: the store keeps only the best sets
            continue
        except OSError as exc:
            problems.append(f"trial {trial}: {rec.file} cannot be read ({exc.strerror or exc})")
            state[trial] = "bad"
            continue
        if digest != rec.sha256 or size != rec.bytes:
            problems.append(
                f"trial {trial}: {rec.file} has SHA-256 {digest[:16]}... ({size:,} bytes) but the ledger "
                f"(seq {rec.seq}) recorded {rec.sha256[:16]}... ({rec.bytes} bytes): "
                "the file was changed after the run wrote it"
            )
            state[trial] = "bad"
        else:
            state[trial] = "ok"
    unrecorded = []
    with contextlib.suppress(OSError):
        unrecorded = sorted(
            f"weights/{p.name}" for p in (run_dir / "weights").glob("t*.npz") if p not in named and p.is_file()
        )
    return problems, state, unrecorded


def _best(records: list[Record]) -> EpochRecord | None:
    """The epoch the summary calls best (same rule as ``build_summary``)."""
    return max(of_type(records, EpochRecord), key=lambda r: (r.val_acc, -r.seq), default=None)


# --- doing the work again -----------------------------------------------------------------------


def _threads(header: RunStartRecord) -> int:
    """The threads one trial had in the run (the plan's), at most this machine's CPUs."""
    n = header.plan.threads_per_trial or 1
    return max(1, min(n, os.cpu_count() or 1))


def machine_description(backend: str, threads: int) -> dict[str, str | int | None]:
    """What this machine is, recorded beside the audit's timings."""
    from aiperf.training.backend import cpu_model, describe_device

    device = describe_device(backend)
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "device": f"{device.kind}: {device.name}" + (f" x{device.count}" if device.count > 1 else ""),
        "backend": backend,
        "python": platform.python_version(),
    }


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null while the frameworks work: their native libraries write
    informational lines there that would bury the audit's one-line errors. Python exceptions raised
    meanwhile still reach the caller (and are reported after the descriptor is restored); a hard
    crash of a native library would lose its message (run ``python -m aiperf.cli audit`` under
    ``AIPERF_DEBUG=1`` to see it)."""
    if os.environ.get("AIPERF_DEBUG"):
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _load_data(cfg: Config, header: RunStartRecord) -> Dataset | LanguageData:
    """The run's data reloaded from its recorded config -- a language run's tokens, else its images -- and
    checked against the fingerprint its header recorded."""
    dataset: Dataset | LanguageData
    if cfg.family != header.family:
        raise AiperfError(
            f"run_start says the run searched the {header.family} family, but its recorded config's dataset "
            f"{cfg.dataset.name} is of the {cfg.family} family"
        )
    dataset = family_for(header.family).load_data(cfg)
    recorded = header.dataset.fingerprint
    if dataset.fingerprint() != recorded:
        raise AiperfError(
            f"the dataset {dataset.name} on this machine ({dataset.source}) is not the one the run used: its "
            f"fingerprint {dataset.fingerprint()[:16]}... differs from run_start's {excerpt(recorded)}"
        )
    return dataset


def run_worker_settings(cfg: Config, threads: int, precision: str) -> WorkerSettings:
    """The settings the run's workers had (from its recorded config), on this machine's ``threads``.

    ``precision`` is the dtype policy the run's epochs record (its workers resolved ``auto``).
    Re-evaluation and re-training both train through :func:`aiperf.cluster.worker.trainer_settings`
    from these, as the run's workers did.
    """
    from aiperf.cluster.worker import WorkerSettings

    settings = WorkerSettings.from_config(cfg)  # no matmul ceiling: the audit re-trains, it does not score
    return dataclasses.replace(settings, threads=threads, data_parallel=1, precision=precision, ceiling_s=0.0)


class _Unusable(Exception):
    """A trial's recorded architecture or stored weights that cannot be used; the message names which."""


def _recorded_arch(start: TrialStartRecord, family: str) -> dict[str, Any] | None:
    """A trial's architecture document as its trial_start holds it (its family's: ``graph`` or ``transformer``)."""
    return family_for(family).recorded_arch(start)


def _architecture(start: TrialStartRecord, family: str) -> Graph | TransformerSpec:
    """The architecture the trial's workers built, rebuilt by its family from its trial_start."""
    try:
        arch: Graph | TransformerSpec = family_for(family).arch_from_record(start)
    except ValueError as exc:
        raise _Unusable(str(exc)) from None
    return arch


def _graph(start: TrialStartRecord) -> Graph:
    """The graph an image trial's workers built (its recorded architecture under its hyperparameters)."""
    from nas.graph import Graph

    graph = _architecture(start, "image")
    assert isinstance(graph, Graph)
    return graph


def _transformer(start: TrialStartRecord) -> TransformerSpec:
    """The transformer a language trial's workers built."""
    from nas.language.spec import TransformerSpec

    spec = _architecture(start, "language")
    assert isinstance(spec, TransformerSpec)
    return spec


@overload
def _stored_weights(path: Path, arch: Graph, name: str) -> Weights: ...
@overload
def _stored_weights(path: Path, arch: TransformerSpec, name: str) -> LMWeights: ...
def _stored_weights(path: Path, arch: Graph | TransformerSpec, name: str) -> Weights | LMWeights:
    """A weights file read back only once its headers declare ``arch``'s arrays (names, shapes, sizes)."""
    from aiperf.engine.weights import WeightsFileError, load_lm_weights, load_weights
    from nas.language.spec import TransformerSpec

    try:
        if isinstance(arch, TransformerSpec):
            return load_lm_weights(path, arch, name)
        return load_weights(path, arch, name)
    except WeightsFileError as exc:
        raise _Unusable(str(exc)) from None
    except OSError as exc:
        raise _Unusable(f"{name} cannot be loaded ({exc.strerror or first_line(exc)})") from None


def _stored_epoch(trial: str, t: _Trial) -> EpochRecord | TrialCheck:
    """The epoch whose weights the trial's weights record stored, or the failed check saying the ledger lacks it."""
    w = t.weights
    assert w is not None
    epoch = t.epochs.get((w.attempt, w.epoch))
    if epoch is None:
        which = f"epoch {w.epoch} of attempt {w.attempt}"
        detail = f"its weights record (seq {w.seq}) names {which}, which the ledger does not record"
        return TrialCheck(trial, "reevaluate", "fail", detail)
    return epoch


def _stored_path(run_dir: Path, rec: WeightsRecord) -> Path:
    """The file of a weights record that :func:`check_weight_files` hashed (so it names one)."""
    path = _weights_path(run_dir, rec)
    assert path is not None  # only files that hashed as recorded are read back
    return path


def reevaluate(run_dir: Path, cfg: Config, dataset: Dataset, threads: int, trial: str, t: _Trial) -> TrialCheck:
    """Rebuild ``trial`` from its recorded architecture and stored weights; compare the stored epoch's val_acc."""
    from aiperf.cluster.worker import trainer_settings
    from aiperf.families.image.input_pipeline import eval_batch_size
    from aiperf.families.image.trainer import TrialRunner, classification_metrics
    from aiperf.training.backend import describe_device

    epoch = _stored_epoch(trial, t)
    if isinstance(epoch, TrialCheck):
        return epoch
    w = t.weights
    assert w is not None
    try:
        graph = _graph(t.start)
        weights = _stored_weights(_stored_path(run_dir, w), graph, w.file)  # checked against it from its headers
    except _Unusable as exc:
        return TrialCheck(trial, "reevaluate", "fail", str(exc), epoch.epoch)
    backend = cfg.model.backend
    settings = trainer_settings(run_worker_settings(cfg, threads, epoch.precision), describe_device(backend))
    runner = TrialRunner(dataset, settings, backend)
    try:
        model = runner._build(graph, weights)  # the workers' builder, dtype policy and weight loading
    except Exception as exc:  # weights of another shape: the file is not this architecture's
        return TrialCheck(trial, "reevaluate", "fail", f"{w.file} does not fit its architecture ({exc})")
    batch = eval_batch_size(dataset.val_size, max(epoch.batch_size or 1, runner.settings.eval_batch_size))
    try:
        logits, labels, _ = runner._evaluate(model, batch)  # the workers' evaluation of the held-out split
    except Exception as exc:
        return TrialCheck(trial, "reevaluate", "fail", f"evaluating it raised {type(exc).__name__}: {first_line(exc)}")
    _, val_acc = classification_metrics(logits, labels)
    recorded = epoch.val_acc
    images = len(labels)
    off = round(abs(val_acc - recorded) * images)
    detail = (
        f"epoch {epoch.epoch} (its stored weights): recorded val_acc {recorded:.4f}, re-evaluated {val_acc:.4f}"
        f" on {images} held-out images"
    )
    ok = abs(val_acc - recorded) * images <= REEVAL_TOLERANCE_IMAGES + 1e-9
    if not ok:
        detail += f" ({off} images apart; at most {REEVAL_TOLERANCE_IMAGES} allowed)"
    return TrialCheck(trial, "reevaluate", "pass" if ok else "fail", detail, epoch.epoch, recorded, val_acc)


def reevaluate_lm(run_dir: Path, cfg: Config, windows: LMData, threads: int, trial: str, t: _Trial) -> TrialCheck:
    """Rebuild language ``trial`` from its recorded transformer and stored weights, evaluate it on the run's
    validation windows (``windows``) as its worker did, and compare the stored epoch's val_acc and bits per byte."""
    from aiperf.cluster.worker import trainer_settings
    from aiperf.families.language.evaluate import evaluate_lm_weights
    from aiperf.families.language.runner import BITS_PER_BYTE_SCALE, lm_precision
    from aiperf.training.backend import describe_device

    epoch = _stored_epoch(trial, t)
    if isinstance(epoch, TrialCheck):
        return epoch
    w = t.weights
    assert w is not None
    try:
        spec = _transformer(t.start)
        weights = _stored_weights(_stored_path(run_dir, w), spec, w.file)  # checked against it from its headers
    except _Unusable as exc:
        return TrialCheck(trial, "reevaluate", "fail", str(exc), epoch.epoch)
    settings = trainer_settings(run_worker_settings(cfg, threads, epoch.precision), describe_device(cfg.model.backend))
    try:
        got = evaluate_lm_weights(  # the workers' builder, dtype policy, windows and evaluation
            spec,
            t.start.hparams.model_dump(exclude_unset=True),
            weights,
            windows,
            steps_per_epoch=_lm_steps(epoch.steps, cfg.lm.steps_per_epoch),
            eval_windows=cfg.lm.eval_windows,
            precision=lm_precision(settings.precision),
            jit_compile=settings.jit_compile,
        )
    except AiperfError as exc:  # a recorded size or hyperparameter the trainer refuses, weights that do not fit
        return TrialCheck(trial, "reevaluate", "fail", f"it cannot be evaluated: {first_line(exc)}", epoch.epoch)
    except Exception as exc:
        return TrialCheck(trial, "reevaluate", "fail", f"evaluating it raised {type(exc).__name__}: {first_line(exc)}")
    tolerance = REEVAL_TOLERANCE_BITS_PER_BYTE
    recorded = {"val_acc": epoch.val_acc, "bits_per_byte": epoch.bits_per_byte, "val_loss": epoch.val_loss}
    measured = {"val_acc": got.quality, "bits_per_byte": got.bits_per_byte, "val_loss": got.val_loss}
    bits = "" if epoch.bits_per_byte is None else f"{epoch.bits_per_byte:.4f}"
    detail = (
        f"epoch {epoch.epoch} (its stored weights): recorded val_acc {epoch.val_acc:.4f}"
        f"{f' ({bits} bits per byte)' if bits else ''}, re-evaluated {got.quality:.4f} ({got.bits_per_byte:.4f} bits"
        f" per byte) on {got.windows} validation windows of {got.tokens:,} tokens"
    )
    problems: list[str] = []
    if epoch.eval_tokens is not None and epoch.eval_tokens != got.tokens:
        problems.append(f"the epoch records {epoch.eval_tokens:,} validation tokens")
    # val_acc = 1 - bits_per_byte / 8: its difference in bits per byte, so one tolerance covers both
    if abs(got.quality - epoch.val_acc) * BITS_PER_BYTE_SCALE > tolerance + 1e-12:
        problems.append(f"val_acc {abs(got.quality - epoch.val_acc):.5f} apart")
    if epoch.bits_per_byte is not None and abs(got.bits_per_byte - epoch.bits_per_byte) > tolerance + 1e-12:
        problems.append(f"bits per byte {abs(got.bits_per_byte - epoch.bits_per_byte):.4f} apart")
    if problems:
        detail += f" ({'; '.join(problems)}; at most {tolerance} bits per byte allowed)"
    status = "fail" if problems else "pass"
    return TrialCheck(trial, "reevaluate", status, detail, epoch.epoch, recorded, measured)


def retrain(
    worker: TrialWorker,
    run_dir: Path,
    trial: str,
    t: _Trial,
    trials: dict[str, _Trial],
    speed_factor: float,
    family: str = "image",
) -> TrialCheck:
    """Train ``trial`` again through the worker's code and compare its accuracy curve and epoch times."""
    from aiperf.cluster.messages import EpochReport
    from aiperf.training.trial import TrialSpec

    s = t.start
    arch = _recorded_arch(s, family)
    assert arch is not None and s.seed is not None  # only such trials are retrainable
    parent_arch = parent_weights = None
    if s.inherit:
        parent = trials[s.inherit]
        assert parent.weights is not None
        try:
            parent_weights = _stored_weights(
                _stored_path(run_dir, parent.weights), _architecture(parent.start, family), parent.weights.file
            )
        except _Unusable as exc:
            return TrialCheck(trial, "retrain", "fail", f"its parent {s.inherit}'s weights: {exc}")
        parent_arch = _recorded_arch(parent.start, family)
    recorded = [t.epochs[k] for k in sorted(t.epochs) if k[0] == 0]
    spec = TrialSpec(
        trial_id=trial,
        kind=s.kind,
        graph=arch,
        hparams=s.hparams.model_dump(exclude_unset=True),
        seed=s.seed,
        parent_graph=parent_arch,
        morphs=list(s.morphs) if parent_arch is not None else [],
        checkpoint_every_epoch=False,
        # the steps its epochs were trained with (a worker that sized them by its ceiling, lm auto), not this one's
        steps_per_epoch=recorded[0].steps if recorded else None,
    )
    measured: list[EpochReport] = []
    run = worker.run_trial(spec.to_dict(), parent_weights)
    try:
        for item in run:
            if isinstance(item, EpochReport):
                measured.append(item)
                if len(measured) == len(recorded):
                    break  # a trial the run stopped early: its recorded epochs are all there is to compare
    except Exception as exc:  # the recorded spec does not train here: it does not reproduce
        return TrialCheck(trial, "retrain", "fail", f"re-training it raised {type(exc).__name__}: {first_line(exc)}")
    finally:
        run.close()
    curve = [(r.val_acc, m.val_acc) for r, m in zip(recorded, measured, strict=False)]
    rec_s = sum((r.train_s or 0) + (r.eval_s or 0) for r in recorded) / len(recorded)  # both recorded: retrainable
    got_s = sum(m.train_s + m.eval_s for m in measured) / max(1, len(measured))
    data = {"val_acc": [a for a, _ in curve], "epoch_s": rec_s}
    got = {"val_acc": [b for _, b in curve], "epoch_s": got_s}
    text = ", ".join(f"{a:.4f}/{b:.4f}" for a, b in curve)
    detail = (
        f"{len(curve)} epoch(s), val_acc recorded/re-trained {text}; {rec_s:.2f} s per epoch recorded, "
        f"{got_s:.2f} s here"
    )
    if len(measured) < len(recorded):
        why = f"re-training gave {len(measured)} epochs, the ledger records {len(recorded)}; {detail}"
        return TrialCheck(trial, "retrain", "fail", why, None, data, got)
    for n, (a, b) in enumerate(curve, start=1):
        if abs(a - b) > RETRAIN_ACC_TOLERANCE:
            why = f"epoch {n}: recorded val_acc {a:.4f}, re-trained {b:.4f} (more than {RETRAIN_ACC_TOLERANCE} apart)"
            return TrialCheck(trial, "retrain", "fail", f"{why}; {detail}", n, data, got)
    if rec_s * speed_factor < got_s:
        why = (
            f"the ledger's epochs ({rec_s:.3f} s) are more than {speed_factor:g}x faster than this machine "
            f"trains them ({got_s:.2f} s; --speed-factor)"
        )
        return TrialCheck(trial, "retrain", "fail", f"{why}; {detail}", None, data, got)
    return TrialCheck(trial, "retrain", "pass", detail, None, data, got)


def _without_weights(trial: str, t: _Trial, state: str | None, best: bool) -> TrialCheck:
    """A sampled trial with no weights file: skipped, unless it is the best trial and should have one."""
    if best and state == "missing" and t.weights is not None:
        detail = f"the best trial's weights file {t.weights.file} is missing"
        return TrialCheck(trial, "reevaluate", "fail", detail)
    if best and t.status is TrialStatus.COMPLETED:
        return TrialCheck(
            trial, "reevaluate", "fail", "the best trial completed but the ledger records no weights file"
        )
    why = "evicted from weights/" if state == "missing" else f"it ended {t.status or 'unfinished'}, none were stored"
    return TrialCheck(trial, "reevaluate", "skipped", f"no weights to re-evaluate ({why})")


def _retrainable(trial: str, t: _Trial, trials: dict[str, _Trial], files: dict[str, str], family: str) -> bool:
    """Trained in one attempt from its start, with a recorded seed and (if it inherits) its parent's weights on disk."""
    s = t.start
    # A failed trial fails again; a lost one has no end.
    if (
        t.requeued
        or t.status not in (TrialStatus.COMPLETED, TrialStatus.STOPPED)
        or s.attempt
        or s.start_epoch
        or s.seed is None
        or _recorded_arch(s, family) is None
        or not t.epochs
    ):
        return False
    timed = all(e.train_s is not None and e.eval_s is not None for e in t.epochs.values())
    if not all(k[0] == 0 for k in t.epochs) or not timed:
        return False
    return s.inherit is None or (s.inherit in trials and files.get(s.inherit) == "ok")


# --- all of it ----------------------------------------------------------------------------------


def _reevaluate_targets(
    run_dir: Path,
    cfg: Config,
    dataset: Dataset | LanguageData,
    trials: dict[str, _Trial],
    files: dict[str, str],
    targets: list[str],
    best_trial: str | None,
    checks: list[TrialCheck],
    threads: int,
) -> list[str]:
    """Re-evaluate every target with weights on disk; returns the targets that had none."""
    from aiperf.families.language.data import LanguageData

    windows = dataset.windows() if isinstance(dataset, LanguageData) else None  # a shard folder opened once
    no_weights = []
    for trial in targets:
        t = trials[trial]
        if files.get(trial) == "ok":
            if windows is not None:
                checks.append(reevaluate_lm(run_dir, cfg, windows, threads, trial, t))
            else:
                assert not isinstance(dataset, LanguageData)
                checks.append(reevaluate(run_dir, cfg, dataset, threads, trial, t))
        else:
            no_weights.append(trial)
            checks.append(_without_weights(trial, t, files.get(trial), trial == best_trial))
    return no_weights


def _retrain_sample(
    run_dir: Path,
    cfg: Config,
    dataset: Dataset | LanguageData,
    trials: dict[str, _Trial],
    files: dict[str, str],
    how: tuple[int, int, int, float],
    checks: list[TrialCheck],
    notes: list[str],
) -> None:
    """Re-train a seeded sample of the trials that can be, each through a :class:`TrialWorker` of this process."""
    from aiperf.cluster.worker import TrialWorker

    count, seed, threads, speed_factor = how
    family = cfg.family  # the run header's (_load_data checked they agree)
    pool = sorted(t for t, v in trials.items() if _retrainable(t, v, trials, files, family))
    picks = random.Random(seed + 1).sample(pool, min(count, len(pool)))
    if len(picks) < count:
        notes.append(f"--retrain {count}: only {len(pool)} trial(s) can be re-trained from their recorded spec")
    workers: dict[str, TrialWorker] = {}
    for trial in sorted(picks):
        precision = next(iter(trials[trial].epochs.values())).precision  # the policy the run used
        if precision not in workers:
            workers[precision] = TrialWorker("audit", dataset, run_worker_settings(cfg, threads, precision))
        checks.append(retrain(workers[precision], run_dir, trial, trials[trial], trials, speed_factor, family))


def audit_run(
    run_dir: str | Path,
    sample: int = DEFAULT_SAMPLE,
    retrain_count: int = 0,
    seed: int = 0,
    speed_factor: float = DEFAULT_SPEED_FACTOR,
) -> AuditResult:
    """Audit a finished run; the result is also written to ``RUN_DIR/audit.json``.

    Raises :class:`~aiperf.errors.AiperfError` for input that cannot be audited (exit 2).
    """
    from aiperf.engine.resume import recorded_config
    from aiperf.ledger.runlock import live_holder

    limits.AUDIT_SAMPLE.check(sample)
    limits.AUDIT_RETRAIN.check(retrain_count)
    run_dir = Path(run_dir)
    holder = live_holder(run_dir)
    if holder is not None:
        raise AiperfError(f"{run_dir}: the run is still going ({holder.describe()}); audit it when it has finished")
    started = time.time()
    checks: list[TrialCheck] = []
    notes: list[str] = []
    data: dict[str, Any] = {
        "audited_at": round(started, 3),
        "options": {"sample": sample, "retrain": retrain_count, "seed": seed, "speed_factor": speed_factor},
    }
    verified, verify_message = verify_run(run_dir)
    data["verify"] = verify_message.splitlines()[0]
    # Until it verifies, the ledger is not known to hold records of their shape: its header's id
    # and its last hash are read from the JSON as it is.
    raw = read_raw_ledger(run_dir)
    data["run_id"] = raw[0].get("run_id")
    data["tolerances"] = _tolerances(raw[0].get("family"))
    count, last_hash = audited_end(raw)  # an earlier audit's record is not part of the run
    data["ledger"] = {"records": count, "last_hash": last_hash}
    data["bind"] = verified and _ended_completed(raw)
    if not verified:
        lines = [line.removeprefix("  also: ") for line in verify_message.splitlines()]
        lines[0] = lines[0].replace("verify failed: ", "the ledger does not verify: ", 1)
        return _finish(run_dir, data, lines, checks, notes)
    records = parse_records(raw, run_dir / LEDGER_NAME)
    header = of_type(records, RunStartRecord)[0]
    data["family"] = header.family
    trials = _trials(records)
    problems, files, unrecorded = check_weight_files(run_dir, trials)
    data["weight_files"] = {t: files[t] for t in sorted(files)}
    if unrecorded:
        listed = ", ".join(unrecorded[:5])
        notes.append(f"{len(unrecorded)} file(s) in weights/ have no ledger record and were not used: {listed}")
    if not any(t.weights for t in trials.values()):
        raise AiperfError(
            f"{run_dir}: the ledger records no weights files, so there is nothing to re-evaluate: a trial's weights"
            " are stored when it completes, and no trial of this run did (or the run predates weight hashes);"
            f" resume it (aiperf run --resume {run_dir}) or run again with a longer run.time_budget_s so trials"
            " complete: until one does, the run can be neither audited nor packaged"
        )
    completed = sorted(t for t, v in trials.items() if v.status is TrialStatus.COMPLETED)
    best = _best(records)
    best_trial = best.trial if best else None
    rng = random.Random(seed)
    others = [t for t in completed if t != best_trial]
    chosen = rng.sample(others, min(sample, len(others)))
    targets = ([best_trial] if best_trial else []) + sorted(chosen)
    if best is not None:
        data["best"] = {"trial": best_trial, "epoch": best.epoch, "val_acc": best.val_acc}
    if problems:  # a weights file that is not what the run wrote: nothing computed from it can be trusted
        return _finish(run_dir, data, problems, checks, notes)
    try:
        cfg = recorded_config(records)  # as --resume reads it
    except AiperfError as exc:
        raise AiperfError(f"{run_dir}: the run's recorded config is not usable here: {exc}") from None
    backend = cfg.model.backend
    threads = _threads(header)
    from aiperf.training.backend import check_backend_installed, configure_process

    check_backend_installed(backend)
    os.environ["KERAS_BACKEND"] = backend  # should a dataset loader import Keras, it binds the run's backend
    # As the run's master does: the dataset before any framework starts (a wrong dataset fails fast).
    dataset = _load_data(cfg, header)
    # The frameworks' native libraries write informational lines to stderr that no log level silences
    # (TensorFlow's even under JAX); the audit's findings go to stdout, its errors are raised.
    with _native_stderr_muted():
        configure_process(backend, threads)
        data["machine"] = machine_description(backend, threads)
        no_weights = _reevaluate_targets(run_dir, cfg, dataset, trials, files, targets, best_trial, checks, threads)
        if retrain_count > 0:
            _retrain_sample(
                run_dir, cfg, dataset, trials, files, (retrain_count, seed, threads, speed_factor), checks, notes
            )
    if best is not None and best_trial in trials:
        stored = trials[best_trial].weights
        if stored is None or stored.epoch != best.epoch or stored.attempt != best.attempt:
            notes.append(
                f"the best val_acc ({best.val_acc:.4f}, trial {best_trial} epoch {best.epoch}) is not an epoch "
                "whose weights were stored: only --retrain re-checks it"
            )
    if no_weights:
        notes.append(f"sampled trial(s) with no weights to re-evaluate: {', '.join(no_weights)}")
    failed = [f"trial {c.trial}: {c.check}: {c.detail}" for c in checks if c.status == "fail"]
    return _finish(run_dir, data, failed, checks, notes)


def _lm_steps(recorded: int | None, configured: int | str) -> int:
    """The steps per epoch a language trial trained with: its epoch's record (a worker may have sized them
    by its ceiling, lm.steps_per_epoch auto), else the config's number."""
    if recorded is not None:
        return recorded
    return configured if isinstance(configured, int) else 1  # auto without a record: evaluation needs none


def _tolerances(family: object) -> dict[str, float]:
    """The tolerances the checks of a run of ``family`` (its header's, unverified) apply."""
    if family == "language":
        reevaluate = {"reevaluate_bits_per_byte": REEVAL_TOLERANCE_BITS_PER_BYTE}
    else:
        reevaluate = {"reevaluate_images": REEVAL_TOLERANCE_IMAGES}
    return {**reevaluate, "retrain_val_acc": RETRAIN_ACC_TOLERANCE}


def _ended_completed(raw: Sequence[Mapping[str, object]]) -> bool:
    """Whether the run's last record (audits aside) is a completed run_stop: only then may an audit follow it."""
    ran = [r for r in raw if r.get("type") != RecordType.AUDIT]
    return bool(ran) and ran[-1].get("type") == RecordType.RUN_STOP and ran[-1].get("status") == RunStatus.COMPLETED


def _refresh_summary(run_dir: Path) -> None:
    """The audit record changed the ledger's end: a summary.json beside it is rewritten to match (if any)."""
    from aiperf.results.summary import SUMMARY_NAME, write_summary

    if (run_dir / SUMMARY_NAME).is_file():
        write_summary(run_dir)


def _finish(
    run_dir: Path,
    data: dict[str, Any],
    problems: list[str],
    checks: list[TrialCheck],
    notes: list[str],
) -> AuditResult:
    """Compose the message and write ``audit.json`` (atomically)."""
    reevaluated = [c.trial for c in checks if c.check == "reevaluate" and c.status != "skipped"]
    retrained = [c.trial for c in checks if c.check == "retrain"]
    ok = not problems
    if ok:
        hashed = sum(1 for v in data.get("weight_files", {}).values() if v == "ok")
        lines = [
            f"audited: run {inert(data.get('run_id'))}: {len(reevaluated)} trial(s) re-evaluated"
            f" ({inert(', '.join(reevaluated)) or 'none'}), {len(retrained)} re-trained"
            f" ({inert(', '.join(retrained)) or 'none'});"
            f" {hashed} weights file(s) match their ledger hashes; ledger verified"
        ]
    else:
        lines = [f"audit failed: {inert(problems[0])}"]
        lines += [f"  also: {inert(p)}" for p in problems[1:MAX_LISTED]]
        if len(problems) > MAX_LISTED:
            lines.append(f"  ... and {len(problems) - MAX_LISTED} more problems")
    lines += [
        f"  {c.status}: trial {inert(c.trial)} {c.check}: {inert(c.detail)}" for c in checks if c.status != "fail" or ok
    ]
    lines += [f"  note: {inert(n)}" for n in notes]
    message = "\n".join(lines)
    data.update(
        ok=ok,
        message=lines[0],
        problems=problems,
        notes=notes,
        trials=[{k: v for k, v in asdict(c).items() if v is not None} for c in checks],
        duration_s=round(time.time() - data["audited_at"], 3),
    )
    path = run_dir / AUDIT_NAME
    bind = bool(data.pop("bind", False))
    try:
        payload = (json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
        if bind:  # the ledger names the file: the report shows it as passed only while it is this one
            write_bound_audit(run_dir, payload, str(data["ledger"]["last_hash"]), ok)
            _refresh_summary(run_dir)
        else:  # a ledger that does not verify or has not ended is not appended to: the file vouches for nothing
            write_atomic(path, payload)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AiperfError(f"{message}\n{path}: cannot write the audit result ({reason})", exit_code=1) from None
    return AuditResult(ok, message, data)
