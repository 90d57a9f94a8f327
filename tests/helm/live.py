"""The live cluster for the chart's cluster tests: kubectl, what discovery reports, and the two
releases (namespaced, with ToolHive; cluster-wide, without eviction) installed once per session,
their admission policies in force. The fixtures are registered through conftest.py.

Needs a reachable cluster (KUBECONFIG) and `kubectl` on PATH (or $KUBECTL); scripts/helm-test sets
both up from scripts/cluster. Without a cluster these tests are skipped, unless
BOUNCER_REQUIRE_CLUSTER=1, which turns the skip into a failure (CI)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

KUBECTL = os.environ.get("KUBECTL", "kubectl")
RELEASE = "bouncer"


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 60):
    proc = subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}{proc.stderr}")
    return proc


@dataclass
class Cluster:
    kube_version: str
    api_versions: list[str]

    def serves(self, api_version: str, kind: str) -> bool:
        return f"{api_version}/{kind}" in self.api_versions


def discover() -> Cluster:
    """What `helm install` would learn from discovery: group/versions and group/version/Kinds."""
    version = json.loads(kubectl("version", "-o", "json", "--request-timeout=10s").stdout)
    gvs = ["v1"]
    for group in json.loads(kubectl("get", "--raw", "/apis").stdout)["groups"]:
        gvs.extend(v["groupVersion"] for v in group["versions"])
    api_versions = []
    for gv in gvs:
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        listing = json.loads(kubectl("get", "--raw", path).stdout)
        api_versions.append(gv)
        api_versions.extend(f"{gv}/{r['kind']}" for r in listing["resources"])
    return Cluster(version["serverVersion"]["gitVersion"], sorted(set(api_versions)))


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    reason = None
    try:
        proc = kubectl("version", "-o", "json", "--request-timeout=5s", check=False, timeout=20)
        if proc.returncode != 0 or "serverVersion" not in proc.stdout:
            reason = f"no reachable cluster ({(proc.stderr or proc.stdout).strip()[:200]})"
    except FileNotFoundError:
        reason = f"{KUBECTL} is not installed"
    except subprocess.TimeoutExpired:
        reason = "the cluster did not answer within 20 s"
    if reason:
        if os.environ.get("BOUNCER_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"BOUNCER_REQUIRE_CLUSTER=1 but {reason}")
        pytest.skip(f"{reason}; start one with scripts/cluster up and run scripts/helm-test")
    return discover()


@pytest.fixture(scope="session")
def metrics_api(cluster: Cluster) -> None:
    """`kubectl auth can-i list pods.metrics.k8s.io` needs the group in discovery: the test
    cluster's metrics-server serves it through the aggregation layer."""
    deadline = time.monotonic() + 60
    while kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1", check=False).returncode != 0:
        assert time.monotonic() < deadline, "metrics.k8s.io/v1beta1 not served within 60 s"
        time.sleep(0.5)


@dataclass
class Release:
    mode: str
    namespace: str       # release namespace (ServiceAccount, CronJob, Lease)
    allowed: list[str]   # namespaces listed in rbac.namespaces (empty: cluster-wide)
    outside: str         # a namespace not in rbac.namespaces
    objects: list[dict[str, Any]]
    rendered: str

    @property
    def user(self) -> list[str]:
        sa = f"system:serviceaccount:{self.namespace}:{RELEASE}"
        return [f"--as={sa}", "--as-group=system:serviceaccounts",
                f"--as-group=system:serviceaccounts:{self.namespace}",
                "--as-group=system:authenticated"]


def to_stream(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def make_release(cluster: Cluster, mode: str, values: dict[str, Any]) -> Release:
    prefix = f"bouncer-helm-{secrets.token_hex(3)}"
    allowed = [f"{prefix}-a", f"{prefix}-b"] if mode == "namespaced" else []
    if allowed:
        values = {**values, "rbac": {"namespaces": allowed}}
    outside = f"{prefix}-x"
    for ns in [prefix, *allowed, outside]:
        kubectl("create", "namespace", ns)
    from conftest import manifests, render  # conftest imports this module

    objects = manifests(render(values, name=RELEASE, namespace=prefix,
                               kube_version=cluster.kube_version,
                               api_versions=cluster.api_versions))
    return Release(mode, prefix, allowed, outside, objects, to_stream(objects))


def delete_release(rel: Release) -> None:
    kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=rel.rendered,
            check=False)
    for ns in [rel.namespace, *rel.allowed, rel.outside]:
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)


