"""Token shards for the LM workload: round trip, memory-mapped windows, hostile shards, the module CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, cli_env

from aiperf.errors import AiperfError
from aiperf.families.language.token_shards import (
    HASHED_HEADER_BYTES,
    HEADER_BYTES,
    MAX_SHARD_DOCUMENTS,
    MAX_SHARD_TOKENS,
    MAX_VOCAB,
    ShardSet,
    TokenShard,
    check_folder,
    convert_folder,
    open_token_folder,
    split_documents,
    write_shard,
)

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "émigré", "naïve", "café", "owners"]


def make_texts(root: Path, count: int = 40, seed: int = 0) -> dict[str, bytes]:
    """A folder of text files (nested, of varied lengths, UTF-8) and a hidden file the converter skips."""
    rng = np.random.default_rng(seed)
    texts = {}
    for k in range(count):
        rel = f"{'sub/' if k % 3 == 0 else ''}doc{k:03d}.txt"
        words = rng.choice(WORDS, size=int(rng.integers(1, 400)))
        data = (" ".join(words) + "\n").encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        texts[rel] = data
    (root / ".hidden").write_bytes(b"not a document")
    return texts


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict[str, bytes], dict]:
    """40 text files converted with small shards (several per split); tests copy before damaging it."""
    base = tmp_path_factory.mktemp("tokens")
    texts = make_texts(base / "src")
    manifest = convert_folder(base / "src", base / "out", val_fraction=0.2, shard_tokens=3000, seed=5)
    return base / "out", texts, manifest


def copy_of(converted, tmp_path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(converted[0], out)
    return out


def one_line(excinfo, *fragments):
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def reseal(path: Path) -> None:
    """Recompute a shard's checksum after an edit, as a hostile writer would."""
    raw = bytearray(path.read_bytes())
    raw[HASHED_HEADER_BYTES:HEADER_BYTES] = hashlib.sha256(raw[:HASHED_HEADER_BYTES] + raw[HEADER_BYTES:]).digest()
    path.write_bytes(bytes(raw))


def test_round_trip_reads_back_every_document_in_split_order(converted):
    out, texts, manifest = converted
    names = sorted(texts)
    train, val = split_documents(len(names), 0.2, 5)
    folder = open_token_folder(out)
    assert folder.vocab_size == 256 and manifest["tokenizer"] == "bytes" and manifest["eod_token"] == 0
    for shard_set, index in ((folder.train, train), (folder.val, val)):
        docs = [shard.document(k) for shard in shard_set.shards for k in range(shard.header.documents)]
        assert [d.tobytes() for d in docs] == [texts[names[i]] + b"\0" for i in index]  # boundaries preserved
        assert all(shard.header.tokens <= 3000 or shard.header.documents == 1 for shard in shard_set.shards)
    assert len(folder.train.shards) > 1 and not set(train) & set(val) and len(val) == 8
    assert folder.train.documents + folder.val.documents == len(texts)


def test_manifest_matches_the_shards_on_disk(converted):
    out, texts, manifest = converted
    assert json.loads((out / "manifest.json").read_text()) == manifest
    for split in ("train", "val"):
        entries = manifest["shards"][split]
        assert sorted(p.name for p in (out / split).iterdir()) == [e["name"] for e in entries]
        for entry in entries:
            raw = (out / split / entry["name"]).read_bytes()
            assert raw[HASHED_HEADER_BYTES:HEADER_BYTES].hex() == entry["sha256"]
            shard = TokenShard.open(out / split / entry["name"])
            assert (shard.header.tokens, shard.header.documents) == (entry["tokens"], entry["documents"])
    total = sum(e["tokens"] for split in ("train", "val") for e in manifest["shards"][split])
    assert total == sum(len(t) + 1 for t in texts.values()) and manifest["source"]["documents"] == len(texts)
    assert "ok:" in check_folder(out) and open_token_folder(out).describe()["documents"]["val"] == 8


def test_windows_from_the_memory_map_equal_slices_of_the_stored_tokens(converted):
    out = converted[0]
    folder = open_token_folder(out)
    streams = []
    for shard in folder.train.shards:
        assert isinstance(shard.tokens, np.memmap)
        raw = shard.path.read_bytes()
        streams.append(np.frombuffer(raw, np.uint8, offset=HEADER_BYTES + 8 * (shard.header.documents + 1)))
    x, y = folder.train.random_windows(16, 200, np.random.default_rng(0))
    assert x.shape == y.shape == (200, 16) and np.array_equal(x[:, 1:], y[:, :-1])
    joined = [s.tobytes() for s in streams]
    assert all(any(row.tobytes() + t[-1:].tobytes() in s for s in joined) for row, t in zip(x, y, strict=True))
    again, _ = folder.train.random_windows(16, 200, np.random.default_rng(0))
    assert np.array_equal(x, again)
    vx, vy = folder.val.fixed_windows(16)
    first = folder.val.shards[0]
    n = (first.header.tokens - 1) // 16
    assert np.array_equal(vx[:n].reshape(-1), np.asarray(first.tokens[: n * 16]))
    assert np.array_equal(vy[0], np.asarray(first.tokens[1:17]))
    assert np.array_equal(
        folder.val.fixed_windows(16, max_windows=5)[0], open_token_folder(out).val.fixed_windows(16, 5)[0]
    )


