"""The system a score was made on: measured nodes, the submitter's site file, peaks and the matmul ceiling.

``aiperf system`` writes the description (:mod:`.command`, :mod:`.description`); ``aiperf run``
records the measured part at run start and each worker's ceiling (docs/system.md). Nothing
here imports a deep-learning framework at import time.
"""

from aiperf.system.ceiling import Ceiling, measure_ceiling
from aiperf.system.kinds import NodeKind, group_nodes
from aiperf.system.node import NodeDescription, describe_node
from aiperf.system.peak import PeakFigure, accelerator_peak, cpu_peak, device_peaks
from aiperf.system.site import SiteFile, read_site

__all__ = [
    "Ceiling",
    "NodeDescription",
    "NodeKind",
    "PeakFigure",
    "SiteFile",
    "accelerator_peak",
    "cpu_peak",
    "describe_node",
    "device_peaks",
    "group_nodes",
    "measure_ceiling",
    "read_site",
]
