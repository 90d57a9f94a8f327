"""The chart against a live cluster: the manifests rendered for the server's own capabilities pass a
server-side dry run, install, and give bouncer's ServiceAccount exactly the access it needs
(checked with `kubectl auth can-i` as that ServiceAccount).

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

from conftest import MATRIX, manifests, render

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
    objects = manifests(render(values, name=RELEASE, namespace=prefix,
                               kube_version=cluster.kube_version,
                               api_versions=cluster.api_versions))
    return Release(mode, prefix, allowed, outside, objects, to_stream(objects))


def delete_release(rel: Release) -> None:
    kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=rel.rendered,
            check=False)
    for ns in [rel.namespace, *rel.allowed, rel.outside]:
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(scope="module")
def namespaced(cluster: Cluster):
    rel = make_release(cluster, "namespaced", {"toolhive": {"enabled": True}})
    yield rel
    delete_release(rel)


@pytest.fixture(scope="module")
def clusterwide(cluster: Cluster):
    rel = make_release(cluster, "cluster-wide", {"eviction": {"enabled": False},
                                                 "lease": {"name": "bouncer-cw"}})
    yield rel
    delete_release(rel)


@pytest.fixture(scope="module")
def installed(request, metrics_api):
    """Both releases, really applied."""
    out = {}
    for name in ("namespaced", "clusterwide"):
        rel = request.getfixturevalue(name)
        kubectl("apply", "-f", "-", stdin=rel.rendered)
        out[rel.mode] = rel
    return out


# --- server-side checks of the manifests ------------------------------------------------------


@pytest.mark.parametrize("mode", ["namespaced", "clusterwide"])
def test_manifests_pass_server_side_dry_run(request, cluster: Cluster, mode: str):
    rel: Release = request.getfixturevalue(mode)
    cronjob = next(o for o in rel.objects if o["kind"] == "CronJob")
    assert cluster.serves(cronjob["apiVersion"], "CronJob"), cronjob["apiVersion"]
    proc = kubectl("apply", "--dry-run=server", "-f", "-", stdin=rel.rendered)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == len(rel.objects), proc.stdout
    assert all(line.endswith("(server dry run)") for line in lines), proc.stdout
    # Nothing was written.
    got = kubectl("get", "cronjobs", "-n", rel.namespace, "-o", "name").stdout
    assert got.strip() == ""


def test_a_job_created_from_the_cronjob_runs_as_configured(installed):
    """NOTES' "run now" command works, and the API server keeps the hardened pod spec."""
    rel = installed["namespaced"]
    job = f"{RELEASE}-manual-{secrets.token_hex(2)}"
    kubectl("-n", rel.namespace, "create", "job", f"--from=cronjob/{RELEASE}", job)
    deadline = time.monotonic() + 60
    pod = None
    while time.monotonic() < deadline:
        pods = json.loads(kubectl("-n", rel.namespace, "get", "pods", "-l", f"job-name={job}",
                                  "-o", "json").stdout)["items"]
        if pods and pods[0]["spec"].get("nodeName"):
            pod = pods[0]
            break
        time.sleep(1)
    assert pod, f"no scheduled pod for job {job} within 60 s"
    spec = pod["spec"]
    assert spec["serviceAccountName"] == RELEASE
    assert spec["securityContext"]["runAsNonRoot"] is True
    c = spec["containers"][0]
    assert c["args"] == ["run"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e for e in c["env"]}
    assert env["BOUNCER_NAMESPACES"]["value"] == ",".join(rel.allowed)
    # The token is mounted for this pod only (the ServiceAccount itself opts out).
    assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
               for m in c["volumeMounts"])
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == RELEASE


# --- the can-i matrix ------------------------------------------------------------------------

