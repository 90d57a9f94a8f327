"""The chart's ValidatingAdmissionPolicy. Offline: rendered only where the cluster serves it (and on
by default there), bound to the chart's ServiceAccount alone, naming the annotations bouncer really
writes (read from the Rust source, so the two cannot drift apart). On the live cluster (see
live.py): what the ServiceAccount's patches may change and what the API server denies; bouncer's
own bounces through it are test_cluster.py's real run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import CHART_DIR, NAMESPACE, V1_21, V1_30, manifests, notes, objects_of, one, render
from live import (PAUSE_3_9, Release, as_service_account, denied_by_policy, image_patch, kubectl,
                  small_deployment)

VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
BINDING = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding"
V1_36 = {"kube_version": "v1.36.0",
         "api_versions": V1_30["api_versions"] + ["admissionregistration.k8s.io/v1", VAP, BINDING]}
LITERALS = CHART_DIR.parents[1] / "src" / "core" / "literals.rs"


def literals() -> dict[str, str]:
    """The string constants of src/core/literals.rs, by name."""
    text = Path(LITERALS).read_text()
    return dict(re.findall(r'pub const (\w+): &str =\s*"([^"]*)";', text))


def policy_and_binding(values=None, caps=V1_36):
    objs = manifests(render(values or {}, **caps))
    return objects_of(objs, "ValidatingAdmissionPolicy"), objects_of(objs, "ValidatingAdmissionPolicyBinding")


def variable(policy, name: str) -> str:
    return next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name)


def test_rendered_by_default_where_served_and_bound_to_the_service_account_alone():
    [policy], [binding] = policy_and_binding()
    name = f"{NAMESPACE}-bouncer"
    assert policy["metadata"]["name"] == name and binding["metadata"]["name"] == name
    assert "namespace" not in policy["metadata"], "cluster-scoped"
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConditions"] == [{
        "name": "bouncer-service-account",
        "expression": f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:bouncer'"}]
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["apps"], "apiVersions": ["*"], "operations": ["UPDATE"],
                    "resources": ["deployments", "statefulsets", "daemonsets"]}
    # The binding has no matchResources: every namespace, whatever rbac.namespaces grants.
    assert "matchResources" not in binding["spec"]


def test_follows_the_service_account_name_and_toolhive():
    [policy], _ = policy_and_binding({"serviceAccount": {"name": "restarter"},
                                      "toolhive": {"enabled": True}})
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(
        f"'system:serviceaccount:{NAMESPACE}:restarter'")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[1] == {"apiGroups": ["toolhive.stacklok.dev"], "apiVersions": ["*"],
                        "operations": ["UPDATE"], "resources": ["mcpservers"]}
    assert "MCPServer's restart request" in policy["spec"]["validations"][0]["messageExpression"]


@pytest.mark.parametrize(("values", "caps"), [
    ({}, V1_21),
    ({}, V1_30),  # admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA from 1.30 on;
                  # a cluster that does not list it (beta only, or turned off) gets none
    ({"admissionPolicy": {"enabled": False}}, V1_36),
    ({}, {**V1_36, "api_versions": [v for v in V1_36["api_versions"] if v != BINDING]}),
], ids=["1.21", "not-served", "disabled", "no-binding-kind"])
def test_not_rendered_where_not_served_or_disabled(values, caps):
    policies, bindings = policy_and_binding(values, caps)
    assert policies == [] and bindings == []


def test_notes_say_when_workloads_are_unguarded():
    assert "ValidatingAdmissionPolicy" not in notes(render({}, **V1_36))
    text = notes(render({}, **V1_30))
    assert "does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" in text
    text = notes(render({"admissionPolicy": {"enabled": False}}, **V1_36))
    assert "admissionPolicy.enabled is false" in text


def test_the_annotations_are_the_ones_bouncer_writes_and_reads():
    """The keys in the policy's CEL are bouncer's own constants: the restart annotation kubectl
    and bouncer write, ToolHive's restart request, and the opt-out and overrides people set, which
    bouncer only reads and so may not change."""
    lit = literals()
    [policy], _ = policy_and_binding({"toolhive": {"enabled": True}})
    forbidden = variable(policy, "forbidden")
    assert f"k != '{lit['RESTARTED_AT']}'" in forbidden
    assert f"k == '{lit['TOOLHIVE_RESTARTED_AT']}'" in forbidden
    assert f"k.startsWith('{lit['ANNOTATION_PREFIX']}')" in forbidden
    personal = re.findall(r"'([^']+)'", variable(policy, "personal"))
    assert personal == [lit[n] for n in ("EXCLUDE_ANNOTATION", "MEMORY_ABOVE_ANNOTATION",
                                         "PERCENT_OF_LIMIT_ANNOTATION", "COOLDOWN_ANNOTATION")]
    # Every other bouncer.dev/ constant is a mark bouncer writes itself.
    marks = {v for k, v in lit.items()
             if v.startswith(lit["ANNOTATION_PREFIX"]) and k != "ANNOTATION_PREFIX"} - set(personal)
    assert marks >= {lit["ATTEMPT_ANNOTATION"]}


def test_no_grant_on_admission_policies():
    """The ServiceAccount cannot edit or remove what guards it."""
    objs = manifests(render({"toolhive": {"enabled": True}}, **V1_36))
    for role in objects_of(objs, "ClusterRole") + objects_of(objs, "Role"):
        for rule in role["rules"]:
            assert "admissionregistration.k8s.io" not in rule["apiGroups"], rule
    assert one(objs, "ValidatingAdmissionPolicy")


# --- on the live cluster: what the ServiceAccount may change -------------------------------------


def guarded(name: str, kind: str) -> dict[str, Any]:
    """A workload of each kind that runs no pod: the policy judges specs, not pods."""
    obj = small_deployment(name)
    obj["kind"] = kind
    obj["metadata"]["annotations"] = {"bouncer.dev/exclude": "false", "team": "shop"}
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"bouncer.dev/no-such-node": "true"}
    if kind == "StatefulSet":
        obj["spec"]["serviceName"] = name
    if kind == "DaemonSet":
        del obj["spec"]["replicas"]
    else:
        obj["spec"]["replicas"] = 0
    return obj


RESTART = {"spec": {"template": {"metadata": {"annotations": {
    "kubectl.kubernetes.io/restartedAt": "2026-12-04T18:00:00Z"}}}}}
MARK = {"metadata": {"annotations": {"bouncer.dev/last-attempt": '{"time":"2026-12-04T18:00:00Z"}'}}}

# (kind, what, --type, patch, None when allowed, else the path the denial names)
PATCHES = [
    ("deployment", "restart and mark, as bouncer's rollout writes them", "strategic",
     {**RESTART, **MARK}, None),
    ("statefulset", "restart", "strategic", RESTART, None),
    ("daemonset", "restart", "strategic", RESTART, None),
    ("deployment", "mark alone, as before an eviction", "strategic",
     {"metadata": {"annotations": {"bouncer.dev/last-attempt": '{"time":"2026-12-04T18:05:00Z"}'}}}, None),
    ("deployment", "image", "strategic", json.loads(image_patch()), "spec.template.spec"),
    ("statefulset", "image", "strategic", json.loads(image_patch()), "spec.template.spec"),
    ("daemonset", "image", "strategic", json.loads(image_patch()), "spec.template.spec"),
    ("deployment", "image inside a restart patch", "strategic",
     {"spec": {**json.loads(image_patch())["spec"], "template": {
         **RESTART["spec"]["template"], **json.loads(image_patch())["spec"]["template"]}}},
     "spec.template.spec"),
    ("deployment", "image, as a JSON patch", "json",
     [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": PAUSE_3_9}],
     "spec.template.spec"),
    ("deployment", "command", "strategic", {"spec": {"template": {"spec": {"containers": [
        {"name": "app", "command": ["/bin/sh", "-c", "true"]}]}}}}, "spec.template.spec"),
    ("deployment", "replicas", "merge", {"spec": {"replicas": 5}}, "spec.replicas"),
    ("deployment", "pod template label", "merge",
     {"spec": {"template": {"metadata": {"labels": {"extra": "x"}}}}}, "spec.template.metadata.labels"),
    ("deployment", "another pod template annotation", "merge",
     {"spec": {"template": {"metadata": {"annotations": {"example.com/x": "1"}}}}},
     "spec.template.metadata.annotations[example.com/x]"),
    ("deployment", "label", "merge", {"metadata": {"labels": {"extra": "x"}}}, "metadata.labels"),
    ("deployment", "finalizer", "merge", {"metadata": {"finalizers": ["example.com/hold"]}},
     "metadata.finalizers"),
    ("deployment", "someone else's annotation", "merge",
     {"metadata": {"annotations": {"team": "other"}}}, "metadata.annotations[team]"),
    ("deployment", "the opt-out people set", "merge",
     {"metadata": {"annotations": {"bouncer.dev/exclude": None}}}, "metadata.annotations[bouncer.dev/exclude]"),
    ("deployment", "a cooldown override", "merge",
     {"metadata": {"annotations": {"bouncer.dev/cooldown": "1s"}}}, "metadata.annotations[bouncer.dev/cooldown]"),
    ("deployment", "ToolHive's restart request, on a Deployment", "merge",
     {"metadata": {"annotations": {"mcpserver.toolhive.stacklok.dev/restarted-at": "2026-12-04T18:00:00Z"}}},
     "metadata.annotations[mcpserver.toolhive.stacklok.dev/restarted-at]"),
]


@pytest.fixture(scope="module")
def workloads(installed):
    rel: Release = installed["namespaced"]
    namespace = rel.allowed[0]
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(guarded("vap-" + kind.lower(), kind)))
    return rel, namespace


def read(namespace: str, resource: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl("-n", namespace, "get", resource, name, "-o", "json").stdout)


@pytest.mark.parametrize(("kind", "what", "kind_of_patch", "patch", "denied_path"), PATCHES,
                         ids=[f"{k}:{w}" for k, w, *_ in PATCHES])
def test_admission_policy_lets_the_service_account_restart_and_nothing_else(
        workloads, kind, what, kind_of_patch, patch, denied_path):
    rel, namespace = workloads
    name = f"vap-{kind}"
    before = read(namespace, kind, name)
    proc = as_service_account(rel, namespace, "patch", kind, name, f"--type={kind_of_patch}",
                              "-p", json.dumps(patch))
    after = read(namespace, kind, name)
    if denied_path is None:
        assert proc.returncode == 0, f"{what}: {proc.stderr}"
        assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
        return
    assert denied_by_policy(proc, rel), f"{what} was not denied: {proc.stdout}{proc.stderr}"
    assert f"this request also changes {denied_path}" in proc.stderr, proc.stderr
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "no write"


def test_admission_policy_binds_only_the_service_account(workloads):
    """The same image change by anyone else (here the cluster admin) is not the policy's business."""
    rel, namespace = workloads
    kubectl("-n", namespace, "patch", "deployment", "vap-deployment", "-p",
            image_patch("registry.k8s.io/pause:3.10"))
    assert read(namespace, "deployment", "vap-deployment")["spec"]["template"]["spec"][
        "containers"][0]["image"] == "registry.k8s.io/pause:3.10"


