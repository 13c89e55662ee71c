"""The ``aiperf`` command line.

Every user mistake ends as one line on stderr and exit code 2; a run that could not train
(no worker started, every trial failed the same way, too many undecodable images) exits 1
after writing its summary, with the reason as one line on stderr; an interrupted run exits
130 after writing its summary; an unexpected internal error prints one line too (set
``AIPERF_DEBUG=1`` for the traceback). Results already written are never touched by an
error path.

Exit codes: 0 success (``verify``: verified); 1 the run or command failed at run time --
a disk filled up, a file could not be written -- with everything recorded before kept
(``verify``: a check failed); 2 bad or unreadable input, a refused request (a run directory
in use by another master) or a bad flag; 130 interrupted. Output that cannot be written (a
closed pipe, ``aiperf run ... | head -1``) is dropped and changes no exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiperf import cli_limits as limits
from aiperf.builtin_configs import BUILTIN_CONFIGS
from aiperf.errors import AiperfError, excerpt, first_line
from nas.errors import NasError

if TYPE_CHECKING:
    from nas.graph import Graph
    from nas.language.spec import TransformerSpec


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (and exit 2) instead of a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise AiperfError(f"{self.prog}: {message} (see {self.prog} --help)")


class _VerboseSubParser(_Parser):
    """A sub-command parser that also takes ``-v`` after the command (``aiperf run -v``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # ArgumentParser's own, forwarded as they are
        super().__init__(*args, **kwargs)
        self.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="as aiperf -v")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        default=None,
        help=f"config file or built-in name ({', '.join(BUILTIN_CONFIGS)})",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set run.time_budget_s=600 (repeatable)",
    )
    p.add_argument("--address", default=None, help="Ray cluster to join (default: RAY_ADDRESS, else start locally)")


def _version() -> str:
    from aiperf import __version__

    return __version__


def _configure_logging(verbosity: int) -> None:
    """Warnings of ``aiperf`` and ``nas`` on stderr always; what the engine does with ``-v`` (info), ``-vv`` (debug)."""
    from aiperf.logs import configure

    configure(verbosity)