# (mode, description, kubectl auth can-i arguments, namespace key, expected)
# Namespace keys: "allowed" (first of rbac.namespaces, or any namespace when cluster-wide),
# "outside" (not in rbac.namespaces), "release", "*" (all namespaces), "" (cluster scope).
CHECKS = [
    ("namespaced", "list pods", ["list", "pods"], "allowed", True),
    ("namespaced", "watch pods", ["watch", "pods"], "allowed", True),
    ("namespaced", "list replicasets", ["list", "replicasets.apps"], "allowed", True),
    ("namespaced", "get deployments", ["get", "deployments.apps"], "allowed", True),
    ("namespaced", "patch deployments", ["patch", "deployments.apps"], "allowed", True),
    ("namespaced", "patch statefulsets", ["patch", "statefulsets.apps"], "allowed", True),
    ("namespaced", "patch daemonsets", ["patch", "daemonsets.apps"], "allowed", True),
    ("namespaced", "list pods.metrics.k8s.io", ["list", "pods.metrics.k8s.io"], "allowed", True),
    ("namespaced", "list poddisruptionbudgets", ["list", "poddisruptionbudgets.policy"], "allowed", True),
    ("namespaced", "create pods/eviction", ["create", "pods", "--subresource=eviction"], "allowed", True),
    ("namespaced", "create events.events.k8s.io", ["create", "events.events.k8s.io"], "allowed", True),
    ("namespaced", "create events (core)", ["create", "events"], "allowed", True),
    ("namespaced", "get mcpservers (toolhive on)", ["get", "mcpservers.toolhive.stacklok.dev"], "allowed", True),
    ("namespaced", "patch mcpservers (toolhive on)", ["patch", "mcpservers.toolhive.stacklok.dev"], "allowed", True),
    ("namespaced", "patch mcpservers (toolhive on)", ["patch", "mcpservers.toolhive.stacklok.dev"], "outside", False),
    ("namespaced", "delete mcpservers", ["delete", "mcpservers.toolhive.stacklok.dev"], "allowed", False),
    ("namespaced", "update mcpservers", ["update", "mcpservers.toolhive.stacklok.dev"], "allowed", False),
    ("namespaced", "list namespaces", ["list", "namespaces"], "", True),
    ("namespaced", "create leases", ["create", "leases.coordination.k8s.io"], "release", True),
    ("namespaced", "get lease bouncer", ["get", "leases.coordination.k8s.io/bouncer"], "release", True),
    ("namespaced", "update lease bouncer", ["update", "leases.coordination.k8s.io/bouncer"], "release", True),
    ("namespaced", "get secrets", ["get", "secrets"], "allowed", False),
    ("namespaced", "get secrets", ["get", "secrets"], "release", False),
    ("namespaced", "delete pods", ["delete", "pods"], "allowed", False),
    ("namespaced", "delete deployments", ["delete", "deployments.apps"], "allowed", False),
    ("namespaced", "update deployments", ["update", "deployments.apps"], "allowed", False),
    ("namespaced", "patch pods", ["patch", "pods"], "allowed", False),
    ("namespaced", "patch deployments", ["patch", "deployments.apps"], "outside", False),
    ("namespaced", "list pods", ["list", "pods"], "outside", False),
    ("namespaced", "create pods/eviction", ["create", "pods", "--subresource=eviction"], "outside", False),
    ("namespaced", "list pods", ["list", "pods"], "*", False),
    ("namespaced", "update lease other", ["update", "leases.coordination.k8s.io/other"], "release", False),
    ("namespaced", "get lease other", ["get", "leases.coordination.k8s.io/other"], "release", False),
    ("namespaced", "delete lease bouncer", ["delete", "leases.coordination.k8s.io/bouncer"], "release", False),
    ("namespaced", "update lease bouncer", ["update", "leases.coordination.k8s.io/bouncer"], "allowed", False),
    ("namespaced", "create configmaps", ["create", "configmaps"], "release", False),
    ("cluster-wide", "list pods", ["list", "pods"], "*", True),
    ("cluster-wide", "patch deployments", ["patch", "deployments.apps"], "outside", True),
    ("cluster-wide", "create events.events.k8s.io", ["create", "events.events.k8s.io"], "outside", True),
    ("cluster-wide", "update lease bouncer-cw", ["update", "leases.coordination.k8s.io/bouncer-cw"], "release", True),
    ("cluster-wide", "create pods/eviction (eviction off)", ["create", "pods", "--subresource=eviction"], "outside", False),
    ("cluster-wide", "get secrets", ["get", "secrets"], "*", False),
    ("cluster-wide", "patch mcpservers (toolhive off)", ["patch", "mcpservers.toolhive.stacklok.dev"], "outside", False),
    ("cluster-wide", "delete pods", ["delete", "pods"], "outside", False),
    ("cluster-wide", "delete deployments", ["delete", "deployments.apps"], "outside", False),
    ("cluster-wide", "update lease bouncer", ["update", "leases.coordination.k8s.io/bouncer"], "release", False),
    ("cluster-wide", "delete namespaces", ["delete", "namespaces"], "", False),
]


