"""What only a person knows about a system: the site file a submitter writes (``aiperf system --site``).

Field names are MLCommons' system description names where MLCommons has the field, and
TOP500's (site, location, year, manufacturer, segment) where only TOP500 has it. A file is
checked whole: every unknown field, every missing required one and every wrong value is
named in one line, so a submitter fixes the file in one pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aiperf.errors import AiperfError, excerpt
from aiperf.ledger.files import read_regular

MAX_SITE_BYTES = 64 * 1024
# FLOP/s per device: above zero, finite, and under 10^20 (a hundred thousand times an H200's dense bf16).
PositivePeak = Annotated[float, Field(gt=0, lt=1e20, allow_inf_nan=False)]
# MLCommons training rulesets from 4.0 accept only these availability values (system_desc_checker).
STATUSES = ("Available on-premise", "Available cloud", "Research, Development, or Internal (RDI)", "Preview")
DIVISIONS = ("closed", "open")
SEGMENTS = ("Research", "Academic", "Industry", "Vendor", "Government", "Others")


def _text() -> Any:
    """A required line of text (its own FieldInfo per field)."""
    return Field(min_length=1, max_length=1000)


class SiteFile(BaseModel):
    """The submitter's part of a system description; required fields have no default."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, allow_inf_nan=False)

    submitter: str = _text()
    system_name: str = _text()
    division: Literal["closed", "open"]
    status: Literal["Available on-premise", "Available cloud", "Research, Development, or Internal (RDI)", "Preview"]
    site: str = _text()  # TOP500: the centre that operates the system
    location: str = _text()  # city and country
    year: int = Field(ge=1990, le=2100)  # TOP500: year of installation
    host_networking: str = _text()  # the node interconnect, e.g. "InfiniBand NDR 400 Gb/s"
    host_networking_topology: str = _text()  # e.g. "fat tree, non-blocking"
    host_storage_type: str = _text()
    host_storage_capacity: str = _text()
    host_memory_configuration: str = _text()  # e.g. "16 x 64 GB DDR5-4800"
    cooling: str = _text()
    manufacturer: str = Field("", max_length=1000)
    segment: Literal["Research", "Academic", "Industry", "Vendor", "Government", "Others"] | None = None
    host_processor_interconnect: str = Field("", max_length=1000)
    accelerator_host_interconnect: str | None = Field(None, max_length=1000)  # replaces the measured PCIe link
    accelerator_interconnect: str | None = Field(None, max_length=1000)  # replaces the measured NVLink count
    accelerator_interconnect_topology: str | None = Field(None, max_length=1000)
    accelerator_memory_configuration: str | None = Field(None, max_length=1000)
    accelerator_on_chip_memories: str = Field("", max_length=1000, alias="accelerator_on-chip_memories")
    hw_notes: str = Field("", max_length=4000)
    sw_notes: str = Field("", max_length=4000)
    notes: str = Field("", max_length=4000)
    # Device model as `aiperf system` reports it -> precision -> FLOP/s per device (per core for a CPU).
    # Positive and finite: a zero, negative or infinite peak would rank first or vanish from the efficiency.
    declared_peak: dict[str, dict[Literal["float32", "bfloat16", "float16"], PositivePeak]] = {}

    def declared_for(self, device: str) -> dict[str, float]:
        return {str(p): float(v) for p, v in self.declared_peak.get(device, {}).items()}

    def declared_peaks(self) -> dict[str, dict[str, float]]:
        """``declared_peak`` as plain mappings: device -> precision -> FLOP/s."""
        return {device: self.declared_for(device) for device in self.declared_peak}


REQUIRED = tuple(
    (f.alias or name) for name, f in SiteFile.model_fields.items() if f.is_required()
)  # listed in docs/system.md


def _what(error: dict[str, object]) -> str:
    msg = str(error.get("msg", "")).replace("Input should be", "must be")
    msg = msg[:1].lower() + msg[1:]
    got = error.get("input")
    if isinstance(got, (dict, list)) or got is None:
        return msg
    return f"{msg} (got {excerpt(got)})"


def site_problems(data: object) -> str | None:
    """Everything wrong with a parsed site file, as one line, or None."""
    if not isinstance(data, dict):
        return "the top level must be a mapping of field: value"
    try:
        SiteFile.model_validate(data)
    except ValidationError as exc:
        unknown, missing, wrong = [], [], []
        for err in exc.errors():
            where = ".".join(
                str(p) if isinstance(p, (int, str)) and len(str(p)) <= 60 else excerpt(p) for p in err["loc"]
            )
            if err["type"] == "extra_forbidden":
                unknown.append(where)
            elif err["type"] == "missing":
                missing.append(where)
            else:
                wrong.append(f"{where}: {_what(dict(err))}")
        parts = []
        if unknown:
            parts.append(f"unknown field(s): {', '.join(unknown)}")
        if missing:
            parts.append(f"missing required field(s): {', '.join(missing)}")
        parts.extend(wrong)
        return "; ".join(parts)
    return None


def parse_site(data: object, source: object = "the site file") -> SiteFile:
    """A validated :class:`SiteFile`; :class:`AiperfError` lists every problem at once."""
    problem = site_problems(data)
    if problem is not None:
        raise AiperfError(f"{source}: {problem}")
    return SiteFile.model_validate(data)


def read_site(path: str | Path) -> SiteFile:
    """Read and check a site YAML (a regular file of at most 64 KiB; anchors and aliases refused)."""
    from aiperf.config import parse_yaml

    shown = excerpt(os.fspath(path), 200) if not os.fspath(path).isprintable() else os.fspath(path)
    try:
        raw = read_regular(path, MAX_SITE_BYTES)  # a FIFO or device is refused without reading
        if len(raw) > MAX_SITE_BYTES:
            raise AiperfError(f"site file {shown}: too large (more than {MAX_SITE_BYTES:,} bytes)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise AiperfError(f"site file {shown}: no such file") from None
    except UnicodeDecodeError:
        raise AiperfError(f"site file {shown}: not a text (UTF-8) file") from None
    except OSError as exc:
        raise AiperfError(f"site file {shown}: cannot read ({exc.strerror})") from None
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise AiperfError(f"site file {shown}: not valid YAML{where}") from None
    return parse_site(data, f"site file {shown}")