RANK_CHOICES = ("ops", "regulated", "efficiency", "ops_per_watt")  # aiperf.submission.ranking.RANK_KEYS


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="aiperf",
        description="AutoML benchmark for AI supercomputers: counted OPS of a "
        "network-morphism architecture search on Ray.",
    )
    parser.add_argument("--version", action="version", version=f"aiperf {_version()}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log what the engine does on stderr (-v: info, -vv: debug, including errors it tolerated)",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_VerboseSubParser)

    run = sub.add_parser("run", help="run the benchmark (default config: MNIST digits, ~5 minutes)")
    _config_args(run)
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run whose master stopped, from its ledger")
    run.add_argument(
        "--repeat",
        type=limits.REPEAT,
        metavar="N",
        help="N runs with seeds run.seed, run.seed+1, ...; prints the median, CV, min and max of their scores",
    )
    run.add_argument(
        "--must-end-by",
        type=limits.MUST_END_BY,
        metavar="UNIX_TIME",
        help="refuse to start unless the run (its budget, and its stop) ends by then: a batch job's end",
    )
    run.add_argument(
        "--planned-nodes",
        type=limits.PLANNED_NODES,
        metavar="N",
        help="the nodes the batch job was given (cluster.planned_nodes): the run records how many trained against"
        " it, and one that trained on fewer is not official; a resumed run keeps the plan it started with",
    )

    plan = sub.add_parser("plan", help="print how the run would be sized on the current cluster, run nothing")
    _config_args(plan)

    system = sub.add_parser(
        "system", help="measure the nodes a run would use and write the system description (docs/system.md)"
    )
    _config_args(system)
    system.add_argument("--site", default=None, metavar="FILE", help="the submitter's site file (YAML)")
    system.add_argument("--output", "-o", default=None, help="write the description here (default: print it)")

    flops = sub.add_parser("flops", help="per-layer FLOPs of an architecture JSON or a saved Keras model")
    flops.add_argument("file")
    flops.add_argument("--json", action="store_true", help="machine-readable output")
    flops.add_argument(
        "--batch-size", type=limits.BATCH_SIZE, default=128, help="batch size for the amortised optimizer update"
    )

    summary = sub.add_parser("summary", help="recompute and print a run's summary from its ledger")
    summary.add_argument("run_dir")

    verify = sub.add_parser("verify", help="check a run: hash chain, FLOPs, score and validity rules")
    verify.add_argument("run_dir")

    audit = sub.add_parser(
        "audit", help="check a run by re-execution: weight hashes, re-evaluated and (--retrain) re-trained trials"
    )
    audit.add_argument("run_dir")
    audit.add_argument(
        "--sample", type=limits.AUDIT_SAMPLE, default=4, help="completed trials to re-evaluate besides the best (4)"
    )
    audit.add_argument(
        "--retrain", type=limits.AUDIT_RETRAIN, default=0, metavar="K", help="also re-train K sampled trials (0)"
    )
    audit.add_argument("--seed", type=limits.AUDIT_SEED, default=0, help="seed of the samples (0)")
    audit.add_argument(
        "--speed-factor",
        type=limits.SPEED_FACTOR,
        default=4.0,
        help="--retrain fails when recorded epochs are more than this many times faster than this machine's (4)",
    )

    report = sub.add_parser("report", help="write a self-contained HTML report for a run")
    report.add_argument("run_dir")
    report.add_argument("--output", "-o", default=None, help="where to write (default RUN_DIR/report.html)")

    package = sub.add_parser(
        "package", help="write a submission package of verified, audited runs and their system (docs/submission.md)"
    )
    package.add_argument("runs", nargs="+", metavar="RUN", help="run directories (verified and audited)")
    package.add_argument("--system", required=True, metavar="FILE", help="the system description (aiperf system -o)")
    package.add_argument("--output", "-o", required=True, metavar="DIR", help="the package folder to create")

    check = sub.add_parser("check", help="check a submission package (exit 0 accepted, 1 findings, 2 unreadable)")
    check.add_argument("package_dir", metavar="DIR")
    check.add_argument(
        "--retrain", type=limits.AUDIT_RETRAIN, default=0, metavar="K", help="also re-train K trials per run (0)"
    )
    check.add_argument(
        "--sample",
        type=limits.AUDIT_SAMPLE,
        default=None,
        help="trials to re-evaluate besides the best (default: as the stored audit)",
    )

    listing = sub.add_parser("list", help="rank submission packages: a table, and --csv/--md/--html files")
    listing.add_argument("dirs", nargs="+", metavar="DIR", help="a package, or a folder of packages")
    listing.add_argument("--by", choices=RANK_CHOICES, default="ops", help="rank by this figure (ops)")
    listing.add_argument("--csv", default=None, metavar="FILE", help="also write the list as CSV")
    listing.add_argument("--md", default=None, metavar="FILE", help="also write the list as a Markdown table")
    listing.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML page")

    make = sub.add_parser(
        "make-imagenet",
        help="write an ImageNet-layout folder of random JPEGs (train/<class>/, val/<class>/) for tests and benchmarks",
    )
    make.add_argument("output", help="folder to create (must not exist, or be empty)")
    make.add_argument("--classes", type=limits.CLASSES, default=10)
    make.add_argument("--train-per-class", type=limits.TRAIN_PER_CLASS, default=50)
    make.add_argument("--val-per-class", type=limits.VAL_PER_CLASS, default=10)
    make.add_argument(
        "--min-side", type=limits.MIN_SIDE, default=None, help="smallest image side (64, or --max-side if less)"
    )
    make.add_argument("--max-side", type=limits.MAX_SIDE, default=1024, help="largest image side in pixels")
    make.add_argument("--mean-kb", type=limits.MEAN_KB, default=110.0, help="mean JPEG size at ImageNet's image sizes")
    make.add_argument("--no-quirks", action="store_true", help="leave out CMYK, grayscale, PNG-as-JPEG, tiny, large")
    make.add_argument("--bad", type=limits.BAD, default=0, help="also write this many undecodable files")
    make.add_argument("--to-tfrecord", action="store_true", help="also write TFRecord shards to OUTPUT/tfrecord")
    make.add_argument("--train-shards", type=limits.TRAIN_SHARDS, default=4)
    make.add_argument("--val-shards", type=limits.VAL_SHARDS, default=2)
    make.add_argument("--seed", type=limits.MAKE_SEED, default=0)

    scaling = sub.add_parser("scaling", help="weak-scaling study over node counts")
    scaling.add_argument(
        "--nodes", required=True, type=limits.node_counts, help="comma-separated node counts, e.g. 1,2,4,8"
    )
    scaling.add_argument("--simulate", action="store_true", help="simulate nodes instead of running on them")
    _config_args(scaling)
    scaling.add_argument("--output", "-o", default=None, help="output directory")
    limits.document(parser)  # every number's range in --help
    return parser


