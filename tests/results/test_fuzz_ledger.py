"""Fuzzed ledgers (issue 13, case 7): valid hash chains over records whose field types and shapes
were mutated go through ``summary``, ``verify``, ``report``, ``results.load`` and resume's replay
without an "unexpected error" or a RecursionError; ``verify`` exits 2 for unreadable input and 1
for a failed check."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from helpers import rehash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiperf.cli import main
from aiperf.engine.resume import read_resumable, recorded_config, replay
from aiperf.engine.search import make_search
from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError
from aiperf.ledger.schema import RecordType
from aiperf.ledger.store import canonical, read_raw_ledger
from aiperf.results import mllog
from aiperf.results import tables as results
from aiperf.results.summary import build_summary
from nas.serialize import graph_from_dict

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _nested(depth: int) -> object:
    value: object = 1
    for k in range(depth):
        value = [value] if k % 2 else {"k": value}
    return value


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([10**400, -(10**400), 2**53 + 1, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 5e-324]),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "1e999", "", "t00000", "seed", "epoch", "completed"]),
    st.text(max_size=12),
    st.just("x" * 20_000),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    st.integers(min_value=30, max_value=400).map(_nested),
)
TYPES = [
    "run_start", "trial_start", "epoch", "trial_end", "requeue", "worker", "resume", "run_stop",
    "worker_failed", "bad_images", "??", "",
]  # fmt: skip


@st.composite
def mutated(draw, base: list[dict]) -> tuple[list[dict], bool]:
    """A copy of ``base`` with one mutation; returns (records, whether the chain was rebuilt over it)."""
    records = copy.deepcopy(base)
    kind = draw(st.sampled_from(["field", "field", "field", "field", "delete", "type", "records", "unchained"]))
    index = draw(st.integers(0, len(records) - 1))
    if kind == "records":
        op = draw(st.sampled_from(["drop", "duplicate", "swap", "truncate"]))
        other = draw(st.integers(0, len(records) - 1))
        if op == "drop":
            del records[index]
        elif op == "duplicate":
            records.insert(other, copy.deepcopy(records[index]))
        elif op == "swap":
            records[index], records[other] = records[other], records[index]
        else:
            del records[max(index, 1) :]
    elif kind == "type":
        records[index]["type"] = draw(st.sampled_from(TYPES))
    else:
        node, key = records[index], None
        while True:
            keys = sorted(node, key=str) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = node[key]
            if isinstance(child, (dict, list)) and child and draw(st.booleans()):
                node = child
                continue
            break
        if key is not None:
            if kind == "delete" and isinstance(node, dict):
                del node[key]
            else:
                node[key] = draw(HOSTILE)
    if kind != "unchained":
        rehash(records)
    return records, kind != "unchained"


class _Base(tuple):
    """(records, folder), shown briefly in Hypothesis's reports (the records run to 300 kB)."""

    def __repr__(self) -> str:
        return f"<simulated run of {len(self[0])} records in {self[1]}>"


@pytest.fixture(scope="module")
def base(sim_run, tmp_path_factory) -> tuple[list[dict], Path]:
    """The simulated run as if its master had been killed (resumable), with a matching summary.json."""
    records = read_raw_ledger(sim_run)[:-1]  # JSON objects: the fuzzer edits them as such
    # Records and fields of streamed runs and failing workers, so their readers are fuzzed too.
    records[0]["dataset"].update(storage="stream", bad_images={"count": 1, "files": ["a.JPEG"], "max_fraction": 0.01})
    for rec in records:
        if rec["type"] == RecordType.EPOCH:
            rec.update(input="stream", skipped_images=1, data_wait_s=0.01)
        elif rec["type"] == RecordType.WORKER:
            rec["decode_threads"] = 2
    t0 = records[0]["t"]  # inserted right after run_start: the master clock must not run backwards
    extra = [
        {"type": "worker_failed", "t": t0, "wall": records[0]["wall"], "worker": "w0099", "node": "n", "cause": "x"},
        {"type": "bad_images", "t": t0, "wall": records[0]["wall"], "trial": "t00000", "worker": "w0000",
         "files": ["b.JPEG"], "count": 1, "epoch_count": 1, "over_limit": False},
    ]  # fmt: skip
    records[1:1] = extra
    rehash(records)
    folder = tmp_path_factory.mktemp("fuzz-base")
    _write(folder, records)
    (folder / "summary.json").write_text(json.dumps(build_summary(folder), sort_keys=True))
    return _Base((records, folder))


