"""Stored weights and Keras model files are checked from their headers before anything is unpacked.

A small file that declares a huge array (an ``.npz`` member whose ``.npy`` header says 750 M
floats, a ``.keras`` whose ``config.json`` unpacks to 200 MB, an HDF5 dataset of 3 GB stored as
a fill value) fails with one line naming the file and what it declares, under a 3 GiB address
space (``run_cli_bounded``): a regression fails the test instead of taking the machine's memory.
"""

from __future__ import annotations

import hashlib
import io
import logging
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import ledger_records, rechain, run_cli_bounded

from aiperf.archives import open_zip
from aiperf.engine.weights import (
    MAX_WEIGHTS_MEMBERS,
    WeightsFileError,
    WeightStore,
    expected_arrays,
    load_weights,
    weights_bytes,
)
from aiperf.errors import AiperfError
from aiperf.families.image.keras_import import MAX_KERAS_JSON_BYTES, load_keras_file
from aiperf.ledger.audit_file import AUDIT_NAME, read_audit
from nas import zoo

GRAPH = zoo.small_resnet((8, 8, 1), 10, width=8)
HUGE = 750_000_000  # the hostile pass's figure: 3 GB of float32 declared by a few bytes


def _npy(shape: tuple[int, ...], descr: str = "<f4", data: bytes | None = None) -> bytes:
    """A ``.npy`` stream: its header as numpy writes it, then ``data`` (the real array's zeros by default)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    if data is None:
        data = bytes(int(np.prod(shape)) * np.dtype(descr).itemsize)
    return header.getvalue() + data


def _arrays(graph=GRAPH) -> dict[str, bytes]:
    return {f"{k}.npy": _npy(shape) for k, shape in expected_arrays(graph).items()}


def _npz(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _first(graph=GRAPH) -> tuple[str, tuple[int, ...]]:
    """The first array of the architecture with at least two dimensions: its member name and shape."""
    return next((k, s) for k, s in expected_arrays(graph).items() if len(s) >= 2)


def _set_size(path: Path, member: str, size: int) -> None:
    """Rewrite ``member``'s declared uncompressed size in both its zip headers (a lying header)."""
    with zipfile.ZipFile(path) as zf:
        info, start = zf.getinfo(member), zf.start_dir
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, info.header_offset + 22, size)  # local file header
    at = start
    while raw[at : at + 4] == b"PK\x01\x02":  # central directory entries
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", raw, at + 28)
        if raw[at + 46 : at + 46 + name_len].decode() == member:
            struct.pack_into("<I", raw, at + 24, size)
        at += 46 + name_len + extra_len + comment_len
    path.write_bytes(bytes(raw))


# --- the weights file, read back against its architecture -----------------------------------------------


def test_weights_written_by_the_store_read_back_with_and_without_their_architecture(tmp_path):
    rng = np.random.default_rng(0)
    weights = {}
    for key, shape in expected_arrays(GRAPH).items():
        weights.setdefault(int(key.split(":")[0]), []).append(rng.normal(size=shape).astype(np.float32))
    path = tmp_path / "t00001.npz"
    path.write_bytes(weights_bytes(weights))
    for graph in (GRAPH, None):
        back = load_weights(path, graph)
        assert back.keys() == weights.keys()
        assert all(np.array_equal(a, b) for n in weights for a, b in zip(back[n], weights[n], strict=True))


def _forged(kind: str) -> tuple[dict[str, bytes], int]:
    members, compression = _arrays(), zipfile.ZIP_STORED
    key, shape = _first()
    if kind == "huge":  # the header claims 3 GB, 64 bytes follow
        members[f"{key}.npy"] = _npy((HUGE,), data=bytes(64))
    elif kind == "trillion":
        members[f"{key}.npy"] = _npy((10**6, 10**6), data=bytes(64))
    elif kind == "shape":  # the right element count in another shape
        members[f"{key}.npy"] = _npy((1, int(np.prod(shape))))
    elif kind == "extra":
        members["999:0.npy"] = _npy((4,))
    elif kind == "missing":
        del members[f"{key}.npy"]
    elif kind == "dtype":
        members[f"{key}.npy"] = _npy(shape, descr="<f8")
    elif kind == "pickle":
        members[f"{key}.npy"] = _npy(shape, descr="|O", data=b"")
    elif kind == "name":
        members["../evil.npy"] = members.pop(f"{key}.npy")
    elif kind == "bomb":  # 40 MB of zeros deflated to 40 KB, declared as such in the zip headers
        members[f"{key}.npy"] = _npy((10_000_000,))
        compression = zipfile.ZIP_DEFLATED
    return members, compression