def _stdout() -> Any:  # an engine.output.Output, which run_repeated takes as its stream
    """Standard output that a closed pipe switches off instead of failing the command."""
    from aiperf.engine.output import output

    return output(sys.stdout)


def _cmd_run(args: argparse.Namespace) -> int:
    from aiperf.cluster.workload_choice import chosen_config
    from aiperf.engine.run import run_benchmark

    if args.must_end_by is not None:
        from aiperf.engine.deadline import check_must_end_by

        check_must_end_by(args, args.must_end_by)
    if args.planned_nodes is not None and not args.resume:  # last: the launcher's count, whatever the --set say
        args.overrides = [*(args.overrides or []), f"cluster.planned_nodes={args.planned_nodes}"]
    if args.repeat is not None:
        from aiperf.engine.repeat import run_repeated

        if args.resume:
            raise AiperfError("--repeat starts new runs; it cannot be combined with --resume")
        return run_repeated(chosen_config(args.config, args.overrides)[0], args.repeat, args.address, _stdout())
    if args.resume:
        if args.config or args.overrides:
            raise AiperfError("--resume continues a run with its own recorded config; drop --config/--set")
        try:
            is_dir = Path(args.resume).is_dir()
        except OSError as exc:  # a name too long
            raise AiperfError(f"--resume {_shown(args.resume)}: cannot read ({exc.strerror})") from None
        if not is_dir:
            raise AiperfError(f"--resume {_shown(args.resume)}: no such run directory")
        _, summary = run_benchmark(None, address=args.address, resume_dir=args.resume)
    else:
        cfg, choice = chosen_config(args.config, args.overrides)
        _, summary = run_benchmark(cfg, address=args.address, choice=choice)
    if summary.get("status") == "failed":
        _error(f"aiperf: error: the run failed: {summary.get('stop_reason')}")
        return 1
    return 130 if summary.get("status") == "interrupted" else 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from aiperf.cluster.plan import format_plan, make_plan
    from aiperf.cluster.ray_session import start_ray
    from aiperf.cluster.resources import cluster_nodes
    from aiperf.cluster.workload_choice import chosen_config

    cfg, choice = chosen_config(args.config, args.overrides)
    session = start_ray(args.address or cfg.cluster.address)
    try:
        plan = make_plan(cluster_nodes(probe=True), cfg, choice)
    finally:
        session.shutdown()
    print(format_plan(plan), file=_stdout())
    return 0


def _cmd_system(args: argparse.Namespace) -> int:
    from aiperf.config import load_config
    from aiperf.engine.system_command import system_command

    cfg = load_config(args.config, args.overrides)
    print(system_command(cfg, args.address, args.site, args.output), file=_stdout())
    return 0


def _cmd_flops(args: argparse.Namespace) -> int:
    from aiperf.families.image.flops_report import flops_report, transformer_flops_report

    spec = _load_transformer(args.file)
    if spec is not None:
        text = transformer_flops_report(spec, Path(args.file).stem, as_json=args.json, batch_size=args.batch_size)
        print(text, file=_stdout())
        return 0
    graph = _load_graph(args.file)
    name = graph.name or Path(args.file).stem
    print(flops_report(graph, name, as_json=args.json, batch_size=args.batch_size), file=_stdout())
    return 0


def _load_transformer(path: str) -> TransformerSpec | None:
    """A language model's description (format ``aiperf-transformer``) at ``path``; None for any other file."""
    import json

    from aiperf.families.language.seed import read_spec_file
    from nas.errors import NasError
    from nas.language.spec import FORMAT, TransformerSpec

    if Path(path).suffix.lower() != ".json":
        return None
    try:
        doc = json.loads(read_spec_file(Path(path), what=_shown(path)))
    except (AiperfError, ValueError, RecursionError):
        return None  # not one (or unreadable): the architecture loader says what is wrong with it
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    try:
        return TransformerSpec.from_dict(doc)
    except NasError as exc:
        raise AiperfError(f"{_shown(path)}: {exc}") from None


