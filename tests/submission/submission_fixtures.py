"""Constants the submission fixtures (conftest.py) and tests share: importable, where conftest.py is not."""

from __future__ import annotations

AUDIT_SAMPLE = "2"  # trials re-evaluated besides the best: aiperf check audits again with the same sample
SITE = {
    "submitter": "Example University",
    "system_name": "Example Cluster (CI)",
    "division": "open",
    "status": "Research, Development, or Internal (RDI)",
    "site": "Example HPC Centre",
    "location": "Exampletown, Exampleland",
    "year": 2026,
    "host_networking": "none (one node)",
    "host_networking_topology": "N/A",
    "host_storage_type": "virtual disk",
    "host_storage_capacity": "64 GB",
    "host_memory_configuration": "unknown (virtual machine)",
    "cooling": "air",
}
SYSTEM = "Example-Cluster-CI"  # the package's portable name for SITE's system_name
