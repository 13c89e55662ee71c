"""The data of a language-model run: the embedded text corpus, or a folder of token shards.

The image workloads hand every worker a :class:`~aiperf.datasets.base.Dataset`; a language run
hands it a :class:`LanguageData` instead. The embedded corpus (``dataset.name: text``, text
every Python installation carries, docs/lm-data.md) is small enough (about 9.5 MB) to travel
to the workers with the worker's start-up, as the built-in image datasets do; a token-shard
folder (``dataset.name: token_shards``) stays where it is and each worker opens it from the
site path, as the streamed ImageNet does: a node that cannot read it fails at start-up, once,
naming the folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiperf.errors import AiperfError

if TYPE_CHECKING:
    from aiperf.config import Config
    from aiperf.families.language.text_corpus import TextCorpus
    from aiperf.families.language.trainer import LMData


@dataclass
class LanguageData:
    """A language workload's tokens: what the run header records and what each worker trains from."""

    name: str
    source: str
    vocab_size: int
    tokenizer: str
    bytes_per_token: float
    train_tokens: int
    val_tokens: int
    fingerprint_hex: str
    facts: dict[str, object]  # the loader's other facts, recorded as they are
    corpus: TextCorpus | None = None  # the embedded corpus, carried to the workers
    shards: str | None = None  # a token-shard folder each worker opens
    split_seed: int = 0

    @property
    def streaming(self) -> bool:
        """Read from a site path on every node (token shards), not carried in memory."""
        return self.shards is not None

    @property
    def train_size(self) -> int:
        return self.train_tokens

    @property
    def val_size(self) -> int:
        return self.val_tokens

    def fingerprint(self) -> str:
        return self.fingerprint_hex

    def describe(self) -> dict[str, Any]:  # spread into DatasetHeader(**...), whose fields differ in type
        """The run header's dataset section (DatasetHeader fields; the rest of the facts ride along)."""
        return {
            **self.facts,
            "name": self.name,
            "source": self.source,
            "storage": "stream" if self.streaming else "memory",
            "streaming": self.streaming,
            "train_tokens": self.train_tokens,
            "eval_tokens": self.val_tokens,
            "vocab_size": self.vocab_size,
            "tokenizer": self.tokenizer,
            "bytes_per_token": self.bytes_per_token,
        }

    def windows(self) -> LMData:
        """What the LM trainer reads: the corpus itself, or the shard folder opened here (on the worker)."""
        if self.corpus is not None:
            return self.corpus
        from aiperf.families.language.token_shards import open_token_folder
        from aiperf.families.language.trainer import ShardWindows

        assert self.shards is not None
        folder = open_token_folder(self.shards, verify=False)  # the head verified every checksum at load
        if folder.manifest.get("tokenizer") == "bytes":
            return ShardWindows(folder, seed=self.split_seed)
        return ShardWindows(folder, seed=self.split_seed, bytes_per_token=self.bytes_per_token)


def load_language_data(cfg: Config) -> LanguageData:
    """The configured language data, checked on the head before anything starts (one-line errors)."""
    from aiperf.families.language.text_corpus import load_text_corpus

    d = cfg.dataset
    if cfg.cluster.placement == "per_node":
        raise AiperfError(
            "cluster.placement: per_node trains each trial data-parallel over a node's GPUs, which the language-model"
            " trainer does not do yet; use per_accelerator (one trial per GPU) or fractional"
        )
    for key in ("image_size", "max_train_images"):
        if getattr(d, key) is not None:
            raise AiperfError(f"dataset.{key}: {d.name} holds text, not images; remove it")
    if d.name == "text":
        if d.path is not None:
            raise AiperfError("dataset.path: text is the corpus Python carries and reads no path; remove dataset.path")
        if cfg.lm.bytes_per_token is not None:
            raise AiperfError("lm.bytes_per_token: the text corpus is byte-level (1 byte per token); remove it")
        corpus = load_text_corpus(cfg.lm.corpus, seed=d.split_seed, max_bytes=cfg.lm.max_bytes)
        facts = corpus.describe()
        return LanguageData(
            name=facts["name"],
            source=corpus.source,
            vocab_size=corpus.vocab_size,
            tokenizer=corpus.tokenizer,
            bytes_per_token=1.0,
            train_tokens=len(corpus.train_tokens),
            val_tokens=len(corpus.val_tokens),
            fingerprint_hex=facts["fingerprint"],
            facts=_header_facts(facts),
            corpus=corpus,
            split_seed=d.split_seed,
        )
    if d.name != "token_shards":
        raise AiperfError(f"dataset.name: {d.name} is not a language dataset")
    if d.path is None:
        raise AiperfError("dataset.path: token_shards needs the converted folder (docs/lm-data.md)")
    if cfg.lm.max_bytes is not None:
        raise AiperfError("lm.max_bytes: only the text corpus is cut to a size; remove it for token_shards")
    from aiperf.families.language.token_shards import open_token_folder

    folder = open_token_folder(d.path, verify=True)
    folder_facts = folder.describe()
    tokenizer = str(folder.manifest["tokenizer"])
    per_token = cfg.lm.bytes_per_token
    if tokenizer == "bytes":
        if per_token not in (None, 1.0):
            raise AiperfError(f"lm.bytes_per_token: {d.path} is byte-level (1 byte per token); remove it")
        per_token = 1.0
    elif per_token is None:
        raise AiperfError(
            f"lm.bytes_per_token: {d.path} uses tokenizer {tokenizer!r}; give its text bytes per token to report"
            " bits per byte"
        )
    return LanguageData(
        name="token_shards",
        source=str(folder.root),
        vocab_size=folder.vocab_size,
        tokenizer=tokenizer,
        bytes_per_token=float(per_token),
        train_tokens=folder.train.tokens,
        val_tokens=folder.val.tokens,
        fingerprint_hex=folder_facts["fingerprint"],
        facts=_header_facts(folder_facts),
        shards=str(folder.root),
        split_seed=d.split_seed,
    )


def _header_facts(facts: Mapping[str, object]) -> dict[str, object]:
    """The loader's description less what the header holds under its own names."""
    return {k: v for k, v in facts.items() if k not in ("tokens", "fingerprint", "vocab_size", "tokenizer")}