def _load_graph(path: str) -> Graph:
    """An architecture JSON (``nas.serialize``) or a saved Keras model (``.keras``, ``.h5``), as a graph."""
    from aiperf.families.image.keras_import import KERAS_FILE_SUFFIXES, graph_from_keras_file

    if Path(path).suffix.lower() in KERAS_FILE_SUFFIXES:
        return graph_from_keras_file(path)
    from nas.serialize import load

    return load(path)


def _shown(path: object) -> str:
    """A path for a one-line message: as given when printable and not absurdly long, else an excerpt."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    return text if text.isprintable() and len(text) <= 1024 else excerpt(text, 200)


def _run_dir(path: str) -> Path:
    run_dir = Path(path)
    try:
        is_run = (run_dir / "ledger.jsonl").is_file()
    except OSError as exc:  # a name too long
        raise AiperfError(f"{_shown(path)}: cannot read ({exc.strerror})") from None
    if not is_run:
        raise AiperfError(f"{_shown(path)}: not a run directory (no ledger.jsonl)")
    return run_dir


def _note(message: str) -> None:
    from aiperf.ledger.inert import inert

    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(f"aiperf: note: {inert(message)}", file=sys.stderr, flush=True)


def _cmd_summary(args: argparse.Namespace) -> int:
    """Recompute and print; write summary.json unless a live master owns the directory."""
    from aiperf.ledger.runlock import live_holder
    from aiperf.ledger.store import LEDGER_NAME, LedgerStream, iter_ledger
    from aiperf.results.summary import RunDigest, build_summary, format_summary, save_summary

    run_dir = _run_dir(args.run_dir)
    stream = LedgerStream(run_dir)  # read once, a record at a time: the summary, and whether the tail is torn
    digest = RunDigest(run_dir / LEDGER_NAME, reread=lambda: iter_ledger(run_dir))
    for record in iter_ledger(run_dir, stream):
        digest.add(record)
    summary = build_summary(run_dir, digest=digest)
    torn = stream.torn_note(run_dir / LEDGER_NAME)
    if torn:
        _note(torn)
    holder = live_holder(run_dir)
    unsaved: AiperfError | None = None
    if holder is not None:
        _note(f"the run is still going ({holder.describe()}); summary.json is left to its master")
    else:
        try:
            save_summary(run_dir, summary)
        except AiperfError as exc:
            unsaved = exc
    print(format_summary(summary, run_dir), file=_stdout())
    if unsaved is not None:
        raise unsaved
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 verified, 1 a check failed, 2 the run could not be read (raised as AiperfError)."""
    from aiperf.results.verify import verify_run

    ok, message = verify_run(_run_dir(args.run_dir))
    print(message, file=_stdout())
    return 0 if ok else 1


