"""Operating-system errors in the run path (issue 13, cases 3 and 5): a full disk, a read-only or
unusable results folder, symlink loops. One line naming the path and what to do, a non-zero
exit, nothing half-written left behind, nothing already recorded lost."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli

from aiperf.engine.weights import WeightStore
from aiperf.errors import AiperfError
from aiperf.ledger.schema import Record
from aiperf.ledger.store import LedgerWriteError, LedgerWriter, read_raw_ledger, record_hash


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("aiperf: error")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".tmp", ".tmp.npz")) or ".tmp." in p.name]


class TinyDisk:
    """A tmpfs of a few megabytes (the issue's "results on a 3 MB tmpfs"), filled on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False

    def mount(self, size: str = "3m", read_only: bool = False) -> Path:
        self.path.mkdir(exist_ok=True)
        options = f"size={size},mode=0755" + (",ro" if read_only else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(self.path)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
        self.mounted = True
        return self.path

    def fill(self, leave_bytes: int = 0) -> None:
        """Take up the free space but ``leave_bytes`` (rounded to pages by tmpfs)."""
        free = os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize
        with contextlib.suppress(OSError), open(self.path / "filler", "ab") as fh:
            fh.write(b"\0" * max(0, free - leave_bytes))

    def free_up(self) -> None:
        (self.path / "filler").unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
            self.mounted = False


@pytest.fixture
def disk(tmp_path):
    d = TinyDisk(tmp_path / "disk")
    yield d
    d.unmount()


def _chain_ok(records: list[dict]) -> bool:
    return all(r["hash"] == record_hash(r) for r in records) and all(
        b["prev"] == a["hash"] and b["seq"] == a["seq"] + 1 for a, b in itertools.pairwise(records)
    )


def test_a_full_disk_never_leaves_half_a_ledger_record(disk):
    root = disk.mount("256k")
    (root / "spare").write_bytes(b"\0" * 65536)  # freed later, as a user frees space
    ledger = LedgerWriter(root / "run")
    written = []
    with pytest.raises(LedgerWriteError) as info:
        for k in range(1000):  # 10 KB records: the last one is cut in the middle of a write
            written.append(ledger.append(Record(type="epoch", trial="t00000", epoch=k + 1, blob="x" * 10_000)))
    message = str(info.value)
    assert info.value.exit_code == 1 and "\n" not in message
    assert str(root / "run" / "ledger.jsonl") in message and "ENOSPC" in message
    assert f"aiperf run --resume {root / 'run'}" in message
    assert (root / "run" / "ledger.jsonl").read_bytes().endswith(b"\n"), "a partial record was left at the end"
    written = [r.to_dict() for r in written]
    assert read_raw_ledger(root / "run") == written and _chain_ok(written)
    with pytest.raises(LedgerWriteError):  # a broken writer refuses, it does not write around the gap
        ledger.append(Record(type="run_stop", status="failed"))
    ledger.close()
    (root / "spare").unlink()
    with LedgerWriter(root / "run") as again:  # as --resume reopens it: the same chain goes on
        rec = again.append(Record(type="run_stop", status="failed"))
    assert rec.seq == written[-1]["seq"] + 1 and rec.prev == written[-1]["hash"]
    assert read_raw_ledger(root / "run") == [*written, rec.to_dict()]


def test_weights_that_cannot_be_saved_stay_in_memory_and_leave_no_temporary_file(disk, caplog):
    root = disk.mount("1m")
    store = WeightStore(4, root / "weights")
    caplog.set_level(logging.WARNING, logger="aiperf")
    disk.fill(leave_bytes=0)
    weights = {1: [np.ones((256, 256), dtype=np.float32)]}  # 256 KiB: does not fit
    assert store.put("t00001", weights, 0.5) and store.put("t00002", weights, 0.6)
    assert store.get("t00001") is weights, "kept in memory for children to inherit"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "one warning per cause, not one per trial"
    assert "t00001.npz" in warnings[0] and "ENOSPC" in warnings[0] and "\n" not in warnings[0]
    assert not _temporaries(root) and not list((root / "weights").iterdir())


def test_summary_and_report_on_a_full_disk_print_and_name_the_file(sim_run, disk):
    root = disk.mount("3m")
    run_dir = root / "run"
    shutil.copytree(sim_run, run_dir)
    (run_dir / "summary.json").unlink()
    ledger = (run_dir / "ledger.jsonl").read_bytes()
    disk.fill(leave_bytes=0)
    proc = _cli("summary", str(run_dir))
    _one_line(proc, 1, str(run_dir / "summary.json"), "ENOSPC", "free space")
    assert "aiperf result" in proc.stdout, "the summary is still printed"
    proc = _cli("report", str(run_dir))
    _one_line(proc, 1, str(run_dir / "report.html"), "ENOSPC")
    assert not _temporaries(root) and not (run_dir / "summary.json").exists()
    assert (run_dir / "ledger.jsonl").read_bytes() == ledger
    disk.free_up()
    assert _cli("summary", str(run_dir)).returncode == 0 and (run_dir / "summary.json").exists()


def test_a_read_only_results_folder_is_one_line_before_anything_starts(disk):
    root = disk.mount("1m", read_only=True)
    _one_line(_cli("run", "--config", "smoke", "--set", f"run.results_dir={root}/results"), 2, "EROFS")


def test_a_published_run_on_a_read_only_file_system(sim_run, disk):
    """verify reads only; summary still prints; neither summary nor report leaves anything behind."""
    root = disk.mount("3m")
    shutil.copytree(sim_run, root / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
    assert _cli("verify", str(root / "run")).returncode == 0
    proc = _cli("summary", str(root / "run"))
    _one_line(proc, 1, "summary.json", "EROFS")
    assert "aiperf result" in proc.stdout
    _one_line(_cli("report", str(root / "run")), 1, "report.html", "EROFS")
    _one_line(_cli("run", "--resume", str(root / "run")), 2, "run.lock", "EROFS")


@pytest.mark.parametrize("case", ["a file", "a symlink loop", "a name too long", "inside a file"])
def test_an_unusable_results_folder_is_one_line_and_exit_2(tmp_path, case):
    if case == "a file":
        target = tmp_path / "results"
        target.write_text("not a folder")
    elif case == "a symlink loop":
        target = tmp_path / "loop"
        target.symlink_to(target)
    elif case == "a name too long":
        target = tmp_path / ("r" * 300)
    else:
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "results"
    proc = _cli("run", "--config", "smoke", "--set", f"run.results_dir={target}", timeout=120)
    line = _one_line(proc, 2, "run.results_dir")
    assert len(line) < 800


def _image_folder(root: Path) -> Path:
    from PIL import Image

    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            Image.fromarray(np.full((8, 8), 40 * k, dtype=np.uint8)).save(root / cls / f"{k}.png")
    return root


@pytest.mark.parametrize("where", ["class folder", "image", "root"])
def test_a_symlink_loop_in_an_image_folder_names_the_link(tmp_path, where):
    root = _image_folder(tmp_path / "images")
    if where == "class folder":
        link = root / "c"
        link.symlink_to(root / "d")
        (root / "d").symlink_to(link)
    elif where == "image":
        link = root / "a" / "loop.png"
        link.symlink_to(link)
    else:
        link = tmp_path / "loop"
        link.symlink_to(link)
        root = link
    results = tmp_path / "results"
    proc = _cli(
        "run",
        *("--set", "dataset.name=image_folder", "--set", f"dataset.path={root}"),
        *("--set", f"run.results_dir={results}"),
        timeout=120,
    )
    _one_line(proc, 2, str(link))
    assert not results.exists() or not any(results.iterdir())


@pytest.mark.slow
def test_a_disk_that_fills_during_a_real_run_loses_nothing_and_resumes(disk):
    """The issue's case 3: results on a small tmpfs that fills while the run goes."""
    root = disk.mount("16m")
    disk.fill(leave_bytes=24 * 1024)
    # The first session stops at ENOSPC within seconds; the resumed one ends on the trial count (a budget
    # on the same clock left a loaded box no time to start its workers and finish an epoch: 20 s did not
    # in CI), and the freed disk must hold what it writes meanwhile (3 MB filled again in 47 s of a run).
    bounds = ("--set", "run.max_trials=3", "--set", "run.time_budget_s=300", "--set", "cluster.max_concurrent_trials=1")
    proc = _cli("run", "--config", "smoke", "--set", f"run.results_dir={root}", *bounds)
    line = _one_line(proc, 1, "ENOSPC", "--resume")
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    assert str(run_dir / "ledger.jsonl") in line or str(run_dir) in line
    assert not _temporaries(root), "a half-written file was left behind"
    data = (run_dir / "ledger.jsonl").read_bytes()
    assert data.endswith(b"\n")
    records = read_raw_ledger(run_dir)
    assert records[0]["type"] == "run_start" and _chain_ok(records)
    # `aiperf summary` works on what is there, even before space is freed.
    summary = _cli("summary", str(run_dir))
    assert summary.returncode in (0, 1) and "aiperf result" in summary.stdout, summary.stderr
    disk.free_up()
    resumed = _cli("run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    after = read_raw_ledger(run_dir)
    assert after[: len(records)] == records and _chain_ok(after)
    assert _cli("verify", str(run_dir)).returncode == 0
    # The score divides by the run's recorded end, the time the disk was full included.
    from aiperf.ledger.schema import parse_records
    from aiperf.metrics.score import compute_score

    assert after[-1]["type"] == "run_stop"
    assert compute_score(parse_records(after, run_dir)).wall_s == after[-1]["t"]
    assert after[-1]["t"] >= after[-1]["wall"] - after[0]["wall"] - 1.0  # the downtime is run time


def test_a_summary_that_cannot_be_written_is_an_aiperf_error(tmp_path, sim_run):
    from aiperf.results.summary import save_summary

    target = tmp_path / "run"
    target.mkdir()
    (target / "summary.json").mkdir()  # rename over a folder fails: EISDIR
    with pytest.raises(AiperfError) as info:
        save_summary(target, {"x": 1})
    assert info.value.exit_code == 1 and "summary.json" in str(info.value)
    assert not _temporaries(target)


@pytest.mark.parametrize("command", [["run", "--resume"], ["summary"], ["verify"], ["report"], ["flops"]])
@pytest.mark.parametrize("path", ["a" * 5000, "with\nnewline/run"], ids=["too long", "newline"])
def test_absurd_paths_are_one_short_line_and_exit_2(command, path):
    proc = _cli(*command, path, timeout=120)
    line = _one_line(proc, 2)
    assert len(line) <= 1000 and proc.stderr.count("\n") == 1, proc.stderr


def test_a_failed_fsync_stops_the_writer_and_a_failed_observer_only_stops_itself(tmp_path, monkeypatch, caplog):
    import errno

    import aiperf.ledger.store as ledger_module

    caplog.set_level(logging.WARNING, logger="aiperf")

    class FailingLog:
        path = tmp_path / "mllog.txt"

        def __call__(self, record):
            raise OSError(errno.ENOSPC, "No space left on device")

    with LedgerWriter(tmp_path) as ledger:
        ledger.subscribe(FailingLog())
        seen = []
        ledger.subscribe(seen.append)
        first = ledger.append(Record(type="run_start", run_id="r"))
        second = ledger.append(Record(type="epoch", trial="t00000", epoch=1))
        assert seen == [first, second], "the other observers and the ledger go on"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "mllog.txt is no longer written" in warnings[0]

        def failing_fsync(fd):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(ledger_module.os, "fsync", failing_fsync)
        with pytest.raises(LedgerWriteError, match=r"cannot sync the ledger .*ledger.jsonl: input/output error"):
            ledger.append(Record(type="epoch", trial="t00000", epoch=2))
        with pytest.raises(LedgerWriteError):
            ledger.append(Record(type="run_stop", status="failed"))
    monkeypatch.undo()
    assert [r["type"] for r in read_raw_ledger(tmp_path)] == ["run_start", "epoch", "epoch"]
