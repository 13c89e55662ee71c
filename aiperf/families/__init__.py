"""Workload families: what a run trains (image classifiers, language models), one subpackage each.

Each family owns its architectures' preparation and operation counting, its trainer, its data
and its model builder; the master, the workers and the readers ask the run's family through
:class:`~aiperf.families.base.Family` and never branch on which one it is. :func:`family_for`
is the registry: a config's ``family`` (or a run header's) names one of :data:`FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Callable

from aiperf.families.base import Family, FamilyName, Prepared

__all__ = ["FAMILIES", "Family", "FamilyName", "Prepared", "family_for"]


def _image() -> Family:
    from aiperf.families.image.family import ImageFamily

    return ImageFamily()


def _language() -> Family:
    from aiperf.families.language.family import LanguageFamily

    return LanguageFamily()


FAMILIES: dict[str, Callable[[], Family]] = {"image": _image, "language": _language}


def family_for(name: str) -> Family:
    """The family a config (``Config.family``) or a run header (``run_start.family``) names."""
    make = FAMILIES.get(name)
    if make is None:
        raise ValueError(f"unknown architecture family {name!r}")
    return make()
