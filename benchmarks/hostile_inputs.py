"""What the defences against hostile input cost, and how fast hostile input is refused.

1. Refusals: how long ``load_config`` takes to refuse a 600-byte "billion laughs" document
   (which expanded to gigabytes before it was refused), a 30,000-deep flow sequence just under
   the size cap, the same alias bomb given with ``--set``, and (for scale) the time to load the
   largest config accepted (64 KiB).
2. Hostile input through the CLI (issue 23): each command run in a process of its own, its
   exit status, wall time and peak resident memory (``os.wait4``): a ledger with a 1 GiB
   sparse tail, a telemetry file with a 1 GiB line, ``scaling --nodes 10^20``,
   ``make-imagenet --max-side 9000``, a ``.keras`` whose ``config.json`` unpacks to 256 MiB,
   and a run id carrying terminal escapes and a fake "verified" line.
3. Reading a ledger: a simulated run (the real master and search on a simulated pool, as
   ``aiperf scaling --simulate`` runs them) is read back as ``aiperf summary`` reads it, and
   the time per record is split into parsing (``json.loads``), the nesting-depth check, the
   record-shape check (``aiperf.ledger.schema.parse_records``: each record validated into its
   typed model) and the summary itself, so the share of the checks in a summary of a large run
   is visible.

Run from the repository root::

    PYTHONPATH=. python benchmarks/hostile_inputs.py --nodes 64 --budget 600 --json hostile.json
    PYTHONPATH=. python benchmarks/hostile_inputs.py --nodes 1 --budget 30     # a quick check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

from common import machine_facts, median, write_json

LAUGHS = "\n".join(
    ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]" for p, k in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["run: {name: *i}"]
)


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def refusals(repeats: int) -> dict[str, float]:
    from aiperf.config import MAX_CONFIG_BYTES, load_config
    from aiperf.errors import AiperfError

    folder = Path(tempfile.mkdtemp(prefix="aiperf-hostile-"))
    files = {
        "billion_laughs_600B": LAUGHS,
        "deep_30k_60KB": "run: {name: " + "[" * 30_000 + "]" * 30_000 + "}\n",
        "largest_accepted_64KiB": "run:\n  name: big\n" + "#" * (MAX_CONFIG_BYTES - 40) + "\n",
    }
    out = {}
    for name, text in files.items():
        path = folder / f"{name}.yaml"
        path.write_text(text)

        def attempt(path: Path = path) -> None:
            with contextlib.suppress(AiperfError):
                load_config(path)

        out[f"{name}_s"] = _timed(attempt, repeats)

    def set_bomb() -> None:
        with contextlib.suppress(AiperfError):
            load_config("smoke", ["run.name=&a [x, *a, *a, *a, *a, *a, *a, *a, *a]"])

    out["set_alias_s"] = _timed(set_bomb, repeats)
    return out


def ledger_read(nodes: int, budget_s: float, repeats: int) -> dict[str, float]:
    from aiperf.config import load_config
    from aiperf.engine.scaling import SimulationSettings, simulate_run
    from aiperf.ledger.schema import parse_records
    from aiperf.ledger.store import _reject_constant, _too_deep, read_ledger, read_ledger_contents
    from aiperf.results.summary import build_summary
    from nas import zoo

    run_dir = Path(tempfile.mkdtemp(prefix="aiperf-ledger-")) / "run"
    cfg = load_config("smoke", [f"run.time_budget_s={budget_s}"])
    dataset = {
        "name": "digits-sim", "num_classes": 10, "input_shape": [8, 8, 1], "train_images": 1438,
        "eval_images": 359, "split": {"method": "stratified", "seed": 0, "disjoint": True}, "fingerprint": "0" * 64,
    }  # fmt: skip
    simulate_run(cfg, nodes, run_dir, zoo.small_resnet((8, 8, 1), 10, width=8), dataset, SimulationSettings())
    lines = [ln for ln in (run_dir / "ledger.jsonl").read_bytes().split(b"\n") if ln]
    raw = read_ledger_contents(run_dir).records
    records = parse_records(raw)
    n = len(records)
    parse = _timed(lambda: [json.loads(ln, parse_constant=_reject_constant) for ln in lines], repeats)
    depth = _timed(lambda: [_too_deep(ln) for ln in lines], repeats)
    shapes = _timed(lambda: parse_records(raw), repeats)
    read = _timed(lambda: read_ledger(run_dir), repeats)  # the JSON objects, then the typed records
    summary = _timed(lambda: build_summary(run_dir, records), repeats)
    return {
        "records": n,
        "ledger_bytes": (run_dir / "ledger.jsonl").stat().st_size,
        "parse_us_per_record": 1e6 * parse / n,
        "depth_check_us_per_record": 1e6 * depth / n,
        "shape_check_us_per_record": 1e6 * shapes / n,
        "read_ledger_s": read,
        "build_summary_s": summary,
        "checks_share_of_read_and_summary": (depth + shapes) / (read + summary),
    }


# Run the command from a small interpreter and read its children's peak RSS there: a child forked
# straight from this process would count this process's own memory, copied before the exec.
_PEAK_RSS = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(code)"
)


def _measured(args: list[str]) -> dict[str, object]:
    """``aiperf ARGS`` in a process of its own: exit status, wall seconds, peak RSS (MiB), its last line."""
    import subprocess
    import sys

    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS, rss.name, sys.executable, "-m", "aiperf.cli", *args],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        peak_kib = int(rss.read() or 0)
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "peak_rss_mib": peak_kib / 1024,
        "says": lines[-1][:200] if lines else "",
    }


def cli_cases() -> dict[str, dict[str, object]]:
    """The issue-23 inputs, built in a temporary folder, each refused (or shown inert) by the CLI."""
    import shutil
    import zipfile

    from aiperf.ledger.store import canonical, read_raw_ledger

    folder = Path(tempfile.mkdtemp(prefix="aiperf-hostile-cli-"))
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers import rehash, simulated_run

    run = simulated_run(folder / "run")
    cases: dict[str, list[str]] = {}
    tail = folder / "tail"
    shutil.copytree(run, tail)
    with open(tail / "ledger.jsonl", "r+b") as fh:
        fh.seek(0, 2)
        fh.write(b"{")
        fh.truncate(fh.tell() + (1 << 30))
    cases["ledger_1GiB_tail_verify"] = ["verify", str(tail)]
    tele = folder / "telemetry"
    shutil.copytree(run, tele)
    with open(tele / "telemetry.jsonl", "wb") as fh:
        fh.truncate(1 << 30)
    cases["telemetry_1GiB_line_verify"] = ["verify", str(tele)]
    cases["scaling_nodes_1e20"] = ["scaling", "--simulate", "--config", "smoke", "--nodes", "1" + "0" * 20,
                                   "-o", str(folder / "scaling")]  # fmt: skip
    cases["make_imagenet_max_side_9000"] = ["make-imagenet", str(folder / "tree"), "--max-side", "9000"]
    bomb = folder / "bomb.keras"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", "{}")
        with z.open("config.json", "w") as member:
            zeros = b" " * (1 << 20)
            for _ in range(256):
                member.write(zeros)
    cases["keras_config_256MiB_flops"] = ["flops", str(bomb)]
    escaped = folder / "escaped"
    shutil.copytree(run, escaped)
    raw = read_raw_ledger(escaped)
    raw[0]["run_id"] = "x\x1b[2K\rFAKE LINE: verified"
    rehash(raw)
    (escaped / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in raw))
    cases["run_id_escapes_summary"] = ["summary", str(escaped)]
    try:
        return {name: _measured(args) for name, args in cases.items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64, help="simulated nodes (8 workers each)")
    parser.add_argument("--budget", type=float, default=600.0, help="simulated run length in seconds")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    facts = machine_facts()
    print(f"{facts['date']} on {facts['host']} ({facts['cpu']}), {facts['load']}")
    refused = refusals(args.repeats)
    for name, seconds in refused.items():
        print(f"  {'load' if name.startswith('largest') else 'refuse'} {name[:-2]:<26} {1e3 * seconds:8.2f} ms")
    hostile = cli_cases()
    for name, got in hostile.items():
        print(
            f"  cli {name:<30} exit {got['exit']}  {got['wall_s']:6.2f} s  {got['peak_rss_mib']:7.1f} MiB  "
            f"{got['says']!r:.110}"
        )
    read = ledger_read(args.nodes, args.budget, args.repeats)
    print(
        f"  ledger: {read['records']:,} records ({read['ledger_bytes'] / 2**20:.1f} MiB): parse "
        f"{read['parse_us_per_record']:.1f} us/record, depth check {read['depth_check_us_per_record']:.1f}, "
        f"shape check {read['shape_check_us_per_record']:.1f}; read {read['read_ledger_s']:.2f} s, "
        f"summary {read['build_summary_s']:.2f} s; checks = {100 * read['checks_share_of_read_and_summary']:.0f} % "
        "of read + summary"
    )
    write_json(args.json, {"machine": facts, "refusals_s": refused, "cli": hostile, "ledger": read, "args": vars(args)})


if __name__ == "__main__":
    main()