def _cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0 audited, 1 a trial (or the ledger) did not reproduce, 2 the run or its dataset could not be read."""
    from aiperf.engine.audit import audit_run

    result = audit_run(_run_dir(args.run_dir), args.sample, args.retrain, args.seed, args.speed_factor)
    print(result.message, file=_stdout())
    return 0 if result.ok else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from aiperf.ledger.inert import inert
    from aiperf.results.report import write_report

    print(inert(write_report(_run_dir(args.run_dir), args.output)), file=_stdout())  # the path names a folder
    return 0


def _cmd_package(args: argparse.Namespace) -> int:
    from aiperf.submission.package import package_command

    print(package_command(args.runs, args.system, args.output), file=_stdout())
    return 0


class _Terminated(Exception):
    """SIGTERM while a command holds children and temporary files: it unwinds as from Ctrl-C (exit 143)."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises :class:`_Terminated` here, so the audits a check started are killed and its copy removed."""

    def stop(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 accepted, 1 findings (one line each, all of them), 2 not a readable package."""
    from aiperf.submission.check import check_package

    with _sigterm_unwinds():
        result = check_package(Path(args.package_dir), retrain=args.retrain, sample=args.sample)
    print(result.format(Path(args.package_dir)), file=_stdout())
    return 0 if result.accepted else 1


def _cmd_list(args: argparse.Namespace) -> int:
    from aiperf.submission.listing import make_list

    with _sigterm_unwinds():
        table = make_list(args.dirs, args.by, csv_path=args.csv, md_path=args.md, html_path=args.html)
    print(table, file=_stdout())
    return 0


def _cmd_make_imagenet(args: argparse.Namespace) -> int:
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    spec = GenerateSpec(
        classes=args.classes,
        train_per_class=args.train_per_class,
        val_per_class=args.val_per_class,
        min_side=args.min_side if args.min_side is not None else min(64, args.max_side),
        max_side=args.max_side,
        mean_kb=args.mean_kb,
        quirks=not args.no_quirks,
        bad=args.bad,
        seed=args.seed,
        to_tfrecord=args.to_tfrecord,
        train_shards=args.train_shards,
        val_shards=args.val_shards,
    )
    try:
        manifest = generate_imagenet(args.output, spec)
    except OSError as exc:
        raise AiperfError(f"make-imagenet: {args.output}: {exc.strerror or exc}") from None
    print(
        f"aiperf: wrote {manifest['train_images']:,} training and {manifest['val_images']:,} validation images "
        f"({len(manifest['classes'])} classes, mean {manifest['mean_bytes'] / 1024:.1f} KB, "
        f"{len(manifest['quirks'])} quirks, {len(manifest['bad'])} undecodable) to {args.output}"
        + (f"; TFRecord shards in {manifest['tfrecord']['path']}" if "tfrecord" in manifest else "")
    )
    return 0


def _cmd_scaling(args: argparse.Namespace) -> int:
    from aiperf.engine.scaling import scaling_command

    text = scaling_command(
        args.nodes,
        simulate=args.simulate,
        config=args.config,
        overrides=args.overrides,
        address=args.address,
        output=args.output,
    )
    print(text, file=_stdout())
    return 0


COMMANDS = {
    "run": _cmd_run,
    "plan": _cmd_plan,
    "system": _cmd_system,
    "flops": _cmd_flops,
    "summary": _cmd_summary,
    "verify": _cmd_verify,
    "report": _cmd_report,
    "list": _cmd_list,
    "package": _cmd_package,
    "check": _cmd_check,
    "audit": _cmd_audit,
    "make-imagenet": _cmd_make_imagenet,
    "scaling": _cmd_scaling,
}


def _standard_streams() -> None:
    """Give closed standard descriptors a /dev/null, before anything opens a file.

    Started as ``aiperf run >&- 2>&-`` (or by a daemon without them), the first files the
    run opens -- the run lock, the ledger -- would get descriptors 1 and 2, and any library
    writing to "stderr" would write into the ledger.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's standard output
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the process's standard error


MAX_MESSAGE_CHARS = 1000


def _error(message: str) -> None:
    """One line on stderr, however much of the user's input a message quotes; a closed stderr
    loses the line, never changes the exit code."""
    from aiperf.ledger.inert import inert

    line = inert(message)  # a quoted name's escape sequence, carriage return or bidi control shows as an escape
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 3] + "..."
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(line, file=sys.stderr, flush=True)


def _memory_context(args: argparse.Namespace | None) -> str:
    """``while `aiperf verify` read results/run`` -- the command and the inputs it was given -- or nothing."""
    if args is None or not getattr(args, "command", None):
        return ""
    given = [
        f"{name} {_shown(value)}"
        for name, value in sorted(vars(args).items())
        if name not in ("command", "verbose")
        and isinstance(value, (str, Path, int, float))
        and not isinstance(value, bool)
    ]
    return f" while `aiperf {args.command}` worked on {', '.join(given[:6]) or 'its defaults'}"


def main(argv: Sequence[str] | None = None) -> int:
    _standard_streams()
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        _configure_logging(args.verbose)
        return COMMANDS[args.command](args)
    except AiperfError as exc:
        _error(f"aiperf: error: {exc}")
        return exc.exit_code
    except NasError as exc:
        _error(f"aiperf: error: {exc}")
        return 2
    except KeyboardInterrupt:
        _error("aiperf: interrupted")
        return 130
    except _Terminated:
        _error("aiperf: terminated (SIGTERM); the children it started are stopped, its temporary files removed")
        return 143
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    except MemoryError:
        _error(f"aiperf: error: out of memory{_memory_context(args)} (docs/limits.md lists each input's limit)")
        return 1
    except OSError as exc:
        # A file operation no code path anticipated: still one line naming the file.
        if os.environ.get("AIPERF_DEBUG"):
            raise
        where = f"{_shown(exc.filename)}: " if exc.filename else ""
        name = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        _error(f"aiperf: error: {where}{exc.strerror or first_line(exc)}{f' ({name})' if name else ''}")
        return 1
    except Exception as exc:
        if os.environ.get("AIPERF_DEBUG"):
            raise
        _error(f"aiperf: unexpected error: {type(exc).__name__}: {first_line(exc)} (set AIPERF_DEBUG=1 for details)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
