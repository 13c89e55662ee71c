"""The ``aiperf`` command line.

Every user mistake ends as one line on stderr and exit code 2; a run that could not train
(no worker started, every trial failed the same way, too many undecodable images) exits 1
after writing its summary, with the reason as one line on stderr; an interrupted run exits
130 after writing its summary; an unexpected internal error prints one line too (set
``AIPERF_DEBUG=1`` for the traceback). Results already written are never touched by an
error path.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiperf.errors import AiperfError
from nas.errors import NasError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (and exit 2) instead of a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise AiperfError(f"{self.prog}: {message} (see {self.prog} --help)")


class _VerboseSubParser(_Parser):
    """A sub-command parser that also takes ``-v`` after the command (``aiperf run -v``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="as aiperf -v")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        default=None,
        help="config file or built-in name (default, smoke, imagenet, fashion_mnist, synthetic)",
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
    """Module loggers of ``aiperf`` and ``nas`` to stderr at the level ``-v`` asks for (quiet by default)."""
    if verbosity <= 0:
        return
    level = logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("aiperf", "nas"):
        log = logging.getLogger(name)
        log.setLevel(level)
        log.addHandler(handler)


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

    plan = sub.add_parser("plan", help="print how the run would be sized on the current cluster, run nothing")
    _config_args(plan)

    flops = sub.add_parser("flops", help="per-layer FLOPs of an architecture JSON or a saved Keras model")
    flops.add_argument("file")
    flops.add_argument("--json", action="store_true", help="machine-readable output")
    flops.add_argument("--batch-size", type=int, default=128, help="batch size for the amortised optimizer update")

    summary = sub.add_parser("summary", help="recompute and print a run's summary from its ledger")
    summary.add_argument("run_dir")

    verify = sub.add_parser("verify", help="check a run: hash chain, FLOPs, score and validity rules")
    verify.add_argument("run_dir")

    report = sub.add_parser("report", help="write a self-contained HTML report for a run")
    report.add_argument("run_dir")
    report.add_argument("--output", "-o", default=None, help="where to write (default RUN_DIR/report.html)")

    make = sub.add_parser(
        "make-imagenet",
        help="write an ImageNet-layout folder of random JPEGs (train/<class>/, val/<class>/) for tests and benchmarks",
    )
    make.add_argument("output", help="folder to create (must not exist, or be empty)")
    make.add_argument("--classes", type=int, default=10)
    make.add_argument("--train-per-class", type=int, default=50)
    make.add_argument("--val-per-class", type=int, default=10)
    make.add_argument("--min-side", type=int, default=None, help="smallest image side (64, or --max-side if less)")
    make.add_argument("--max-side", type=int, default=1024, help="largest image side in pixels")
    make.add_argument("--mean-kb", type=float, default=110.0, help="mean JPEG size at ImageNet's image sizes")
    make.add_argument("--no-quirks", action="store_true", help="leave out CMYK, grayscale, PNG-as-JPEG, tiny, large")
    make.add_argument("--bad", type=int, default=0, help="also write this many undecodable files")
    make.add_argument("--to-tfrecord", action="store_true", help="also write TFRecord shards to OUTPUT/tfrecord")
    make.add_argument("--train-shards", type=int, default=4)
    make.add_argument("--val-shards", type=int, default=2)
    make.add_argument("--seed", type=int, default=0)

    scaling = sub.add_parser("scaling", help="weak-scaling study over node counts")
    scaling.add_argument("--nodes", required=True, help="comma-separated node counts, e.g. 1,2,4,8")
    scaling.add_argument("--simulate", action="store_true", help="simulate nodes instead of running on them")
    _config_args(scaling)
    scaling.add_argument("--output", "-o", default=None, help="output directory")
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from aiperf.config import load_config
    from aiperf.engine.run import run_benchmark

    if args.resume:
        if args.config or args.overrides:
            raise AiperfError("--resume continues a run with its own recorded config; drop --config/--set")
        if not Path(args.resume).is_dir():
            raise AiperfError(f"--resume {args.resume}: no such run directory")
        _, summary = run_benchmark(None, address=args.address, resume_dir=args.resume)
    else:
        cfg = load_config(args.config, args.overrides)
        _, summary = run_benchmark(cfg, address=args.address)
    if summary.get("status") == "failed":
        print(f"aiperf: error: the run failed: {summary.get('stop_reason')}", file=sys.stderr)
        return 1
    return 130 if summary.get("status") == "interrupted" else 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from aiperf.cluster.plan import format_plan, make_plan
    from aiperf.cluster.ray_session import start_ray
    from aiperf.cluster.resources import cluster_nodes
    from aiperf.config import load_config

    cfg = load_config(args.config, args.overrides)
    session = start_ray(args.address or cfg.cluster.address)
    try:
        plan = make_plan(cluster_nodes(probe=True), cfg)
    finally:
        session.shutdown()
    print(format_plan(plan))
    return 0


def _cmd_flops(args: argparse.Namespace) -> int:
    from aiperf.metrics.flops_cli import flops_command

    if args.batch_size < 1:
        raise AiperfError("--batch-size must be at least 1")
    print(flops_command(args.file, as_json=args.json, batch_size=args.batch_size))
    return 0


def _run_dir(path: str) -> Path:
    run_dir = Path(path)
    if not (run_dir / "ledger.jsonl").is_file():
        raise AiperfError(f"{path}: not a run directory (no ledger.jsonl)")
    return run_dir


def _cmd_summary(args: argparse.Namespace) -> int:
    from aiperf.record.summary import format_summary, write_summary

    run_dir = _run_dir(args.run_dir)
    print(format_summary(write_summary(run_dir), run_dir))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from aiperf.record.verify import verify_run

    ok, message = verify_run(_run_dir(args.run_dir))
    print(message)
    return 0 if ok else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from aiperf.record.report import write_report

    print(write_report(_run_dir(args.run_dir), args.output))
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

    try:
        counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        raise AiperfError(f"--nodes {args.nodes!r}: expected comma-separated integers such as 1,2,4") from None
    if not counts or min(counts) < 1:
        raise AiperfError("--nodes: give at least one positive node count")
    print(
        scaling_command(
            counts,
            simulate=args.simulate,
            config=args.config,
            overrides=args.overrides,
            address=args.address,
            output=args.output,
        )
    )
    return 0


COMMANDS = {
    "run": _cmd_run,
    "plan": _cmd_plan,
    "flops": _cmd_flops,
    "summary": _cmd_summary,
    "verify": _cmd_verify,
    "report": _cmd_report,
    "make-imagenet": _cmd_make_imagenet,
    "scaling": _cmd_scaling,
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        _configure_logging(args.verbose)
        return COMMANDS[args.command](args)
    except AiperfError as exc:
        print(f"aiperf: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except NasError as exc:
        print(f"aiperf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiperf: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    except Exception as exc:
        if os.environ.get("AIPERF_DEBUG"):
            raise
        print(
            f"aiperf: unexpected error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            "(set AIPERF_DEBUG=1 for details)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
