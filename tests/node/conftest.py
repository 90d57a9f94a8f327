"""Helpers for the tests on the real node (scripts/node-test runs them): kubectl against the node's
control plane, the leaky app's Deployment, the chart installed with Helm's engine, and the memory
that metrics-server reports for a pod (the real kubelet's measure of its working set)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "bouncer"
KUBECTL = os.environ.get("KUBECTL", "kubectl")
NODE = "real-node"
TAINT_KEY = "bouncer.dev/real-node"
# What lands on the real node: tolerate its taint, ask for it, never pull.
ON_NODE = {
    "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"kubernetes.io/hostname": NODE},
}
MIB = 1024 * 1024


def image(name: str) -> str:
    """An image scripts/image built and scripts/node-test imported (BOUNCER_IMAGE_<NAME>)."""
    ref = os.environ.get(f"BOUNCER_IMAGE_{name.upper()}")
    if not ref:
        pytest.fail(f"BOUNCER_IMAGE_{name.upper()} is not set: run these tests with scripts/node-test")
    return ref


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 60):
    proc = subprocess.run([KUBECTL, "--request-timeout=20s", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}{proc.stderr}")
    return proc


def get(*args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(kubectl("get", *args, "-o", "json").stdout)
    return out


def wait_until(what: str, seconds: float, probe: Callable[[], Any], every: float = 1.0) -> Any:
    """Polls `probe` until it returns something truthy; fails with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(every)


def parse_quantity(q: str) -> int:
    units = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB, "k": 1000, "M": 1000**2, "G": 1000**3}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * factor)
    return int(q)


def pod_memory(namespace: str, pod: str) -> int | None:
    """The pod's working set in bytes as metrics.k8s.io reports it, or None while it has none."""
    proc = kubectl("get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{pod}",
                   check=False)
    if proc.returncode != 0:
        return None
    metrics = json.loads(proc.stdout)
    return sum(parse_quantity(c["usage"]["memory"]) for c in metrics["containers"])


def leaky_deployment(name: str, namespace: str, *, mib_per_step: int, step_seconds: int = 1,
                     limit: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "leaky", "image": image("leaky"), "imagePullPolicy": "Never",
        "args": [str(mib_per_step), str(step_seconds)],
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if limit:
        container["resources"] = {"limits": {"memory": limit}, "requests": {"memory": limit}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {**ON_NODE, "terminationGracePeriodSeconds": 5,
                         "enableServiceLinks": False, "automountServiceAccountToken": False,
                         "containers": [container]},
            },
        },
    }


def running_pods(namespace: str, app: str) -> list[dict[str, Any]]:
    pods = get("pods", "-n", namespace, "-l", f"app={app}")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


@pytest.fixture(scope="session")
def cluster() -> None:
    proc = kubectl("get", "node", NODE, "-o", "json", check=False)
    if proc.returncode != 0:
        pytest.fail(f"no node {NODE}: run these tests with scripts/node-test ({proc.stderr.strip()})")
    ready = [c for c in json.loads(proc.stdout)["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", f"node {NODE} is not Ready: {ready}"


@pytest.fixture
def namespace(cluster: None) -> Iterator[str]:
    """A fresh namespace, deleted (with everything in it) afterwards."""
    ns = f"node-{secrets.token_hex(3)}"
    kubectl("create", "namespace", ns)
    yield ns
    kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def helm_release(cluster: None) -> Iterator[Callable[[str, dict[str, Any]], dict[str, Any]]]:
    """Installs helm/bouncer with Helm's own engine (helm-python-sdk: `helm install`), uninstalled
    afterwards."""
    import helm_python as helm

    installed: list[tuple[Any, str]] = []

    def install(namespace: str, values: dict[str, Any]) -> dict[str, Any]:
        cfg = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
        release: dict[str, Any] = cfg.install(str(CHART_DIR), "bouncer", values,
                                              namespace=namespace, timeout=60)
        installed.append((cfg, namespace))
        return release

    yield install
    for cfg, _ in installed:
        try:
            cfg.uninstall("bouncer", ignore_not_found=True, timeout=60)
        finally:
            cfg.close()
