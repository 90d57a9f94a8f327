"""Offline tests of the chart's RBAC: exactly the grants bouncer needs, in the right scope."""

from __future__ import annotations

import pytest

from conftest import NAMESPACE, V1_21, grants, manifests, objects_of, one, render

READ = {"get", "list", "watch"}

# Everything bouncer may do in a namespace where it bounces workloads.
NAMESPACED = (
    {("", "pods", v, "") for v in READ}
    | {("apps", r, v, "") for r in ("replicasets", "deployments", "statefulsets", "daemonsets")
       for v in READ}
    | {("apps", r, "patch", "") for r in ("deployments", "statefulsets", "daemonsets")}
    | {("metrics.k8s.io", "pods", v, "") for v in ("get", "list")}
    | {("policy", "poddisruptionbudgets", "list", "")}
    | {("events.k8s.io", "events", "create", ""), ("", "events", "create", "")}
)
EVICTION = {("", "pods/eviction", "create", "")}
TOOLHIVE = {("toolhive.stacklok.dev", "mcpservers", v, "") for v in ("get", "patch")}
CLUSTER_ONLY = {("", "namespaces", v, "") for v in READ}
LEASE = {
    ("coordination.k8s.io", "leases", "create", ""),
    ("coordination.k8s.io", "leases", "get", "bouncer"),
    ("coordination.k8s.io", "leases", "update", "bouncer"),
}

CASES = {
    "cluster-wide": {},
    "cluster-wide-no-eviction": {"eviction": {"enabled": False}},
    "namespaced": {"rbac": {"namespaces": ["team-a", "team-b"]}},
    "namespaced-no-eviction": {"rbac": {"namespaces": ["team-a"]}, "eviction": {"enabled": False}},
    "cluster-wide-toolhive": {"toolhive": {"enabled": True}},
    "namespaced-toolhive": {"rbac": {"namespaces": ["team-a"]}, "toolhive": {"enabled": True}},
    # The webhook URLs come from Secrets, read by the kubelet: no grant changes.
    "notifications": {"notify": {"slack": {"secretName": "bouncer-notify"},
                                 "webhook": {"secretName": "bouncer-notify"}},
                      "metrics": {"pushgatewayUrl": "http://pg:9091"}},
    "notifications-env": {"notify": {"mountAs": "env", "slack": {"secretName": "bouncer-notify"}}},
}


def roles(values):
    objs = manifests(render(values, **V1_21))
    return objs, objects_of(objs, "ClusterRole") + objects_of(objs, "Role")


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_grants_are_exactly_what_bouncer_needs(values):
    objs, _ = roles(values)
    eviction = values.get("eviction", {}).get("enabled", True)
    toolhive = values.get("toolhive", {}).get("enabled", False)
    expected_ns = NAMESPACED | (EVICTION if eviction else set()) | (TOOLHIVE if toolhive else set())
    cluster_role = one(objs, "ClusterRole")
    lease_role = next(r for r in objects_of(objs, "Role") if r["metadata"]["name"].endswith("-lease"))
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert grants(lease_role) == LEASE
    namespaces = values.get("rbac", {}).get("namespaces")
    if not namespaces:
        assert grants(cluster_role) == expected_ns | CLUSTER_ONLY
        assert len(objects_of(objs, "Role")) == 1
    else:
        assert grants(cluster_role) == CLUSTER_ONLY
        ns_roles = [r for r in objects_of(objs, "Role") if r is not lease_role]
        assert sorted(r["metadata"]["namespace"] for r in ns_roles) == sorted(namespaces)
        for role in ns_roles:
            assert grants(role) == expected_ns, role["metadata"]["namespace"]


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_no_secrets_no_delete_no_wildcards(values):
    _, all_roles = roles(values)
    for role in all_roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert not {"secrets", "configmaps", "serviceaccounts/token"} & set(rule["resources"]), rule
            assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(
                rule["verbs"]), rule
            assert "nonResourceURLs" not in rule


def test_write_verbs_are_limited_to_workload_patches_evictions_events_and_the_lease():
    _, all_roles = roles({})
    writes = {(g, r, v) for role in all_roles for g, r, v, _ in grants(role) if v not in READ}
    assert writes == {
        ("apps", "deployments", "patch"),
        ("apps", "statefulsets", "patch"),
        ("apps", "daemonsets", "patch"),
        ("", "pods/eviction", "create"),
        ("events.k8s.io", "events", "create"),
        ("", "events", "create"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }


def test_the_toolhive_restart_method_adds_only_its_patch():
    """`toolhive.enabled` grants get and patch on MCPServers, nothing more."""
    _, off = roles({})
    _, on = roles({"toolhive": {"enabled": True}})
    added = {g for role in on for g in grants(role)} - {g for role in off for g in grants(role)}
    assert added == TOOLHIVE


def test_lease_grant_follows_the_lease_name():
    objs = manifests(render({"lease": {"name": "bouncer-prod"}}))
    lease_role = next(r for r in objects_of(objs, "Role") if r["metadata"]["name"].endswith("-lease"))
    named = [rule for rule in lease_role["rules"] if rule.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["bouncer-prod"], "verbs": ["get", "update"]}]


def test_roles_are_not_duplicated_when_the_release_namespace_is_listed():
    objs = manifests(render({"rbac": {"namespaces": [NAMESPACE, "team-a"]}}))
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), keys
