"""The offline text corpus for the byte-level LM: real, deterministic, split by document, windowed."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from aiperf.errors import AiperfError
from aiperf.families.language.text_corpus import load_text_corpus

# Measured on CPython 3.11.7: 582 documents, 9,476,556 bytes of text (pydoc 466 KB + stdlib 9.0 MB).
MIN_TEXT_BYTES = 5_000_000
MIN_DOCUMENTS = 300


@pytest.fixture(scope="module")
def corpus():
    return load_text_corpus("python", seed=0)


def one_line(excinfo, *fragments):
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_the_corpus_is_megabytes_of_real_text_with_a_free_end_of_document_byte(corpus):
    info = corpus.describe()
    assert info["bytes"]["train"] + info["bytes"]["val"] >= MIN_TEXT_BYTES
    assert info["documents"]["train"] + info["documents"]["val"] >= MIN_DOCUMENTS
    assert info["python_version"] == platform.python_version() and info["vocab_size"] == 256
    names = corpus.train_names + corpus.val_names
    assert any(n.startswith("pydoc/") for n in names) and any(n.startswith("stdlib/") for n in names)
    assert not any("site-packages" in n or "/test/" in n or n.startswith("stdlib/test/") for n in names)
    text = corpus.train_tokens
    assert text.dtype == np.uint8 and np.count_nonzero(text == 0) == len(corpus.train_names)  # one per document
    argparse = corpus.train_names.index("stdlib/argparse.py") if "stdlib/argparse.py" in corpus.train_names else None
    if argparse is not None:
        assert b"class ArgumentParser(" in corpus.document("train", argparse)
    assert set(info) >= {"name", "documents", "bytes", "source", "python_version", "fingerprint", "split"}


def test_documents_are_split_whole_and_disjointly_and_read_back_exactly(corpus):
    assert not set(corpus.train_names) & set(corpus.val_names)
    for split, names, offsets in (
        ("train", corpus.train_names, corpus.train_offsets),
        ("val", corpus.val_names, corpus.val_offsets),
    ):
        tokens = corpus.tokens(split)
        assert len(offsets) == len(names) + 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
        assert np.all(tokens[offsets[1:] - 1] == 0)  # each document ends with the end-of-document byte
    from pydoc_data.topics import topics

    for split, names in (("train", corpus.train_names), ("val", corpus.val_names)):
        for index, name in enumerate(names):
            if name.startswith("pydoc/"):
                assert corpus.document(split, index) == topics[name.removeprefix("pydoc/")].encode()


def test_same_seed_same_split_and_fingerprint_other_seed_other_split(corpus):
    again = load_text_corpus("python", seed=0)
    assert again.val_names == corpus.val_names and again.fingerprint() == corpus.fingerprint()
    assert np.array_equal(again.train_tokens, corpus.train_tokens)
    other = load_text_corpus("python", seed=1)
    assert other.val_names != corpus.val_names and other.fingerprint() != corpus.fingerprint()
    assert sorted(other.train_names + other.val_names) == sorted(corpus.train_names + corpus.val_names)


def test_max_bytes_is_honoured_and_samples_both_sources():
    small = load_text_corpus("python", seed=3, max_bytes=300_000)
    assert 0 < len(small.train_tokens) + len(small.val_tokens) <= 300_000
    assert len(small.train_tokens) + len(small.val_tokens) > 200_000  # the cap is filled, not just respected
    assert small.describe()["max_bytes"] == 300_000
    kinds = {n.split("/", 1)[0] for n in small.train_names + small.val_names}
    assert kinds == {"pydoc", "stdlib"}
    same_docs = load_text_corpus("python", seed=4, max_bytes=300_000)
    assert sorted(same_docs.train_names + same_docs.val_names) == sorted(small.train_names + small.val_names)
    pydoc = load_text_corpus("pydoc", max_bytes=50_000)
    assert all(n.startswith("pydoc/") for n in pydoc.train_names + pydoc.val_names)
    assert len(pydoc.train_tokens) + len(pydoc.val_tokens) <= 50_000


def test_windows_have_the_right_shapes_and_targets_are_inputs_shifted_by_one():
    corpus = load_text_corpus("pydoc", seed=0)
    x, y = corpus.train_windows(64, epoch=0, count=500)
    assert x.shape == y.shape == (500, 64) and x.dtype == np.uint8
    assert np.array_equal(x[:, 1:], y[:, :-1])
    # Each window is a slice of the training stream: find one and compare.
    stream = corpus.train_tokens.tobytes()
    assert (x[7].tobytes() + y[7, -1:].tobytes()) in stream
    x2, _ = corpus.train_windows(64, epoch=0, count=500)
    x3, _ = corpus.train_windows(64, epoch=1, count=500)
    assert np.array_equal(x, x2) and not np.array_equal(x, x3)
    default, _ = corpus.train_windows(64, epoch=0)
    assert len(default) == len(corpus.train_tokens) // 64


def test_validation_windows_are_fixed_non_overlapping_and_identical_between_calls():
    corpus = load_text_corpus("pydoc", seed=0)
    x, y = corpus.val_windows(32)
    n = len(corpus.val_tokens)
    assert x.shape == ((n - 1) // 32, 32) and np.array_equal(x[:, 1:], y[:, :-1])
    assert np.array_equal(x.reshape(-1), corpus.val_tokens[: x.size])  # tiled in order, no overlap
    again, _ = load_text_corpus("pydoc", seed=0).val_windows(32)
    assert np.array_equal(x, again)
    subset, _ = corpus.val_windows(32, max_windows=10)
    assert len(subset) == 10 and np.array_equal(subset, corpus.val_windows(32, max_windows=10)[0])
    assert all(any(np.array_equal(row, full) for full in x) for row in subset)


def test_bad_arguments_are_one_line_errors():
    for kwargs, fragment in (
        ({"name": "wikipedia"}, "unknown corpus"),
        ({"name": "pydoc", "max_bytes": 1}, "max_bytes must be"),
        ({"name": "pydoc", "max_bytes": True}, "max_bytes must be"),
        ({"name": "pydoc", "val_fraction": 1.0}, "val_fraction must be"),
        ({"name": "pydoc", "seed": -1}, "seed must be"),
        ({"name": "pydoc", "max_bytes": 100}, "at least 2 documents"),
    ):
        with pytest.raises(AiperfError) as excinfo:
            load_text_corpus(**kwargs)
        one_line(excinfo, fragment)
    corpus = load_text_corpus("pydoc", max_bytes=20_000)
    for call, fragment in (
        (lambda: corpus.train_windows(0, epoch=0), "seq_len must be"),
        (lambda: corpus.train_windows(8, epoch=-1), "epoch must be"),
        (lambda: corpus.train_windows(1 << 16, epoch=0, count=1 << 20), "ask in batches"),
        (lambda: corpus.val_windows(100_000), "no stream holds"),
    ):
        with pytest.raises(AiperfError) as excinfo:
            call()
        one_line(excinfo, fragment)