# The two releases' modes and values.
RELEASES = {
    "namespaced": ("namespaced", {"toolhive": {"enabled": True}}),
    "clusterwide": ("cluster-wide", {"eviction": {"enabled": False}, "lease": {"name": "bouncer-cw"}}),
}


@pytest.fixture(scope="session")
def namespaced(cluster: Cluster):
    rel = make_release(cluster, *RELEASES["namespaced"])
    yield rel
    delete_release(rel)


@pytest.fixture(scope="session")
def clusterwide(cluster: Cluster):
    rel = make_release(cluster, *RELEASES["clusterwide"])
    yield rel
    delete_release(rel)


TOOLHIVE_VERSION = "v0.45.0"
TOOLHIVE_MANAGER = "bouncer-testkit-toolhive"  # the Rust tests' manager of the same CRDs


def ensure_toolhive_crds() -> None:
    """ToolHive's CRDs, for `kubectl auth can-i` on mcpservers (it resolves the resource through
    discovery) and the MCPServer admission tests: installed as the Rust tests install them
    (scripts/cluster toolhive, cached once built) when the cluster has none, and left there."""
    if kubectl("get", "crd", "mcpservers.toolhive.stacklok.dev", check=False).returncode == 0:
        return
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "cluster")
    built = subprocess.run([script, "toolhive", TOOLHIVE_VERSION], capture_output=True, text=True,
                           timeout=1800)
    assert built.returncode == 0, built.stderr[-2000:]
    crds = os.path.join(built.stdout.strip(), "crds")
    kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={TOOLHIVE_MANAGER}",
            "-f", crds, timeout=120)
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds, timeout=90)


@pytest.fixture(scope="session")
def installed(request, metrics_api):
    """Both releases, really applied, their admission policies in force."""
    ensure_toolhive_crds()
    out = {}
    for name in ("namespaced", "clusterwide"):
        rel = request.getfixturevalue(name)
        kubectl("apply", "-f", "-", stdin=rel.rendered)
        out[rel.mode] = rel
    for rel in out.values():
        wait_until_enforced(rel)
    return out


def small_deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{
                                  "name": "app", "image": "registry.k8s.io/pause:3.2",
                                  "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}}}]}}},
    }


# --- the ValidatingAdmissionPolicy: what the ServiceAccount's patches may change --------------

PAUSE_3_9 = "registry.k8s.io/pause:3.9"


def admission_policy(rel: Release) -> dict[str, Any] | None:
    return next((o for o in rel.objects if o["kind"] == "ValidatingAdmissionPolicy"), None)


def image_patch(image: str = PAUSE_3_9) -> str:
    return json.dumps({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})


def as_service_account(rel: Release, namespace: str, *args: str, stdin: str | None = None):
    return kubectl("-n", namespace, *args, *rel.user, stdin=stdin, check=False)


def denied_by_policy(proc, rel: Release) -> bool:
    policy = admission_policy(rel)
    return (policy is not None and proc.returncode != 0
            and f"ValidatingAdmissionPolicy '{policy['metadata']['name']}'" in proc.stderr)


def wait_until_enforced(rel: Release) -> None:
    """A new policy is in force once the API server's policy informer holds it: until then, probe
    with an image change as the ServiceAccount (a server dry run, which admission sees too)."""
    if admission_policy(rel) is None:
        return
    namespace = (rel.allowed or [rel.outside])[0]
    probe = small_deployment("vap-probe")
    probe["spec"]["replicas"] = 0
    kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(probe))
    deadline = time.monotonic() + 60
    while True:
        proc = as_service_account(rel, namespace, "patch", "deployment", "vap-probe",
                                  "--dry-run=server", "-p", image_patch())
        if denied_by_policy(proc, rel):
            return
        assert time.monotonic() < deadline, f"policy not in force within 60 s: {proc.stdout}{proc.stderr}"
        time.sleep(0.5)