FORGERIES = [
    ("huge", f"member '{_first()[0]}' declares {HUGE:,} elements, the architecture needs {np.prod(_first()[1]):,}"),
    ("trillion", f"member '{_first()[0]}' declares 1,000,000,000,000 elements, the architecture needs"),
    ("shape", f"member '{_first()[0]}' has shape (1, {np.prod(_first()[1])}), the architecture needs {_first()[1]}"),
    ("extra", "holds 28 members, the architecture has 27 arrays"),
    ("missing", f"has no member '{_first()[0]}', an array of the architecture"),
    ("dtype", "declares dtype 'float64', not float32"),
    ("pickle", "declares dtype 'object', not float32"),
    ("name", "member '../evil' is not an array named node:index.npy"),
    ("bomb", "its members declare 40,0"),
]


@pytest.mark.parametrize(("kind", "message"), FORGERIES, ids=[k for k, _ in FORGERIES])
def test_a_forged_weights_file_fails_from_its_headers_naming_file_and_member(tmp_path, kind, message):
    members, compression = _forged(kind)
    path = _npz(tmp_path / "t00012.npz", members, compression)
    with pytest.raises(WeightsFileError) as err:
        load_weights(path, GRAPH, "weights/t00012.npz")
    text = str(err.value)
    assert text.startswith("weights/t00012.npz: ") and message in text, text
    assert "\n" not in text


def test_without_an_architecture_the_absolute_caps_hold(tmp_path):
    path = _npz(tmp_path / "t00001.npz", {"0:0.npy": _npy((HUGE,), data=bytes(64))})
    with pytest.raises(WeightsFileError, match=r"declares 750,000,000 elements, more than the 1,073,741,824 bytes"):
        load_weights(path)
    path = _npz(tmp_path / "t00002.npz", {"0:0.npy": _npy((3,)), "0:2.npy": _npy((3,))})
    with pytest.raises(WeightsFileError, match="node 0's arrays are not numbered 0, 1, 2"):
        load_weights(path)


