"""The data of a language run as the head loads it: what it records, and the settings it refuses."""

from __future__ import annotations

import pytest

from aiperf.config import load_config
from aiperf.errors import AiperfError
from aiperf.families.language.data import load_language_data


def test_the_embedded_corpus_is_described_by_its_tokens_and_fingerprint():
    cfg = load_config("llm", ["lm.max_bytes=200000"])
    data = load_language_data(cfg)
    header = data.describe()
    corpus = data.corpus
    assert corpus is not None
    assert (header["train_tokens"], header["eval_tokens"]) == (len(corpus.train_tokens), len(corpus.val_tokens))
    assert header["train_tokens"] + header["eval_tokens"] <= 200_000 + 1_000  # documents' end bytes beside the text
    assert (header["tokenizer"], header["vocab_size"], header["bytes_per_token"]) == ("bytes", 256, 1.0)
    assert data.fingerprint() == corpus.fingerprint() and not data.streaming
    assert data.windows() is corpus  # carried to the workers as it is


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dataset.path=/tmp"], "dataset.path: text is the corpus Python carries"),
        (["lm.bytes_per_token=2"], "lm.bytes_per_token: the text corpus is byte-level"),
        (["dataset.max_train_images=10"], "dataset.max_train_images: text holds text"),
        (["cluster.placement=per_node"], "cluster.placement: per_node"),
        (["dataset.name=token_shards"], "dataset.path: token_shards needs the converted folder"),
        (["dataset.name=token_shards", "dataset.path=/nonexistent"], "token shards: /nonexistent: folder not found"),
        (["dataset.name=token_shards", "dataset.path=/tmp", "lm.max_bytes=5000"], "lm.max_bytes: only the text"),
    ],
)
def test_settings_a_language_run_cannot_honour_are_refused_in_one_line(overrides, message):
    with pytest.raises(AiperfError, match=message.replace(".", r"\.")):
        load_language_data(load_config("llm", overrides))
