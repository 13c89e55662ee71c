"""The language search's starting model: ``lm.seed`` sized, or an aiperf-transformer JSON file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from aiperf.config import Config
from aiperf.errors import AiperfError
from nas.errors import NasError

if TYPE_CHECKING:
    from nas.language.spec import TransformerSpec


MAX_SPEC_FILE_BYTES = 1 << 20  # an aiperf-transformer JSON is a few hundred bytes


def lm_seed_spec(cfg: Config, vocab_size: int) -> TransformerSpec:
    """The language search's starting model: ``lm.seed`` sized, or an aiperf-transformer JSON.

    Its vocabulary must hold the data's.
    """
    import json

    from nas.language.spec import TransformerSpec

    name = cfg.lm.seed_architecture
    try:
        if name == "seed":
            s = cfg.lm.seed
            spec = TransformerSpec(
                vocab_size=vocab_size,
                seq_len=s.context,
                width=s.width,
                head_dim=s.head_dim,
                heads=(s.heads,) * s.blocks,
                mlp_hidden=(s.mlp_hidden,) * s.blocks,
            )
        else:
            try:
                spec = TransformerSpec.from_dict(json.loads(read_spec_file(Path(name))))
            except (ValueError, RecursionError) as exc:
                raise AiperfError(f"lm.seed_architecture: {name}: not valid JSON ({str(exc)[:120]})") from None
    except NasError as exc:
        raise AiperfError(f"lm.seed_architecture: {exc}") from None
    if spec.vocab_size < vocab_size:
        raise AiperfError(
            f"lm.seed_architecture: the model's vocabulary ({spec.vocab_size}) is smaller than"
            f" the data's ({vocab_size})"
        )
    return spec


def read_spec_file(path: Path, what: str = "") -> str:
    """An aiperf-transformer file's text: a regular file of at most MAX_SPEC_FILE_BYTES (a FIFO is refused unread).

    ``what`` names the file in errors (default: ``lm.seed_architecture: PATH``).
    """
    import stat

    where = what or f"lm.seed_architecture: {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise AiperfError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AiperfError(f"{where}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_SPEC_FILE_BYTES + 1)
    except OSError as exc:
        raise AiperfError(f"{where}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_SPEC_FILE_BYTES:
        raise AiperfError(f"{where}: over the {MAX_SPEC_FILE_BYTES:,}-byte limit of a transformer description")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AiperfError(f"{where}: not UTF-8 text") from None