def _write(folder: Path, records: list[dict]) -> None:
    (folder / "ledger.jsonl").write_bytes(b"".join(canonical(r) + b"\n" for r in records))


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _clean_failure(code: int, err: str, allowed: tuple[int, ...]) -> None:
    assert code in allowed, (code, err)
    assert "unexpected error" not in err and "Recursion" not in err and "Traceback" not in err, err
    if code == 2:  # refused input: one line on stderr (a failed verify check prints its report on stdout)
        assert len(err.strip().splitlines()) == 1 and len(err) < 1500, err


def _replay(folder: Path, header: dict) -> None:
    """What ``aiperf run --resume`` does with a ledger before it trains anything."""
    records = read_resumable(folder)
    cfg = recorded_config(records)
    seed = graph_from_dict(header["seed_architecture"])  # comes from the dataset, not from the ledger
    # The replay is what is fuzzed; random search skips the Bayesian search's 0.4 s of set-up.
    cfg.search.strategy = "random"
    proposer = make_search(cfg, seed, 64)
    replay(records, proposer, WeightStore(cfg.cluster.keep_weights))
    mllog.render(list(records))


@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_mutated_ledgers_never_crash_summary_verify_load_or_resume(base, data):
    records, folder = base
    ledger, rechained = data.draw(mutated(records))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "summary.json").write_bytes((folder / "summary.json").read_bytes())
        try:
            _write(run, ledger)
        except (ValueError, RecursionError):  # json cannot write it: nothing to read
            return
        changed = (run / "ledger.jsonl").read_bytes() != (folder / "ledger.jsonl").read_bytes()

        code, out, err = _cli("verify", str(run))
        _clean_failure(code, err, (1, 2) if changed else (0,))
        if not rechained and changed:
            assert code in (1, 2)

        code, out, err = _cli("summary", str(run))
        _clean_failure(code, err, (0, 2))
        if code == 0:
            assert "aiperf result" in out

        try:
            loaded = results.load(run)
        except AiperfError as exc:
            assert "\n" not in str(exc)
        else:
            # read as a stream: every epoch counted (the frame may be a sample of them), the header kept
            assert loaded.epochs_total == sum(1 for r in ledger if isinstance(r, dict) and r.get("type") == "epoch")
            assert loaded.records[0] == loaded.header

        try:
            _replay(run, records[0])
        except AiperfError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 1500


@settings(FUZZ, max_examples=12)
@given(data=st.data())
def test_mutated_ledgers_never_crash_the_report(base, data):
    records, _ = base
    ledger, _ = data.draw(mutated(records))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        try:
            _write(run, ledger)
        except (ValueError, RecursionError):
            return
        code, _, err = _cli("report", str(run), "-o", str(run / "page.html"))
        _clean_failure(code, err, (0, 2))
        assert (run / "page.html").exists() == (code == 0)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a":' * 500 + b"1" + b"}" * 500, "nests more than"),
        (b'{"seq": NaN}', "not valid JSON"),
        (b'{"seq": Infinity}', "not valid JSON"),
        (b'{"seq": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
    ],
)
def test_unreadable_ledger_lines_exit_2_everywhere(base, tmp_path, line, fragment):
    _, folder = base
    data = (folder / "ledger.jsonl").read_bytes().split(b"\n")
    data.insert(3, line)
    (tmp_path / "ledger.jsonl").write_bytes(b"\n".join(data))
    (tmp_path / "summary.json").write_bytes((folder / "summary.json").read_bytes())
    for command in (["verify"], ["summary"], ["report"], ["run", "--resume"]):
        code, _, err = _cli(*command, str(tmp_path))
        assert code == 2, (command, err)
        assert fragment in err and "line 4" in err and len(err.strip().splitlines()) == 1, (command, err)
    with pytest.raises(AiperfError, match=fragment):
        results.load(tmp_path)


def test_verify_exit_codes_are_distinct(base, tmp_path):
    """0 verified, 1 a check failed, 2 the input could not be read."""
    records, folder = base
    code, out, err = _cli("verify", str(folder))
    assert code == 0, out + err
    edited = copy.deepcopy(records)
    k = next(i for i, r in enumerate(edited) if r["type"] == RecordType.EPOCH)
    edited[k]["val_acc"] = "0.99"  # a string where a number belongs, under a valid chain
    rehash(edited)
    _write(tmp_path, edited)
    (tmp_path / "summary.json").write_bytes((folder / "summary.json").read_bytes())
    code, out, _ = _cli("verify", str(tmp_path))
    assert code == 1 and f"record {k + 1} (seq {k}, epoch): val_acc: input should be a valid number" in out
    assert _cli("verify", str(tmp_path / "nope"))[0] == 2
    (tmp_path / "ledger.jsonl").write_bytes(b"")
    assert _cli("verify", str(tmp_path))[0] == 2


