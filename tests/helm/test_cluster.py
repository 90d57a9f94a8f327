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
from typing import Any

import pytest
import yaml

from conftest import MATRIX
from live import (RELEASE, RELEASES, Cluster, Release, admission_policy, delete_release, kubectl,
                  make_release, small_deployment)

# --- server-side checks of the manifests ------------------------------------------------------


@pytest.mark.parametrize("mode", ["namespaced", "clusterwide"])
def test_manifests_pass_server_side_dry_run(cluster: Cluster, mode: str):
    # A release of its own: the shared ones are installed by other modules' tests.
    rel = make_release(cluster, *RELEASES[mode])
    try:
        cronjob = next(o for o in rel.objects if o["kind"] == "CronJob")
        assert cluster.serves(cronjob["apiVersion"], "CronJob"), cronjob["apiVersion"]
        proc = kubectl("apply", "--dry-run=server", "-f", "-", stdin=rel.rendered)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert len(lines) == len(rel.objects), proc.stdout
        assert all(line.endswith("(server dry run)") for line in lines), proc.stdout
        # Nothing was written.
        got = kubectl("get", "cronjobs", "-n", rel.namespace, "-o", "name").stdout
        assert got.strip() == ""
        assert kubectl("get", "validatingadmissionpolicy", admission_policy(rel)["metadata"]["name"],
                       check=False).returncode != 0
    finally:
        delete_release(rel)


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
    # What guards the patch grant is out of the ServiceAccount's reach.
    ("namespaced", "delete validatingadmissionpolicies",
     ["delete", "validatingadmissionpolicies.admissionregistration.k8s.io"], "", False),
    ("cluster-wide", "patch validatingadmissionpolicies",
     ["patch", "validatingadmissionpolicies.admissionregistration.k8s.io"], "", False),
    ("cluster-wide", "delete validatingadmissionpolicybindings",
     ["delete", "validatingadmissionpolicybindings.admissionregistration.k8s.io"], "", False),
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


def restarted_at(namespace: str, name: str) -> str:
    return kubectl("-n", namespace, "get", "deployment", name, "-o",
                   "jsonpath={.spec.template.metadata.annotations.kubectl\\.kubernetes\\.io/restartedAt}"
                   ).stdout.strip()


def test_real_run_as_the_service_account(installed, tmp_path):
    """With the chart's identity, bouncer bounces in an allowed namespace and nowhere else; its
    admission policy (in force: see `installed`) lets both bounce methods through: a rollout's
    restart patch with its mark, and an OnDelete StatefulSet's mark-only patch and evictions."""
    rel: Release = installed["namespaced"]
    assert admission_policy(rel), "the run is to pass through the chart's admission policy"
    binary = bouncer_binary()
    allowed, outside = rel.allowed[0], rel.outside
    for ns in (allowed, outside):
        kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(small_deployment("rbac-web")))
    kubectl("-n", allowed, "apply", "-f", "-", stdin=json.dumps(on_delete_statefulset("rbac-db")))
    for ns in (allowed, outside):
        kubectl("-n", ns, "rollout", "status", "deployment/rbac-web", "--timeout=90s", timeout=100)
    kubectl("-n", allowed, "wait", "statefulset/rbac-db", "--for=jsonpath={.status.readyReplicas}=2",
            "--timeout=90s", timeout=100)
    db_pods = pod_uids(allowed, "app=rbac-db")
    kubeconfig = str(tmp_path / "sa.kubeconfig")
    service_account_kubeconfig(rel, kubeconfig)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(yaml.safe_dump({
        "apiVersion": "bouncer.dev/v1alpha1", "kind": "BouncePolicy",
        "metadata": {"name": "rbac-web"},
        "spec": {"target": {"selector": {"matchExpressions": [
                     {"key": "app", "operator": "In", "values": ["rbac-web", "rbac-db"]}]},
                            "kinds": ["Deployment", "StatefulSet"]},
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
    bounced = sorted((r["workload"]["namespace"], r["workload"]["name"], r["decision"])
                     for r in report["rows"])
    assert bounced == [(allowed, "rbac-db", "bounced"), (allowed, "rbac-web", "bounced")], report
    assert restarted_at(allowed, "rbac-web"), "the allowed namespace's deployment was restarted"
    # The StatefulSet's pods were evicted and replaced, and its mark written.
    assert not db_pods & pod_uids(allowed, "app=rbac-db"), "every rbac-db pod was replaced"
    db = json.loads(kubectl("-n", allowed, "get", "statefulset", "rbac-db", "-o", "json").stdout)
    assert "bouncer.dev/last-attempt" in db["metadata"]["annotations"], db["metadata"]
    assert not restarted_at(outside, "rbac-web"), "the other namespace was not touched"

    # The same identity pointed at a namespace outside its grant is refused (exit 3), writes nothing.
    refused = subprocess.run([binary, "run", "--namespaces", outside], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3, (refused.returncode, refused.stderr)
    assert "forbidden" in refused.stderr.lower(), refused.stderr
    assert not restarted_at(outside, "rbac-web")


def on_delete_statefulset(name: str) -> dict[str, Any]:
    """Two pods that only an eviction replaces: bouncer marks the StatefulSet, then evicts."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
        "spec": {"replicas": 2, "serviceName": name, "selector": {"matchLabels": labels},
                 "updateStrategy": {"type": "OnDelete"}, "podManagementPolicy": "Parallel",
                 "template": small_deployment(name)["spec"]["template"]},
    }


def pod_uids(namespace: str, selector: str) -> set[str]:
    pods = json.loads(kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json").stdout)
    return {p["metadata"]["uid"] for p in pods["items"]}