def test_a_member_whose_zip_header_understates_it_stops_at_the_declared_size(tmp_path):
    key, shape = _first()
    members = _arrays()
    members[f"{key}.npy"] = _npy((HUGE // 100,))  # 30 MB of zeros, deflated
    path = _npz(tmp_path / "t00001.npz", members, zipfile.ZIP_DEFLATED)
    _set_size(path, f"{key}.npy", len(_npy(shape)))  # the zip says it is the architecture's array
    with pytest.raises(WeightsFileError) as err:
        load_weights(path, GRAPH, "weights/t00001.npz")
    assert str(err.value) == f"weights/t00001.npz: not a readable weights file (Bad CRC-32 for file '{key}.npy')"


def test_too_many_members_fail_before_the_directory_is_read(tmp_path):
    path = tmp_path / "t00001.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for n in range(MAX_WEIGHTS_MEMBERS + 1):
            zf.writestr(f"{n}:0.npy", b"")
    with pytest.raises(WeightsFileError, match="holds 10,001 zip entries, at most 10,000 are read"):
        load_weights(path)
    raw = bytearray(path.read_bytes())  # an end record that declares a directory of 4 GB
    struct.pack_into("<I", raw, len(raw) - 22 + 12, 0xFFFFFFF0)
    path.write_bytes(bytes(raw))
    with pytest.raises(WeightsFileError, match="its zip directory declares 4,294,967,280 bytes"):
        load_weights(path)
    with pytest.raises(AiperfError, match="more than 3 entries take"):
        open_zip(path, "x.zip", 3)


def test_running_out_of_memory_anyway_names_the_file(tmp_path, monkeypatch):
    path = _npz(tmp_path / "t00003.npz", _arrays())

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(np.lib.format, "read_array", exhausted)
    with pytest.raises(WeightsFileError, match=r"^weights/t00003.npz: ran out of memory reading the weights file$"):
        load_weights(path, GRAPH, "weights/t00003.npz")


def test_resume_skips_a_forged_kept_file_with_a_warning(tmp_path, caplog):
    directory = tmp_path / "weights"
    directory.mkdir()
    _npz(directory / "t00001.npz", {"0:0.npy": _npy((HUGE,), data=bytes(64))})
    store = WeightStore(capacity=2, directory=directory)
    with caplog.at_level(logging.WARNING):
        assert store.reload({"t00001": 0.5}) == ["weights/t00001.npz"]
    assert "t00001" not in store and "declares 750,000,000 elements" in caplog.text


# --- Keras model files (aiperf flops FILE.keras) --------------------------------------------------------


def _keras_archive(path: Path, config: bytes = b"{}", weights: bytes | None = None, deflate: bool = False) -> Path:
    compression = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression, compresslevel=1) as zf:
        zf.writestr("metadata.json", b'{"keras_version": "3.15.1"}')
        zf.writestr("config.json", config)
        if weights is not None:
            zf.writestr("model.weights.h5", weights)
    return path


def _h5_bomb(path: Path) -> Path:
    """An HDF5 file of a few KB whose one dataset declares 3 GB (chunked, compressed, never written)."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as h5:
        h5.create_dataset("layers/dense/vars/0", shape=(HUGE,), dtype="f4", chunks=(1 << 20,), compression="gzip")
    return path


def _flops(path: Path) -> subprocess.CompletedProcess:
    return run_cli_bounded("flops", str(path), timeout=300)


def _one_line_naming(proc: subprocess.CompletedProcess, path: Path, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if str(path) in line]
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), proc.stderr[-2000:]


def test_a_keras_config_that_unpacks_to_200_mb_fails_before_it_is_read(tmp_path):
    path = _keras_archive(tmp_path / "bomb.keras", bytes(200 << 20), deflate=True)
    assert path.stat().st_size < 1 << 20  # deflated zeros: about 200 KB on disk
    proc = _flops(path)
    _one_line_naming(
        proc, path, "member 'config.json' declares 209,715,200 bytes unpacked", f"{MAX_KERAS_JSON_BYTES:,}"
    )


def test_a_keras_config_whose_zip_header_lies_stops_at_the_declared_size(tmp_path):
    path = _keras_archive(tmp_path / "liar.keras", b" " * (200 << 20), deflate=True)
    _set_size(path, "config.json", 100)  # the headers say 100 bytes; the stream unpacks to 200 MB
    with pytest.raises(AiperfError) as err:
        load_keras_file(path)
    assert str(err.value).startswith(f"{path}: member 'config.json' cannot be read (Bad CRC-32"), str(err.value)


def test_an_hdf5_dataset_declaring_3_gb_fails_before_keras_reads_it(tmp_path):
    weights = _h5_bomb(tmp_path / "model.weights.h5").read_bytes()
    assert len(weights) < 1 << 20
    path = _keras_archive(tmp_path / "shape-bomb.keras", weights=weights)
    proc = _flops(path)
    _one_line_naming(proc, path, "its HDF5 dataset 'layers/dense/vars/0'", "3,000,000,000 bytes")
    legacy = _h5_bomb(tmp_path / "shape-bomb.h5")
    with pytest.raises(AiperfError, match=r"brings the arrays it declares to 3,000,000,000 bytes, more than the"):
        load_keras_file(legacy)


def test_a_keras_archive_with_too_many_members_or_an_oversized_one_is_refused(tmp_path):
    path = tmp_path / "many.keras"
    with zipfile.ZipFile(path, "w") as zf:
        for n in range(100):
            zf.writestr(f"assets/{n}", b"")
    with pytest.raises(AiperfError, match="holds 100 zip entries, at most 64 are read"):
        load_keras_file(path)
    path = _keras_archive(tmp_path / "big.keras", b"{}")
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("assets/blob", bytes(MAX_KERAS_JSON_BYTES + 1))
    with pytest.raises(AiperfError, match=r"member 'assets/blob' declares 8,388,609 bytes unpacked, at most 8,388,608"):
        load_keras_file(path)


# --- aiperf audit on a run whose weights files were forged and re-hashed ----------------------------------


def _forge_file(run: Path, rec: dict, edit) -> str:
    """Replace the weights file ``rec`` names by ``edit(its members)`` and re-hash it in the record; the
    member ``edit`` changed."""
    path = run / rec["file"]
    with zipfile.ZipFile(path) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    changed = edit(members)
    _npz(path, members)
    data = path.read_bytes()
    rec.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    return changed


def _declare_huge(members: dict[str, bytes]) -> str:
    name = sorted(members)[0]
    members[name] = _npy((HUGE,), data=bytes(64))
    return name.removesuffix(".npy")


def _add_members(members: dict[str, bytes]) -> str:
    for n in range(3):
        members[f"{900 + n}:0.npy"] = _npy((4,))
    return ""


@pytest.mark.slow  # a real 2-trial run, then one audit under a 3 GiB address space
def test_the_audit_fails_forged_weights_by_name_and_still_writes_audit_json(audited_run, tmp_path):
    run = tmp_path / audited_run.name
    shutil.copytree(audited_run, run, ignore=shutil.ignore_patterns("run.lock", AUDIT_NAME, "report.html"))
    records = ledger_records(run)
    stored = [r for r in records if r["type"] == "weights"]
    assert len(stored) == 2, stored
    huge_member = _forge_file(run, stored[0], _declare_huge)
    _forge_file(run, stored[1], _add_members)
    rechain(run, records)
    proc = run_cli_bounded("audit", str(run), "--sample", "1", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-3000:]
    out = proc.stdout
    huge = f"{stored[0]['file']}: member '{huge_member}' declares {HUGE:,} elements, the architecture needs "
    assert huge in out and f"{stored[1]['file']}: holds " in out and "the architecture has " in out, out
    data = read_audit(run)
    assert data is not None and data["ok"] is False
    failed = {c["trial"]: c["detail"] for c in data["trials"] if c["status"] == "fail"}
    assert failed.keys() == {stored[0]["trial"], stored[1]["trial"]}
    assert failed[stored[0]["trial"]].startswith(huge)