TELEMETRY_SAMPLE = {
    "wall": 1795456935.0, "node_wall": 1795456935.1, "node": "sim-node-0", "hostname": "sim", "cpu_percent": 50.0,
    "cpus": 2, "cpu_busy_s": 100.0, "run_cpu_s": 40.0, "host_mem_used_bytes": 5, "host_mem_total_bytes": 10,
    "accelerators": [{"index": 0, "name": "GPU", "util_percent": 90.0, "mem_used_bytes": 1, "mem_total_bytes": 2,
                      "power_w": 300.0, "outside_util_percent": 0.0}],
}  # fmt: skip


@settings(FUZZ, max_examples=25)
@given(
    mutations=st.lists(
        st.tuples(st.sampled_from([*TELEMETRY_SAMPLE, "accelerators.0", "accelerators.0.power_w", "error"]), HOSTILE),
        max_size=3,
    ),
    garbage=st.sampled_from([b"", b"{not json\n", b"[1,2]\n", b"NaN\n", b'{"wall": Infinity, "node": "x"}\n']),
)
def test_mutated_telemetry_never_fails_a_summary_or_verify(base, mutations, garbage):
    """telemetry.jsonl is outside the hash chain: a malformed sample is dropped, never a crash."""
    _, folder = base
    samples = [dict(TELEMETRY_SAMPLE, wall=TELEMETRY_SAMPLE["wall"] + k, node_wall=TELEMETRY_SAMPLE["wall"] + k)
               for k in range(3)]  # fmt: skip
    for path, value in mutations:
        devices = samples[1].get("accelerators")
        if not path.startswith("accelerators.0"):
            samples[1][path] = value
        elif isinstance(devices, list) and devices and path == "accelerators.0":
            devices[0] = value
        elif isinstance(devices, list) and devices and isinstance(devices[0], dict):
            devices[0]["power_w"] = value
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "ledger.jsonl").write_bytes((folder / "ledger.jsonl").read_bytes())
        lines = []
        for sample in samples:
            try:
                lines.append(json.dumps(sample).encode() + b"\n")
            except (ValueError, RecursionError):
                continue
        (run / "telemetry.jsonl").write_bytes(b"".join(lines) + garbage)
        code, out, err = _cli("summary", str(run))
        _clean_failure(code, err, (0,))
        assert "aiperf result" in out
        code, out, err = _cli("verify", str(run))
        _clean_failure(code, out + err, (0,))
        assert results.load(run).telemetry is not None


@pytest.mark.parametrize(
    "text",
    [b"[" * 100_000, b"[]", b'"x"', b"{" + b'"score": ' + b"[" * 900 + b"]" * 900 + b"}", b"NaN", b"\xff" * 10],
)
def test_a_hostile_summary_json_fails_verify_with_exit_1(base, tmp_path, text):
    _, folder = base
    (tmp_path / "ledger.jsonl").write_bytes((folder / "ledger.jsonl").read_bytes())
    (tmp_path / "summary.json").write_bytes(text)
    code, out, err = _cli("verify", str(tmp_path))
    _clean_failure(code, err, (1,))
    assert out.startswith("verify failed: ")


@pytest.mark.parametrize(
    ("name", "kind", "commands"),
    [
        ("ledger.jsonl", "zero", (["verify"], ["summary"], ["report"], ["run", "--resume"])),
        ("ledger.jsonl", "fifo", (["verify"], ["summary"], ["report"], ["run", "--resume"])),
        ("summary.json", "fifo", (["verify"],)),
        ("summary.json", "zero", (["verify"],)),
        ("telemetry.jsonl", "fifo", (["verify"], ["summary"], ["report"])),
        ("telemetry.jsonl", "zero", (["verify"], ["summary"], ["report"])),
    ],
)
def test_a_run_directory_with_special_files_is_refused_without_blocking(base, tmp_path, name, kind, commands):
    """A published run directory is someone else's: a FIFO would block a reader, /dev/zero fill its memory."""
    _, folder = base
    for part in ("ledger.jsonl", "summary.json"):
        (tmp_path / part).write_bytes((folder / part).read_bytes())
    (tmp_path / name).unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(tmp_path / name)
    else:
        (tmp_path / name).symlink_to("/dev/zero")
    for command in commands:
        code, _, err = _cli(*command, str(tmp_path))
        _clean_failure(code, err, (2,))
        assert name in err and ("not a regular file" in err or "not a run directory" in err), (command, err)
    if name == "ledger.jsonl":  # the library readers refuse it too, without the CLI's check first
        with pytest.raises(AiperfError, match="not a regular file"):
            results.load(tmp_path)