def test_wide_vocabularies_use_wider_tokens_and_are_range_checked(tmp_path):
    docs = [np.array([5, 300, 70000 % 1000, 1], np.int64), np.array([999, 1], np.int64)]
    header = write_shard(tmp_path / "w.tokens", docs, vocab_size=1000, eod_token=1)
    assert header.token_bytes == 2
    shard = TokenShard.open(tmp_path / "w.tokens")
    assert shard.tokens.dtype == np.dtype("<u2") and shard.document(1).tolist() == [999, 1]
    write_shard(tmp_path / "big.tokens", [np.array([70000, 3])], vocab_size=100_000, eod_token=None)
    assert TokenShard.open(tmp_path / "big.tokens").header.token_bytes == 4
    with pytest.raises(AiperfError) as excinfo:
        write_shard(tmp_path / "x.tokens", [np.array([1000, 1])], vocab_size=1000, eod_token=1)
    one_line(excinfo, "token ids must be integers in 0 .. 999")


def damage(path: Path, edit) -> str:
    raw = bytearray(path.read_bytes())
    edit(raw)
    path.write_bytes(bytes(raw))
    with pytest.raises(AiperfError) as excinfo:
        TokenShard.open(path)
    message = str(excinfo.value)
    assert "\n" not in message and str(path) in message
    return message


def _put(fmt: str, at: int, value: int):
    return lambda raw: raw.__setitem__(slice(at, at + struct.calcsize(fmt)), struct.pack(fmt, value))


def test_each_hostile_shard_is_one_line_naming_the_shard_and_the_problem(converted, tmp_path):
    source = converted[0] / "train" / "00000.tokens"
    size = source.stat().st_size
    documents = TokenShard.open(source).header.documents
    text = HEADER_BYTES + 8 * (documents + 1)  # the first token
    cases = {
        "truncated": (lambda raw: raw.__delitem__(slice(size - 10, size)), "truncated"),
        "stub": (lambda raw: raw.__delitem__(slice(20, size)), "shorter than the 72-byte header"),
        "trailing": (lambda raw: raw.extend(b"xx"), "has trailing bytes"),
        "magic": (lambda raw: raw.__setitem__(slice(0, 8), b"GPT2BIN!"), "wrong magic bytes"),
        "version": (_put("<I", 8, 9), "format version 9 is not supported"),
        "width": (_put("<I", 12, 2), "token width 2 bytes does not fit vocab_size 256"),
        "vocab": (_put("<I", 16, MAX_VOCAB + 1), "vocab_size 1,048,577 is outside"),
        "documents": (_put("<Q", 24, MAX_SHARD_DOCUMENTS + 1), "documents; a shard holds"),
        "tokens": (_put("<Q", 32, MAX_SHARD_TOKENS + 1), "tokens; a shard holds"),
        "checksum": (lambda raw: raw.__setitem__(text + 1, raw[text + 1] ^ 0x20), "checksum mismatch"),
        "order": (_put("<Q", HEADER_BYTES + 8 * 2, 1), "document offsets are not increasing: offset 2"),
        "start": (_put("<Q", HEADER_BYTES, 3), "starts at 3, not 0"),
        "eod": (lambda raw: raw.__setitem__(size - 1, ord("x")), "does not end with the end-of-document token 0"),
    }
    for name, (edit, fragment) in cases.items():
        victim = tmp_path / f"{name}.tokens"
        shutil.copy(source, victim)
        message = damage(victim, edit)
        assert fragment in message, f"{name}: {fragment!r} not in {message!r}"

    fifo = tmp_path / "fifo.tokens"
    os.mkfifo(fifo)
    with pytest.raises(AiperfError) as excinfo:
        TokenShard.open(fifo)  # refused without a read that would block
    one_line(excinfo, str(fifo), "not a regular file")

    past_end = tmp_path / "past.tokens"
    shutil.copy(source, past_end)
    assert "past the end of" in damage(past_end, _put("<Q", HEADER_BYTES + 8 * documents, size))

    # Ids over the vocabulary behind a valid checksum: the header claims 100 ids, the text uses more.
    small_vocab = tmp_path / "vocab100.tokens"
    shutil.copy(source, small_vocab)
    raw = bytearray(small_vocab.read_bytes())
    raw[16:20] = struct.pack("<I", 100)
    small_vocab.write_bytes(bytes(raw))
    reseal(small_vocab)
    with pytest.raises(AiperfError) as excinfo:
        TokenShard.open(small_vocab)
    one_line(excinfo, str(small_vocab), "not below vocab_size 100")
    unverified = TokenShard.open(small_vocab, verify=False)  # the windows still refuse such ids
    with pytest.raises(AiperfError) as excinfo:
        ShardSet("train", [unverified]).fixed_windows(8)
    one_line(excinfo, str(small_vocab), "not below vocab_size 100")


