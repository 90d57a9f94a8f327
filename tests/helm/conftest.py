"""Shared helpers for the Helm chart tests: rendering with chosen capabilities, parsing manifests,
and the RBAC matrix printed at the end of the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from helm_python import _native

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "bouncer"
RELEASE = "bouncer"
NAMESPACE = "ops"

# What discovery reports, in Helm's VersionSet form ("group/version" and "group/version/Kind"),
# for the parts of the API the chart cares about.
V1_21 = {  # the oldest release the chart supports (batch/v1 CronJob, policy/v1)
    "kube_version": "v1.21.14",
    "api_versions": [
        "batch/v1", "batch/v1/Job", "batch/v1/CronJob", "batch/v1beta1", "batch/v1beta1/CronJob",
        "policy/v1", "policy/v1/PodDisruptionBudget",
        "coordination.k8s.io/v1", "coordination.k8s.io/v1/Lease",
    ],
}
V1_30 = {
    "kube_version": "v1.30.4",
    "api_versions": ["batch/v1", "batch/v1/Job", "batch/v1/CronJob", "policy/v1",
                     "policy/v1/PodDisruptionBudget"],
}


def render(
    values: dict[str, Any] | None = None,
    *,
    chart_dir: Path = CHART_DIR,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
    api_versions: list[str] | None = None,
) -> dict[str, str]:
    """Render the chart offline, optionally as if talking to a cluster with the given capabilities.

    helm-python-sdk 0.2.2's ``Chart.render`` only forwards name/namespace/revision/is_install/
    is_upgrade, but the library's render options also take ``kube_version`` and ``api_versions``
    (the equivalents of ``helm template --kube-version/--api-versions``), so those are passed
    through the same native call.
    """
    opts: dict[str, Any] = {"name": name, "namespace": namespace}
    if kube_version is not None:
        opts["kube_version"] = kube_version
    if api_versions is not None:
        opts["api_versions"] = api_versions
    with helm.Chart.load(chart_dir) as chart:
        out = _native.call_string(
            "helm_render", chart._raw(), json.dumps(values or {}), json.dumps(opts)
        )
    rendered: dict[str, str] = json.loads(out)
    return rendered


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in a render, in template order (NOTES.txt excluded)."""
    objects = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(rendered[path]) if doc)
    return objects


def notes(rendered: dict[str, str]) -> str:
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def objects_of(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects_of(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(cronjob: dict[str, Any]) -> dict[str, Any]:
    containers = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(cronjob: dict[str, Any]) -> dict[str, Any]:
    """Container env as name -> value (or the valueFrom object)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(cronjob)["env"]}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """A Role/ClusterRole flattened to (apiGroup, resource, verb, resourceName or '') tuples."""
    out = set()
    for rule in role.get("rules", []):
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    for rname in rule.get("resourceNames") or [""]:
                        out.add((group, resource, verb, rname))
    return out


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A throwaway copy of the chart, for tests that add files to it."""
    dest = tmp_path / "bouncer"
    shutil.copytree(CHART_DIR, dest)
    return dest


# --- the RBAC matrix, printed after the run -------------------------------------------------

MATRIX: list[dict[str, str]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not MATRIX:
        return
    cols = ["mode", "check", "namespace", "expected", "got", "ok"]
    widths = {c: max(len(c), *(len(row[c]) for row in MATRIX)) for c in cols}
    terminalreporter.section("kubectl auth can-i matrix (bouncer's ServiceAccount)")
    line = "  ".join(c.ljust(widths[c]) for c in cols)
    terminalreporter.write_line(line.rstrip())
    terminalreporter.write_line("  ".join("-" * widths[c] for c in cols))
    for row in MATRIX:
        terminalreporter.write_line("  ".join(row[c].ljust(widths[c]) for c in cols).rstrip())


# --- the live cluster's fixtures (live.py), shared by every module that needs one ---------------

from live import clusterwide, cluster, installed, metrics_api, namespaced  # noqa: E402,F401
