"""launch/kuberay/: the RayJob manifest checked against KubeRay's own RayJob schema (no Kubernetes here).

The schema is the ``v1`` openAPIV3Schema of KubeRay's CRD ``ray.io_rayjobs.yaml`` (tests/data/kuberay/
README.md says which commit and how it was cut). Kubernetes drops fields its schema does not define
without a word; ``kubectl apply --validate=strict`` refuses them, and so does this check.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO
from jsonschema import Draft7Validator

from aiperf.cli import build_parser
from aiperf.config import load_config

KUBERAY = REPO / "launch" / "kuberay"
MANIFEST = KUBERAY / "aiperf-rayjob.yaml"
SCHEMA = REPO / "tests" / "data" / "kuberay" / "rayjob-v1.schema.json.gz"
TOKEN_AUTH_SINCE = (2, 52)  # Ray's first release with token authentication (KubeRay's authOptions needs it)


def _schema() -> dict[str, Any]:
    return json.loads(gzip.decompress(SCHEMA.read_bytes()))


def _manifest() -> dict[str, Any]:
    (doc,) = yaml.safe_load_all(MANIFEST.read_text())
    return doc


def _unknown_fields(doc: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Fields of ``doc`` that ``schema`` does not define (where it keeps no unknown fields)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(doc, list):
        items = schema.get("items", {})
        return [f for k, v in enumerate(doc) for f in _unknown_fields(v, items, f"{path}[{k}]")]
    if not isinstance(doc, dict):
        return []
    known, extra = schema.get("properties"), schema.get("additionalProperties")
    found = []
    for key, value in doc.items():
        if known is not None and key in known:
            found += _unknown_fields(value, known[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            found += _unknown_fields(value, extra, f"{path}.{key}")
        elif known is not None:
            found.append(f"{path}.{key}: a field RayJob does not have")
    return found


def rayjob_problems(doc: dict[str, Any]) -> list[str]:
    """What the API server (types, enums, required fields) and a strict client (unknown fields) would refuse."""
    schema = _schema()
    errors = Draft7Validator(schema).iter_errors(doc)  # a structural openAPIV3Schema is a JSON Schema subset
    found = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    return found + _unknown_fields(doc, schema, "")


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = doc["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster.get("workerGroupSpecs", [])]
    return [c for pod in pods for c in pod["spec"]["containers"]]


def test_the_manifest_is_a_rayjob_kuberay_accepts():
    doc = _manifest()
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    assert rayjob_problems(doc) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["spec"].update(entrypont="aiperf run"), "spec.entrypont: a field RayJob does not have"),
        (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas="two"), "'two' is not"),
        (lambda d: d["spec"]["rayClusterSpec"]["authOptions"].update(mode="tokens"), "'tokens' is not one of"),
        (lambda d: d["spec"]["rayClusterSpec"].pop("headGroupSpec"), "'headGroupSpec' is a required property"),
        (
            lambda d: _containers(d)[0]["resources"].update(limit={"cpu": "4"}),
            "resources.limit: a field RayJob does not have",
        ),
    ],
    ids=["misspelt field", "wrong type", "unknown enum value", "missing required", "misspelt nested field"],
)
def test_the_check_refuses_what_kubernetes_would(edit, expected):
    doc = copy.deepcopy(_manifest())
    edit(doc)
    found = rayjob_problems(doc)
    assert any(expected in p for p in found), found


def test_the_cluster_authenticates_with_its_own_token_and_the_file_holds_none():
    doc = _manifest()
    spec = doc["spec"]
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}, "a fresh token per cluster, made by KubeRay"
    assert spec["shutdownAfterJobFinishes"] is True, "the cluster, and the Secret it owns, go when the run ends"
    for container in _containers(doc):
        names = {e["name"] for e in container.get("env", [])}
        assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}, container["name"]
    assert not re.search(r"(?i)token\s*[:=]\s*['\"]?[0-9a-f]{16,}", MANIFEST.read_text()), "a token in the file"


def test_the_entrypoint_is_an_aiperf_run_whose_results_land_on_the_head_s_volume():
    doc = _manifest()
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv[:2] == ["aiperf", "run"]
    args = build_parser().parse_args(argv[1:])
    cfg = load_config(args.config, args.overrides)  # the config and every --set are ones aiperf accepts
    results = Path(cfg.run.results_dir)
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["name"]: Path(m["mountPath"]) for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    [name] = [n for n, p in mounts.items() if results == p or p in results.parents]
    claim = volumes[name]["persistentVolumeClaim"]["claimName"]
    pvc = yaml.safe_load((KUBERAY / "results-pvc.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"]["name"] == claim
    assert doc["spec"]["backoffLimit"] == 0, "a retry would be a new run; a killed run is resumed"
    budget = cfg.run.time_budget_s
    assert doc["spec"]["activeDeadlineSeconds"] > budget + 600, "room for start-up and teardown around the budget"


def test_the_image_the_dockerfile_builds_is_the_one_every_container_runs_at_the_clusters_ray_version():
    doc = _manifest()
    ray_version = doc["spec"]["rayClusterSpec"]["rayVersion"]
    assert tuple(int(p) for p in ray_version.split(".")[:2]) >= TOKEN_AUTH_SINCE
    dockerfile = (KUBERAY / "Dockerfile").read_text()
    [base] = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert base.startswith(f"rayproject/ray:{ray_version}-"), base
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert {c["image"] for c in _containers(doc)} == {f"aiperf:{version}"}
    assert f"-t aiperf:{version} ." in dockerfile, "the build command the Dockerfile states makes that image"
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".venv", "results", ".git"} <= ignored, "the image holds no environment, results or history"
