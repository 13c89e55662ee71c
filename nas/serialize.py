"""JSON (de)serialisation of architecture graphs, safe against malformed or hostile files.

The format is versioned (``{"format": "aiperf-graph", "version": 1, "nodes": [...]}``).
Loading never trusts the file: size, nesting, types, ids, cycles and layer sizes are all
checked and any problem becomes one :class:`NasError` line. Memory is bounded *before*
parsing: the file size is capped and so is the number of JSON values it can hold (every
value but the first in a container needs a comma, every container a bracket), so a
small file of ``[0,0,0,...]`` cannot balloon into millions of Python objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nas.errors import NasError
from nas.graph import MAX_NODES, Graph, make_node, short_repr

FORMAT = "aiperf-graph"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_FILE_BYTES = 16 << 20
# Commas plus opening brackets bound the number of JSON values; a node needs about ten.
MAX_JSON_TOKENS = 32 * MAX_NODES
MAX_NAME_CHARS = 200
_NODE_KEYS = {"id", "op", "inputs", "attrs"}


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """The JSON-ready document of ``graph`` (what :func:`graph_from_dict` reads back)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": graph.name,
        "nodes": [n.to_dict() for n in graph.nodes],
    }


def graph_from_dict(data: Any) -> Graph:
    """Validate a decoded JSON document and build the graph it describes."""
    if not isinstance(data, dict):
        raise NasError(f"architecture must be a JSON object, got {type(data).__name__}")
    fmt = data.get("format")
    if not isinstance(fmt, str) or fmt != FORMAT:
        raise NasError(f"not an architecture file: 'format' must be {FORMAT!r}, got {short_repr(fmt)}")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise NasError(f"unsupported architecture version {short_repr(version)} (supported: {SUPPORTED_VERSIONS})")
    unknown = sorted(set(data) - {"format", "version", "name", "nodes"}, key=str)
    if unknown:
        raise NasError(f"architecture: unknown key {short_repr(unknown[0])}")
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not name.isprintable() or "/" in name:
        raise NasError(
            f"architecture: 'name' must be printable text of at most {MAX_NAME_CHARS} characters without '/'"
        )
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise NasError("architecture: 'nodes' must be a non-empty list")
    if len(nodes) > MAX_NODES:
        raise NasError(f"architecture: {len(nodes)} nodes exceed the limit of {MAX_NODES}")
    built = []
    for k, raw in enumerate(nodes):
        if not isinstance(raw, dict):
            raise NasError(f"architecture: node #{k} must be an object, got {type(raw).__name__}")
        extra = sorted(set(raw) - _NODE_KEYS, key=str)
        if extra:
            raise NasError(f"architecture: node #{k} has unknown key {short_repr(extra[0])}")
        if "id" not in raw or "op" not in raw:
            raise NasError(f"architecture: node #{k} needs 'id' and 'op'")
        where = f"architecture: node #{k} (id {short_repr(raw['id'])})"
        if not isinstance(raw["op"], str):
            raise NasError(f"{where}: 'op' must be a string, got {short_repr(raw['op'])}")
        inputs = raw.get("inputs", [])
        if not isinstance(inputs, list):
            raise NasError(f"{where}: 'inputs' must be a list, got {short_repr(inputs)}")
        attrs = raw.get("attrs", {})
        if not isinstance(attrs, dict):
            raise NasError(f"{where}: 'attrs' must be an object, got {short_repr(attrs)}")
        built.append(make_node(raw["id"], raw["op"], inputs, attrs))
    return Graph(built, name=name)


def _reject_constant(token: str) -> Any:
    raise NasError(f"architecture: {token} is not a valid number")


def _count_tokens(text: str | bytes) -> int:
    """Commas and opening brackets: an upper bound on the number of values, checked before parsing."""
    if isinstance(text, str):
        return text.count(",") + text.count("[") + text.count("{")
    return text.count(b",") + text.count(b"[") + text.count(b"{")


def loads(text: str | bytes) -> Graph:
    """Parse an architecture from JSON text."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise NasError(f"architecture: expected JSON text, got {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES:
        raise NasError(f"architecture: {len(text)} bytes exceed the limit of {MAX_FILE_BYTES}")
    tokens = _count_tokens(text)
    if tokens > MAX_JSON_TOKENS:
        raise NasError(f"architecture: {tokens} JSON values exceed the limit of {MAX_JSON_TOKENS}")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except NasError:
        raise
    except RecursionError:
        raise NasError("architecture: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise NasError(f"architecture: invalid JSON ({first_line})") from None
    try:
        return graph_from_dict(data)
    except RecursionError:  # pragma: no cover - defensive; validation is iterative
        raise NasError("architecture: structure nested too deeply") from None


def dumps(graph: Graph, indent: int | None = None) -> str:
    """JSON text of ``graph`` (strict JSON: no NaN or infinities can occur in a valid graph)."""
    return json.dumps(graph_to_dict(graph), indent=indent, allow_nan=False)


def load(path: str | Path) -> Graph:
    """Read an architecture file; every failure names the file."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise NasError("not a regular file")
        with open(path, "rb") as fh:  # read at most one byte past the cap: /dev/zero stays harmless
            text = fh.read(MAX_FILE_BYTES + 1)
        if len(text) > MAX_FILE_BYTES:
            raise NasError(f"the file exceeds the limit of {MAX_FILE_BYTES} bytes")
        return loads(text)
    except NasError as exc:
        raise NasError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise NasError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise NasError(f"{path}: is a directory, not an architecture file") from None
    except OSError as exc:
        raise NasError(f"{path}: cannot read ({exc.strerror})") from None


def save(graph: Graph, path: str | Path) -> None:
    """Write ``graph`` as an architecture file that :func:`load` reads back."""
    Path(path).write_text(dumps(graph, indent=1) + "\n")