def test_admission_policy_guards_every_namespace_a_cluster_wide_grant_reaches(installed):
    rel: Release = installed["cluster-wide"]
    kubectl("-n", rel.outside, "apply", "-f", "-", stdin=json.dumps(guarded("vap-cw", "Deployment")))
    restart = as_service_account(rel, rel.outside, "patch", "deployment", "vap-cw", "-p", json.dumps(RESTART))
    assert restart.returncode == 0, restart.stderr
    image = as_service_account(rel, rel.outside, "patch", "deployment", "vap-cw", "-p", image_patch())
    assert denied_by_policy(image, rel), f"{image.stdout}{image.stderr}"


# --- the MCPServer's restart request (toolhive.enabled) -----------------------------------------

@pytest.fixture(scope="module")
def mcp_server(workloads):
    """An MCPServer no operator watches (the CRDs: see live.installed)."""
    rel, namespace = workloads
    crd = "mcpservers.toolhive.stacklok.dev"
    versions = json.loads(kubectl("get", "crd", crd, "-o", "json").stdout)["spec"]["versions"]
    version = next(v["name"] for v in versions if v.get("storage"))
    kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": f"toolhive.stacklok.dev/{version}", "kind": "MCPServer",
        "metadata": {"name": "vap-fetch"},
        "spec": {"image": "ghcr.io/stackloklabs/gofetch/server:1.0.0", "transport": "stdio"},
    }))
    yield rel, namespace
    kubectl("-n", namespace, "patch", "mcpserver", "vap-fetch", "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False)


REQUEST = "mcpserver.toolhive.stacklok.dev/restarted-at"


def test_admission_policy_lets_the_service_account_request_and_withdraw_a_toolhive_restart(mcp_server):
    rel, namespace = mcp_server
    patch = lambda kind, body: as_service_account(  # noqa: E731
        rel, namespace, "patch", "mcpserver", "vap-fetch", f"--type={kind}", "-p", json.dumps(body))
    # bouncer's request: a merge patch of the annotation alone.
    ok = patch("merge", {"metadata": {"annotations": {REQUEST: "2026-12-04T18:00:00Z"}}})
    assert ok.returncode == 0, ok.stderr
    # Its withdrawal: a JSON patch that tests the value, then removes it.
    pointer = "/metadata/annotations/" + REQUEST.replace("~", "~0").replace("/", "~1")
    ok = patch("json", [{"op": "test", "path": pointer, "value": "2026-12-04T18:00:00Z"},
                        {"op": "remove", "path": pointer}])
    assert ok.returncode == 0, ok.stderr
    annotations = read(namespace, "mcpserver", "vap-fetch")["metadata"].get("annotations") or {}
    assert REQUEST not in annotations
    # What a bounce never writes: the strategy that deletes every pod at once, or the spec.
    strategy = "mcpserver.toolhive.stacklok.dev/restart-strategy"
    no = patch("merge", {"metadata": {"annotations": {strategy: "immediate"}}})
    assert denied_by_policy(no, rel) and f"metadata.annotations[{strategy}]" in no.stderr, no.stderr
    no = patch("merge", {"spec": {"image": "ghcr.io/example/other:1"}})
    assert denied_by_policy(no, rel) and "spec.image" in no.stderr, no.stderr
