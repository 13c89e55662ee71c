"""The system description in a package: its schema, its allowed values, and whether the runs were made on it.

A list shows what the description says (nodes, accelerators, site), and the score the runs
made; the two must be about one machine. Three checks each catch a different edit:

* the schema and allowed values: MLCommons' own ``system_desc_checker`` on the file, and the
  submitter's fields re-checked by the site file's validation (:func:`aiperf.system.site.site_problems`);
* the description against itself: every MLCommons and TOP500 field that ``aiperf system``
  derives from the measured node kinds is derived again (:func:`aiperf.system.description.build_description`)
  and must be what the file says, so "number_of_nodes": "512" over one measured node is caught;
* the description against each run: the measured node kinds must be the kinds of node each
  ledger's ``run_start`` (and ``resume``) recorded and trained on -- CPU model, sockets, cores,
  memory, accelerator model and count, node count -- with the same software, so a description
  claiming 512 H100 over a ledger of two CPU slots is rejected.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from pydantic import ValidationError

from aiperf.errors import excerpt, first_line
from aiperf.ledger.schema import NodeKindHeader, SystemHeader
from aiperf.submission.layout import portable_name
from aiperf.submission.mlcommons import system_description_problems

SITE_FIELDS = (
    "submitter", "system_name", "division", "status", "host_networking", "host_networking_topology",
    "host_storage_type", "host_storage_capacity", "host_memory_configuration", "cooling",
    "host_processor_interconnect", "accelerator_on-chip_memories", "hw_notes", "sw_notes",
)  # fmt: skip
OVERRIDE_FIELDS = (  # measured, but a site file may replace them: whatever the file says stands
    "accelerator_host_interconnect",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "accelerator_memory_configuration",
)
TOP500_SITE_FIELDS = ("site", "location", "year", "manufacturer", "segment")
MEMORY_TOLERANCE = 0.02  # host memory differs by megabytes between two measurements of one machine


# A node kind as JSON (NodeKindHeader's shape, which both sides were checked against or dumped from):
# the fields compared here. A description's kind may leave any of them out, and a value may be null.
class _CpuDoc(TypedDict, total=False):
    model: str | None
    sockets: int | None
    cores: int | None
    threads: int | None


class _AcceleratorDoc(TypedDict, total=False):
    name: str | None
    memory_bytes: float | None
    driver: str | None


class _DescriptionDoc(TypedDict, total=False):
    cpu: _CpuDoc | None
    memory_bytes: float | None
    accelerators: list[_AcceleratorDoc]
    operating_system: str | None
    kernel: str | None
    software: dict[str, str]


class NodeKindDoc(TypedDict, total=False):
    """A measured kind of node (``aiperf.node_kinds`` of a description, or a ledger's ``system.kinds``)."""

    count: int
    description: _DescriptionDoc
    used_accelerators: int
    used_cores: int


def site_of(description: Mapping[str, object]) -> dict[str, object]:
    """The site file a description was made from, read back from its fields."""
    found_top500, found_ours = description.get("top500"), description.get("aiperf")
    top500: Mapping[str, object] = found_top500 if isinstance(found_top500, dict) else {}
    ours: Mapping[str, object] = found_ours if isinstance(found_ours, dict) else {}
    site = {k: description[k] for k in (*SITE_FIELDS, *OVERRIDE_FIELDS) if k in description}
    site |= {k: top500[k] for k in TOP500_SITE_FIELDS if k in top500}
    if site.get("manufacturer") == "unknown":  # what build_description writes for a site that named none
        site["manufacturer"] = ""
    if ours.get("notes"):
        site["notes"] = ours["notes"]
    if ours.get("declared_peak"):
        site["declared_peak"] = ours["declared_peak"]
    return site


def node_kinds(description: Mapping[str, object]) -> tuple[list[NodeKindDoc], list[str]]:
    """The measured kinds of node (``aiperf.node_kinds``), each checked against the ledger's shape for them."""
    from aiperf.system.description import FORMAT

    ours = description.get("aiperf")
    if not isinstance(ours, dict) or ours.get("format") != FORMAT:
        return [], [f"aiperf.format is not {FORMAT!r}: not a description written by aiperf system"]
    kinds = ours.get("node_kinds")
    if not isinstance(kinds, list) or not kinds:
        return [], ["aiperf.node_kinds is empty: no measured node"]
    problems = []
    for k, kind in enumerate(kinds):
        try:
            NodeKindHeader.model_validate(kind)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            problems.append(f"aiperf.node_kinds[{k}].{where}: {err['msg']}")
    # Each one checked against NodeKindHeader: of the shape NodeKindDoc names.
    return (cast(list[NodeKindDoc], kinds) if not problems else []), problems


def derived_problems(description: Mapping[str, object], kinds: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every field ``aiperf system`` derives from the node kinds, derived again and compared.

    The kinds' fields go to :class:`~aiperf.system.kinds.NodeKind` as they are (pydantic checked their shape).
    """
    from aiperf.system.description import build_description
    from aiperf.system.kinds import NodeKind
    from aiperf.system.site import SiteFile

    site = SiteFile.model_validate(site_of(description))
    names = ("count", "nodes", "hostnames", "description", "used_accelerators", "used_cores", "peaks")
    rebuilt = build_description([NodeKind(**{n: k[n] for n in names if n in k}) for k in kinds], site)
    derived = json.loads(json.dumps(rebuilt))
    derived.pop("aiperf", None)
    return [
        f"{key} says {excerpt(given)} but its measured node kinds give {excerpt(value)}"
        for key, given, value in _differences(description, derived)
    ]


def _differences(given: object, derived: object, path: str = "") -> list[tuple[str, object, object]]:
    """``(dotted key, given, derived)`` for every leaf of ``derived`` that ``given`` does not have alike."""
    if isinstance(derived, dict):
        if not isinstance(given, dict):
            return [(path, given, derived)]
        out = []
        for key, value in derived.items():
            out += _differences(given.get(key), value, f"{path}.{key}" if path else key)
        return out
    return [] if given == derived and type(given) is type(derived) else [(path, given, derived)]


def description_problems(path: Path, description: object, system: str) -> list[str]:
    """Everything wrong with one ``systems/<system>.json`` on its own (each line without the file name)."""
    from aiperf.system.site import site_problems

    if not isinstance(description, dict):
        return ["not a JSON object"]
    problems = system_description_problems(path)
    site_problem = site_problems(site_of(description))
    if site_problem is not None:
        problems.append(f"the submitter's fields: {site_problem}")
    kinds, kind_problems = node_kinds(description)
    problems += kind_problems
    if kinds and site_problem is None:
        try:
            problems += derived_problems(description, kinds)
        except (ValidationError, TypeError, ValueError, KeyError, AttributeError) as exc:
            problems.append(f"its measured node kinds cannot be read ({first_line(exc)})")
    name = description.get("system_name")
    if isinstance(name, str) and portable_name(name) != system:
        problems.append(f"system_name {excerpt(name)} does not give the file's name {system!r}")
    return problems


# --- the description against a ledger ----------------------------------------------------------


def _gib(value: object) -> float:
    return float(value) / 2**30 if isinstance(value, (int, float)) else 0.0


def hardware(kind: NodeKindDoc) -> dict[str, object]:
    """What makes a kind of node the machine it is (host memory compared apart, within a tolerance)."""
    d = kind.get("description") or {}
    cpu = d.get("cpu") or {}
    accelerators = d.get("accelerators") or []
    names = Counter(str(a.get("name")) for a in accelerators)
    return {
        "cpu": cpu.get("model"),
        "sockets": cpu.get("sockets"),
        "cores": cpu.get("cores"),
        "threads": cpu.get("threads"),
        "accelerators": ", ".join(f"{n} x {name}" for name, n in sorted(names.items())) or "none",
        "accelerator memory GiB": sorted(round(_gib(a.get("memory_bytes"))) for a in accelerators),
    }


def software(kind: NodeKindDoc) -> dict[str, object]:
    """The software a kind of node ran: package versions, operating system, kernel, accelerator drivers."""
    d = kind.get("description") or {}
    out: dict[str, object] = dict(d.get("software") or {})
    out["operating system"] = d.get("operating_system")
    out["kernel"] = d.get("kernel")
    out["accelerator driver"] = sorted({str(a.get("driver")) for a in d.get("accelerators") or []})
    return out


def describe_kind(kind: NodeKindDoc) -> str:
    """``2 node(s): 2 x AMD EPYC 7B13 (2 cores, 24 GiB), accelerators none, 2 used``: a kind in a finding."""
    h = hardware(kind)
    memory = _gib((kind.get("description") or {}).get("memory_bytes"))
    used = kind.get("used_accelerators") or 0
    devices = f"accelerators {h['accelerators']}" + (f" ({used} trained on)" if used else "")
    host = f"{h['sockets']} x {h['cpu']} ({h['cores']} cores, {memory:.0f} GiB)"
    return f"{kind.get('count')} node(s) of {host}, {devices}"


def _memory_agrees(a: NodeKindDoc, b: NodeKindDoc) -> bool:
    x, y = (_gib((k.get("description") or {}).get("memory_bytes")) for k in (a, b))
    return abs(x - y) <= max(1.0, MEMORY_TOLERANCE * max(x, y))


def _used(kind: NodeKindDoc) -> bool:
    return bool(kind.get("used_accelerators") or kind.get("used_cores"))


def agreement_problems(kinds: list[NodeKindDoc], header: SystemHeader, run: str, system_file: str) -> list[str]:
    """Whether the description's node kinds are the kinds ``header`` recorded and trained on, with their software."""
    recorded = [cast(NodeKindDoc, k.model_dump()) for k in header.kinds]
    if not recorded:
        return [
            f"{run}: its ledger records no measured system (written before 2026-11-25, or simulated), "
            f"so {system_file} cannot be checked against it"
        ]
    trained = [k for k in recorded if _used(k)] or recorded
    problems: list[str] = []
    unmatched, undescribed = list(trained), []
    for kind in kinds:
        match = next((r for r in unmatched if hardware(r) == hardware(kind) and _memory_agrees(r, kind)), None)
        if match is None:
            undescribed.append(kind)
            continue
        unmatched.remove(match)
        if match.get("count") != kind.get("count") or (match.get("used_accelerators") or 0) != (
            kind.get("used_accelerators") or 0
        ):
            problems.append(
                f"{system_file} describes {describe_kind(kind)} but {run}'s ledger recorded {describe_kind(match)}"
            )
        theirs, ours = software(match), software(kind)
        for key in sorted(set(theirs) | set(ours)):
            if theirs.get(key) != ours.get(key):
                problems.append(
                    f"{system_file} says {key} {excerpt(ours.get(key))} but {run}'s ledger recorded "
                    f"{excerpt(theirs.get(key))}"
                )
    if unmatched or undescribed:
        claim = "; ".join(describe_kind(k) for k in kinds)
        truth = "; ".join(describe_kind(k) for k in trained)
        problems.append(f"{system_file} describes {claim} but {run}'s ledger recorded {truth}: not the same machine")
    return problems