def test_folder_problems_are_one_line_errors(converted, tmp_path):
    out = copy_of(converted, tmp_path)
    (out / "val" / "00000.tokens").unlink()
    with pytest.raises(AiperfError) as excinfo:
        open_token_folder(out)
    one_line(excinfo, "00000.tokens", "listed in manifest.json but missing")

    out = copy_of(converted, tmp_path / "b")
    shutil.copy(out / "train" / "00000.tokens", out / "train" / "99999.tokens")
    with pytest.raises(AiperfError) as excinfo:
        open_token_folder(out)
    one_line(excinfo, "99999.tokens", "not listed in manifest.json")

    out = copy_of(converted, tmp_path / "c")
    shutil.copy(out / "train" / "00001.tokens", out / "train" / "00000.tokens")  # same format, wrong shard
    with pytest.raises(AiperfError) as excinfo:
        open_token_folder(out)
    one_line(excinfo, "train/00000.tokens", "does not match manifest.json")

    out = copy_of(converted, tmp_path / "d")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"]["train"][0]["name"] = "../../etc/passwd"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AiperfError) as excinfo:
        open_token_folder(out)
    one_line(excinfo, "manifest.json", "each shard is")
    (out / "manifest.json").write_text("{" * 100_000)
    with pytest.raises(AiperfError) as excinfo:
        open_token_folder(out)
    one_line(excinfo, "manifest.json", "not valid JSON")
    (out / "manifest.json").unlink()
    with pytest.raises(AiperfError) as excinfo:
        open_token_folder(out)
    one_line(excinfo, "no manifest.json")


def test_conversion_refuses_binary_files_a_used_output_folder_and_bad_sizes(tmp_path):
    make_texts(tmp_path / "src", count=3)
    (tmp_path / "src" / "image.bin").write_bytes(b"PNG\0\x01")
    with pytest.raises(AiperfError) as excinfo:
        convert_folder(tmp_path / "src", tmp_path / "out", 0.3, 1000)
    one_line(excinfo, "image.bin", "holds byte 0 at offset 3")
    assert not (tmp_path / "out").exists()  # nothing half-written is left behind
    (tmp_path / "src" / "image.bin").unlink()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("x")
    with pytest.raises(AiperfError) as excinfo:
        convert_folder(tmp_path / "src", tmp_path / "used", 0.3, 1000)
    one_line(excinfo, "not an empty folder")
    with pytest.raises(AiperfError) as excinfo:
        convert_folder(tmp_path / "src", tmp_path / "out", 0.3, 0)
    one_line(excinfo, "--shard-tokens must be")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_text("alone")
    with pytest.raises(AiperfError) as excinfo:
        convert_folder(tmp_path / "one", tmp_path / "out", 0.3, 1000)
    one_line(excinfo, "at least 2 documents")


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aiperf.families.language.token_shards", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=120,
    )


def test_module_cli_convert_and_check_with_exit_codes(tmp_path):
    texts = make_texts(tmp_path / "src", count=12)
    out = tmp_path / "out"
    done = run_module("convert", str(tmp_path / "src"), str(out), "--val-fraction", "0.25", "--shard-tokens", "2000")
    assert done.returncode == 0, done.stderr
    assert "wrote train" in done.stdout and (out / "manifest.json").exists()
    checked = run_module("check", str(out))
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    assert len(lines) == 1 and "ok:" in lines[0] and f"{len(texts) - 3} documents" in lines[0]

    victim = sorted((out / "train").iterdir())[0]
    raw = bytearray(victim.read_bytes())
    raw[-3] ^= 0x01
    victim.write_bytes(bytes(raw))
    bad = run_module("check", str(out))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert str(victim) in bad.stderr and "checksum mismatch" in bad.stderr
