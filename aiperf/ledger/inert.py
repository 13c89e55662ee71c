"""Text from a ledger, a config or a run directory, made inert before a terminal or a page shows it.

A ledger, a summary, a config, an audit file or a folder name is written by whoever wrote the
file, and a terminal obeys what it prints: an escape sequence erases a line, a carriage return
goes back to its start, a bidirectional override reverses what follows, a line separator or a
zero-width character hides text. An injected ``\\rverified`` would read as aiperf's own word.
:func:`inert` shows each such character as a visible escape (``\\x1b``, ``\\r``, ``\\u202e``)
and leaves every other character -- accents, CJK, emoji, a backslash -- as it is.

What is escaped: Unicode categories ``Cc`` (C0 controls with TAB, LF and CR, DEL, C1 controls),
``Cf`` (format characters: the bidirectional controls U+202A-U+202E, U+2066-U+2069, U+200E,
U+200F, U+061C, zero-width characters, the BOM, tag characters), ``Zl`` and ``Zp`` (U+2028,
U+2029) and ``Cs`` (a lone surrogate, which JSON can carry and no terminal encoding can
write). :func:`inert_lines` does the same but keeps line feeds and tabs, for a multi-line block
aiperf composed itself; a single field must go through :func:`inert`, or a line feed inside it
would print as a line of aiperf's own.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import TypeVar, cast

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

T = TypeVar("T")


def escape_char(char: str) -> str:
    """One character as the escape Python would write in a string literal (``\\x1b``, ``\\u202e``)."""
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _hidden(char: str) -> bool:
    return not char.isprintable() and unicodedata.category(char) in HIDDEN_CATEGORIES


def inert(text: object) -> str:
    """``text`` (``str()`` of anything else) on one line, with every control or format character escaped."""
    text = "" if text is None else str(text)
    if text.isprintable():  # the common case: nothing to escape (printable excludes every hidden category)
        return text
    return "".join(escape_char(c) if _hidden(c) else c for c in text)


def inert_lines(text: object, keep: str = "\n\t") -> str:
    """As :func:`inert`, but the characters in ``keep`` (line feed and tab) stay: a block aiperf laid out."""
    text = "" if text is None else str(text)
    if text.isprintable():
        return text
    return "".join(escape_char(c) if c not in keep and _hidden(c) else c for c in text)


def inert_tree(value: T) -> T:
    """``value`` with every string in it, dictionary keys included, passed through :func:`inert`.

    For a structure read from a file (a summary, a ledger record) about to be formatted field by
    field: numbers, booleans and ``None`` stay what they are, so formatting them is unchanged.
    """
    return cast(T, _inert_any(value))


def _inert_any(value: object) -> object:
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, Mapping):
        return {_inert_any(k): _inert_any(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_inert_any(v) for v in value]
    if type(value) is tuple:  # a named tuple keeps its own fields
        return tuple(_inert_any(v) for v in value)
    return value
