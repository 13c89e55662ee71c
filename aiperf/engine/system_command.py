"""``aiperf system``: measure the nodes a run would use and write the system description.

The nodes are found and measured as ``aiperf run`` finds them (Ray, a probe pinned to each
node), and only the nodes its plan would train on are described: a CPU-only head of a GPU
cluster coordinates but does not compute, so it is not part of the system being ranked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from aiperf.errors import AiperfError, os_error
from aiperf.system.kinds import NodeKind, attach_usage, group_nodes
from aiperf.system.peak import PRECISIONS, device_peaks
from aiperf.system.site import REQUIRED, SiteFile, read_site

if TYPE_CHECKING:
    from aiperf.config import Config


def measure_kinds(
    cfg: Config, address: str | None, declared: dict[str, dict[str, float]] | None = None
) -> list[NodeKind]:
    """The kinds of node the run of ``cfg`` would train on, each with its devices' peaks."""
    from aiperf.cluster.plan import make_plan
    from aiperf.cluster.ray_session import start_ray
    from aiperf.cluster.resources import cluster_nodes

    session = start_ray(address or cfg.cluster.address)
    try:
        nodes = cluster_nodes(probe=True, backend=cfg.model.backend)
    finally:
        session.shutdown()
    plan = make_plan(nodes, cfg)
    used = {s.node_id for s in plan.slots}
    missing = [n.hostname or n.node_id[:12] for n in nodes if n.node_id in used and not n.description]
    if missing:
        raise AiperfError(f"node(s) {', '.join(missing[:8])} did not answer the probe: cannot describe them", 1)
    kinds = group_nodes([(n.node_id, n.description) for n in nodes if n.node_id in used])
    attach_usage(kinds, [(s.node_id, s.cpus, s.gpus) for s in plan.slots])
    for kind in kinds:
        kind.peaks = device_peaks(kind.description, declared)
    return kinds


def _human(value: float | None, unit: str = "FLOP/s") -> str:
    from aiperf.metrics.score import format_ops

    return format_ops(value, unit) if value else "unknown"


def format_kinds(kinds: list[NodeKind]) -> list[str]:
    """One line per kind of node: what it has and its peak at float32 and bfloat16."""
    lines = []
    for k, kind in enumerate(kinds, 1):
        d = kind.description
        cpu = d.get("cpu") or {}
        accelerators = d.get("accelerators") or []
        devices = "no accelerators"
        if accelerators:
            memory = (accelerators[0].get("memory_bytes") or 0) / 2**30
            devices = f"{len(accelerators)} x {accelerators[0].get('name')} ({memory:.0f} GiB)"
        clock = f"{cpu.get('max_mhz') or 0:.0f} MHz" if cpu.get("max_mhz") else "clock unknown"
        per = "per_accelerator" if accelerators else "per_core"
        figures = kind.peaks.get(per) or {}
        peaks = ", ".join(f"{p} {_human((figures.get(p) or {}).get('flops_per_s'))}" for p in ("float32", "bfloat16"))
        lines.append(
            f"  kind {k}: {kind.count} node(s) ({', '.join(kind.hostnames[:4])}{', ...' if kind.count > 4 else ''}):"
            f" {cpu.get('sockets')} x {cpu.get('model')}, {cpu.get('cores')} cores / {cpu.get('threads')} threads,"
            f" {clock}, {cpu.get('vector_isa') or 'ISA unknown'}, {(d.get('memory_bytes') or 0) / 2**30:.1f} GiB;"
            f" {devices}; {d.get('operating_system')}; peak {per.replace('_', ' ')}: {peaks}"
        )
    return lines


def _site_fields_note() -> str:
    return f"for a complete description write a site file with {', '.join(REQUIRED)} and pass --site (docs/system.md)"


def system_command(cfg: Config, address: str | None, site_path: str | None, output: str | None) -> str:
    """Measure, combine with the site file and write ``output`` (or return the JSON); returns what to print."""
    from aiperf.ledger.files import write_atomic
    from aiperf.system.description import FORMAT, build_description, system_rpeak

    site: SiteFile | None = read_site(site_path) if site_path else None  # its errors come before any measuring
    declared = site.declared_peaks() if site else {}
    kinds = measure_kinds(cfg, address, declared)
    if site is not None:
        document = build_description(kinds, site)
    else:
        document = {"aiperf": {"format": FORMAT, "node_kinds": [k.to_dict() for k in kinds]}}
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    if output is None:
        if site is None:  # the JSON goes to stdout (a pipe, a file): what it lacks is said beside it, on stderr
            print(f"aiperf: note: measured part only; {_site_fields_note()}", file=sys.stderr)
        return text.rstrip("\n")
    path = Path(output)
    try:
        write_atomic(path, text.encode())
    except OSError as exc:
        raise os_error(exc, path, "write the system description to", exit_code=1) from None
    rpeak = system_rpeak(kinds)
    lines = [f"system: {sum(k.count for k in kinds)} node(s) the run would use, {len(kinds)} kind(s)"]
    lines += format_kinds(kinds)
    lines.append("  Rpeak (dense): " + ", ".join(f"{p} {_human(rpeak[p]['flops_per_s'])}" for p in PRECISIONS))
    if site is None:
        lines.append(f"wrote {path}: measured part only; {_site_fields_note()}")
    else:
        lines.append(f"wrote {path} (MLCommons system description fields, TOP500 fields, measured node kinds)")
    return "\n".join(lines)