@pytest.mark.parametrize(
    ("mode", "what", "args", "where", "expected"), CHECKS,
    ids=[f"{m}:{w}@{n or 'cluster'}" for m, w, _, n, _ in CHECKS],
)
def test_can_i(installed, mode, what, args, where, expected):
    rel: Release = installed[mode]
    scope = {
        "allowed": ["-n", (rel.allowed or [rel.outside])[0]],
        "outside": ["-n", rel.outside],
        "release": ["-n", rel.namespace],
        "*": ["--all-namespaces"],
        "": [],
    }[where]
    proc = kubectl("auth", "can-i", *args, *scope, *rel.user, check=False)
    answer = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert answer in ("yes", "no"), f"unexpected can-i output: {proc.stdout}{proc.stderr}"
    got = answer == "yes"
    namespace = {"allowed": "listed", "outside": "not listed", "release": "release",
                 "*": "all namespaces", "": "cluster scope"}[where]
    MATRIX.append({"mode": mode, "check": what, "namespace": namespace,
                   "expected": "yes" if expected else "no", "got": answer,
                   "ok": "ok" if got == expected else "FAIL"})
    assert got == expected, f"{what} in {namespace}: expected {expected}, got {answer}"


# --- a real bouncer run as the chart's ServiceAccount ------------------------------------------


def bouncer_binary() -> str:
    """The bouncer binary the Rust build made (scripts/test exports BOUNCER_BIN)."""
    candidates = [os.environ.get("BOUNCER_BIN", "")]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "target"))
    candidates += [os.path.join(target, "debug", "bouncer"), os.path.join(target, "release", "bouncer")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    if os.environ.get("BOUNCER_REQUIRE_CLUSTER") == "1":
        pytest.fail("no bouncer binary (set BOUNCER_BIN or build with cargo build)")
    pytest.skip("no bouncer binary: cargo build first")


def service_account_kubeconfig(rel: Release, path: str) -> None:
    """A kubeconfig that authenticates with the ServiceAccount's own token (not admin): a bound
    token from the TokenRequest API, as `kubectl create token` asks for it."""
    token = kubectl("-n", rel.namespace, "create", "token", RELEASE,
                    "--duration=1h").stdout.strip()
    assert token, "kubectl create token returned no token"
    admin = json.loads(kubectl("config", "view", "--minify", "--raw", "-o", "json").stdout)
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa",
                                                "namespace": rel.namespace}}],
        "current-context": "sa",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)


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


def restarted_at(namespace: str, name: str) -> str:
    return kubectl("-n", namespace, "get", "deployment", name, "-o",
                   "jsonpath={.spec.template.metadata.annotations.kubectl\\.kubernetes\\.io/restartedAt}"
                   ).stdout.strip()


def test_real_run_as_the_service_account(installed, tmp_path):
    """With the chart's identity, bouncer bounces in an allowed namespace and nowhere else."""
    rel: Release = installed["namespaced"]
    binary = bouncer_binary()
    allowed, outside = rel.allowed[0], rel.outside
    for ns in (allowed, outside):
        kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(small_deployment("rbac-web")))
    for ns in (allowed, outside):
        kubectl("-n", ns, "rollout", "status", "deployment/rbac-web", "--timeout=90s", timeout=100)
    kubeconfig = str(tmp_path / "sa.kubeconfig")
    service_account_kubeconfig(rel, kubeconfig)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(yaml.safe_dump({
        "apiVersion": "bouncer.dev/v1alpha1", "kind": "BouncePolicy",
        "metadata": {"name": "rbac-web"},
        "spec": {"target": {"selector": {"matchLabels": {"app": "rbac-web"}}},
                 "triggers": {"schedule": {"cron": "* * * * *"}}, "cooldown": "1s"},
    }))
    # The every-minute cron must fire after the pods started.
    time.sleep(61 - time.time() % 60)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "BOUNCER_POLICIES": str(policies),
           "BOUNCER_NAMESPACES": ",".join(rel.allowed), "BOUNCER_LEASE_NAMESPACE": rel.namespace,
           "BOUNCER_OUTPUT": "json", "BOUNCER_ROLLOUT_TIMEOUT": "90s"}
    run = subprocess.run([binary, "run"], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    bounced = [(r["workload"]["namespace"], r["decision"]) for r in report["rows"]]
    assert bounced == [(allowed, "bounced")], report
    assert restarted_at(allowed, "rbac-web"), "the allowed namespace's deployment was restarted"
    assert not restarted_at(outside, "rbac-web"), "the other namespace was not touched"

    # The same identity pointed at a namespace outside its grant is refused (exit 3), writes nothing.
    refused = subprocess.run([binary, "run", "--namespaces", outside], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3, (refused.returncode, refused.stderr)
    assert "forbidden" in refused.stderr.lower(), refused.stderr
    assert not restarted_at(outside, "rbac-web")
