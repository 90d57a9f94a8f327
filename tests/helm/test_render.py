"""Offline tests of the chart: lint, what default and non-default values render, the CronJob API
version switch, and the pod's hardening."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest
import yaml

from conftest import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    V1_21,
    V1_30,
    container,
    env_of,
    manifests,
    notes,
    objects_of,
    one,
    render,
)

STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}


def pod_spec(cronjob):
    return cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]


# --- lint ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kube_version", [None, "v1.20.2", "v1.30.0"])
def test_lint_is_clean(kube_version):
    report = helm.lint(CHART_DIR, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is INFO (only "icon is recommended"); warnings and errors must not appear.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


def test_lint_reports_values_the_schema_rejects():
    report = helm.lint(CHART_DIR, {"output": "xml"}, namespace=NAMESPACE)
    assert any("output" in m["error"] for m in report["messages"] if m["severity"] == 3), report


# --- default values -----------------------------------------------------------------------


def test_defaults_render_the_expected_objects():
    objs = manifests(render(**V1_21))
    kinds = sorted((o["kind"], o["metadata"].get("namespace", "")) for o in objs)
    assert kinds == sorted([
        ("ClusterRole", ""),
        ("ClusterRoleBinding", ""),
        ("ConfigMap", NAMESPACE),
        ("CronJob", NAMESPACE),
        ("Role", NAMESPACE),          # the lease
        ("RoleBinding", NAMESPACE),
        ("ServiceAccount", NAMESPACE),
    ])
    for o in objs:
        assert STANDARD_LABELS <= set(o["metadata"]["labels"]), o["metadata"]["name"]
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert o["metadata"]["labels"]["helm.sh/chart"] == "bouncer-0.1.0"


def test_default_cronjob():
    cj = one(manifests(render(**V1_21)), "CronJob")
    spec = cj["spec"]
    assert spec["schedule"] == "*/15 * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 300
    assert spec["successfulJobsHistoryLimit"] == 3
    assert spec["failedJobsHistoryLimit"] == 3
    # No policy yet: installed suspended (see test_without_a_policy_...).
    assert spec["suspend"] is True
    assert "timeZone" not in spec
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    assert "activeDeadlineSeconds" not in job
    assert "ttlSecondsAfterFinished" not in job
    # Jobs carry the selector labels, so NOTES' `get jobs -l ...` finds them.
    assert {"app.kubernetes.io/name", "app.kubernetes.io/instance"} <= set(
        spec["jobTemplate"]["metadata"]["labels"])
    pod = pod_spec(cj)
    assert pod["restartPolicy"] == "Never"
    c = container(cj)
    assert c["image"] == "bouncer:0.1.0"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["args"] == ["run"]
    assert env_of(cj) == {
        "BOUNCER_POLICIES": "/etc/bouncer/policies",
        "BOUNCER_OUTPUT": "json",
        "BOUNCER_LOG_FORMAT": "json",
        "BOUNCER_MAX_BOUNCES": "3",
        "BOUNCER_ROLLOUT_TIMEOUT": "10m",
        "BOUNCER_LEASE_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "BOUNCER_LEASE_NAME": "bouncer",
    }
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"},
                              "limits": {"memory": "128Mi"}}


def test_default_wiring_between_objects():
    objs = manifests(render(**V1_21))
    cj, sa, cm = one(objs, "CronJob"), one(objs, "ServiceAccount"), one(objs, "ConfigMap")
    pod = pod_spec(cj)
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "bouncer"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container(cj)["volumeMounts"]}
    policies = volumes[mounts["/etc/bouncer/policies"]["name"]]
    assert policies["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["data"] == {}
    for binding in objects_of(objs, "ClusterRoleBinding") + objects_of(objs, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "bouncer", "namespace": NAMESPACE}]
        role_kind = binding["roleRef"]["kind"]
        assert any(r["metadata"]["name"] == binding["roleRef"]["name"]
                   for r in objects_of(objs, role_kind))
    # Cluster-scoped names carry the release namespace: two releases cannot collide.
    assert one(objs, "ClusterRole")["metadata"]["name"] == f"{NAMESPACE}-bouncer"


def test_notes_tell_how_to_read_the_last_report_and_run_now():
    text = notes(render())
    assert (f"kubectl -n {NAMESPACE} get jobs -l app.kubernetes.io/name=bouncer,"
            f"app.kubernetes.io/instance={RELEASE}") in text
    assert f"kubectl -n {NAMESPACE} logs job/$LAST" in text
    assert f"kubectl -n {NAMESPACE} create job --from=cronjob/bouncer " in text
    assert "NOTHING WILL RUN YET: no policy is configured" in text
    assert "every namespace" in text
    assert "DRY-RUN" not in text


def test_notes_tell_manual_runs_to_share_the_lease_outside_the_default_namespace():
    # A manual run's Lease defaults to the namespace "bouncer"; elsewhere it must be told.
    text = notes(render())
    assert f"BOUNCER_LEASE_NAMESPACE={NAMESPACE}" in text
    assert f"the Lease {NAMESPACE}/bouncer" in text
    assert "BOUNCER_LEASE_NAMESPACE" not in notes(render(namespace="bouncer"))


# --- CronJob API version ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "caps",
    [V1_21, V1_30, {"kube_version": "v1.36.3"}, {}],
    ids=["discovery-1.21", "discovery-1.30", "kube-1.36", "helm-defaults"],
)
def test_cronjob_is_batch_v1_on_every_supported_version(caps):
    assert one(manifests(render(**caps)), "CronJob")["apiVersion"] == "batch/v1"


def test_chart_declares_kubernetes_1_21_or_newer():
    """batch/v1 CronJobs and policy/v1 evictions arrived in 1.21: Chart.yaml's kubeVersion makes
    `helm install` refuse older servers."""
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.21.0-0"


# --- non-default values -----------------------------------------------------------------------


def test_every_setting_reaches_the_cronjob():
    values = {
        "schedule": "0 3 * * *",
        "suspend": True,
        "startingDeadlineSeconds": 120,
        "successfulJobsHistoryLimit": 0,
        "failedJobsHistoryLimit": 7,
        "activeDeadlineSeconds": 3600,
        "output": "markdown",
        "maxBounces": 9,
        "rolloutTimeout": "1h 30m",
        "lease": {"name": "bouncer-prod"},
        "image": {"repository": "registry.example/bouncer", "tag": "1.2.3", "pullPolicy": "Always"},
        "extraEnv": [{"name": "RUST_LOG", "value": "bouncer=debug"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "podLabels": {"team": "platform"},
        "podAnnotations": {"example.com/note": "hi"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}],
    }
    cj = one(manifests(render(values, **V1_21)), "CronJob")
    spec, job = cj["spec"], cj["spec"]["jobTemplate"]["spec"]
    assert (spec["schedule"], spec["suspend"], spec["startingDeadlineSeconds"]) == ("0 3 * * *", True, 120)
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (0, 7)
    assert job["activeDeadlineSeconds"] == 3600
    env = env_of(cj)
    assert env["BOUNCER_OUTPUT"] == "markdown"
    assert env["BOUNCER_MAX_BOUNCES"] == "9"
    assert env["BOUNCER_ROLLOUT_TIMEOUT"] == "1h 30m"
    assert env["BOUNCER_LEASE_NAME"] == "bouncer-prod"
    assert env["RUST_LOG"] == "bouncer=debug"
    assert "BOUNCER_NAMESPACES" not in env
    c = container(cj)
    assert c["image"] == "registry.example/bouncer:1.2.3"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"]["limits"] == {"memory": "256Mi"}
    tpl = job["template"]
    assert tpl["metadata"]["labels"]["team"] == "platform"
    assert tpl["metadata"]["annotations"] == {"example.com/note": "hi"}
    pod = tpl["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "infra"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert cj["metadata"]["labels"]["app.kubernetes.io/version"] == "1.2.3"


def test_image_digest_wins_over_tag():
    values = {"image": {"repository": "r/bouncer", "tag": "1.0", "digest": "sha256:" + "a" * 64}}
    assert container(one(manifests(render(values)), "CronJob"))["image"] == "r/bouncer@sha256:" + "a" * 64


def test_dry_run_adds_the_flag_and_says_so():
    rendered = render({"dryRun": True}, **V1_21)
    assert container(one(manifests(rendered), "CronJob"))["args"] == ["run", "--dry-run"]
    assert "DRY-RUN" in notes(rendered)


def test_rbac_namespaces_use_roles_for_namespaced_resources():
    rendered = render({"rbac": {"namespaces": ["team-a", "team-b"]}}, **V1_21)
    objs = manifests(rendered)
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in objects_of(objs, "Role")}
    assert roles == {("team-a", "ops-bouncer"), ("team-b", "ops-bouncer"), (NAMESPACE, "bouncer-lease")}
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["kind"], b["roleRef"]["name"])
                for b in objects_of(objs, "RoleBinding")}
    assert bindings == {("team-a", "Role", "ops-bouncer"), ("team-b", "Role", "ops-bouncer"),
                        (NAMESPACE, "Role", "bouncer-lease")}
    # The only cluster-wide grant left is reading namespaces.
    cluster_role = one(objs, "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]
    assert env_of(one(objs, "CronJob"))["BOUNCER_NAMESPACES"] == "team-a,team-b"
    assert "only in: team-a, team-b" in notes(rendered)


def test_eviction_disabled_drops_only_the_eviction_grant():
    def all_rules(values):
        objs = manifests(render(values, **V1_21))
        return [rule for r in objects_of(objs, "ClusterRole") + objects_of(objs, "Role")
                for rule in r["rules"]]

    for base in ({}, {"rbac": {"namespaces": ["team-a"]}}):
        on = all_rules(base)
        off = all_rules({**base, "eviction": {"enabled": False}})
        assert any("pods/eviction" in rule["resources"] for rule in on)
        assert not any("pods/eviction" in rule["resources"] for rule in off)
        assert [r for r in on if "pods/eviction" not in r["resources"]] == off


def test_rbac_create_false_renders_no_rbac():
    objs = manifests(render({"rbac": {"create": False}}))
    assert not [o for o in objs if o["apiVersion"].startswith("rbac.authorization.k8s.io")]


def test_existing_service_account():
    objs = manifests(render({"serviceAccount": {"create": False, "name": "ops-robot"}}))
    assert objects_of(objs, "ServiceAccount") == []
    assert pod_spec(one(objs, "CronJob"))["serviceAccountName"] == "ops-robot"
    for b in objects_of(objs, "ClusterRoleBinding") + objects_of(objs, "RoleBinding"):
        assert b["subjects"][0]["name"] == "ops-robot"


def test_service_account_name_override_and_fullname_override():
    objs = manifests(render({"serviceAccount": {"name": "custom-sa"}, "fullnameOverride": "bnc"}))
    assert one(objs, "ServiceAccount")["metadata"]["name"] == "custom-sa"
    assert one(objs, "CronJob")["metadata"]["name"] == "bnc"
    assert one(objs, "ConfigMap")["metadata"]["name"] == "bnc-policies"


POLICY = {
    "apiVersion": "bouncer.dev/v1alpha1",
    "kind": "BouncePolicy",
    "metadata": {"name": "vmcp-leak"},
    "spec": {
        "target": {"namespaces": ["toolhive-system"],
                   "selector": {"matchLabels": {"app.kubernetes.io/name": "virtualmcpserver"}}},
        "triggers": {"memory": {"above": "1536Mi"}},
        "cooldown": "6h",
    },
}


def test_policies_from_a_map_of_files():
    text = yaml.safe_dump(POLICY)
    data = one(manifests(render({"policies": {"vmcp.yaml": text, "as-object.yaml": POLICY}})),
               "ConfigMap")["data"]
    assert set(data) == {"vmcp.yaml", "as-object.yaml"}
    assert data["vmcp.yaml"] == text
    assert yaml.safe_load(data["as-object.yaml"]) == POLICY


def test_policies_from_a_list_become_one_multi_document_file():
    second = {**POLICY, "metadata": {"name": "nightly"}}
    data = one(manifests(render({"policies": [POLICY, second]})), "ConfigMap")["data"]
    assert list(data) == ["values-policies.yaml"]
    assert list(yaml.safe_load_all(data["values-policies.yaml"])) == [POLICY, second]


def test_policy_files_in_the_chart_are_included_and_values_override_them(chart_copy: Path):
    (chart_copy / "policies" / "shipped.yaml").write_text(yaml.safe_dump(POLICY))
    (chart_copy / "policies" / "replaced.yaml").write_text("from: chart\n")
    (chart_copy / "policies" / "notes.txt").write_text("not a policy\n")
    rendered = render({"policies": {"replaced.yaml": "from: values\n"}}, chart_dir=chart_copy)
    data = one(manifests(rendered), "ConfigMap")["data"]
    assert set(data) == {"shipped.yaml", "replaced.yaml"}
    assert yaml.safe_load(data["shipped.yaml"]) == POLICY
    assert data["replaced.yaml"] == "from: values\n"
    assert "no policy is configured" not in notes(rendered)


# --- hardening ------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, {"dryRun": True, "rbac": {"namespaces": ["a"]}}])
def test_pod_is_hardened(values):
    cj = one(manifests(render(values, **V1_21)), "CronJob")
    pod = pod_spec(cj)
    assert pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    sc = container(cj)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc
    # The only writable path is an emptyDir at /tmp; policies are mounted read-only.
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container(cj)["volumeMounts"]:
        volume = volumes[mount["name"]]
        assert set(volume) & {"configMap", "emptyDir"}, volume
        if "emptyDir" in volume:
            assert mount["mountPath"] == "/tmp"
        else:
            assert mount["readOnly"] is True


def test_service_account_does_not_hand_out_tokens_to_other_pods():
    sa = one(manifests(render()), "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


# --- a fresh install without policies is inert --------------------------------------------


def test_without_a_policy_the_cronjob_is_suspended_and_notes_say_what_to_add():
    rendered = render(**V1_21)
    cj = one(manifests(rendered), "CronJob")
    assert cj["spec"]["suspend"] is True
    assert "no policy is configured" in cj["metadata"]["annotations"]["bouncer.dev/suspended"]
    text = notes(rendered)
    assert text.lstrip().startswith("NOTHING WILL RUN YET"), text
    assert f"helm upgrade {RELEASE} <chart> -n {NAMESPACE} --reuse-values -f my-policies.yaml" in text
    # The example NOTES shows is a policy the chart accepts.
    example = yaml.safe_load(text.split("for example (`bouncer validate` checks it offline):\n")[1]
                             .split("\n\n")[0])
    armed = render(example, **V1_21)
    assert one(manifests(armed), "CronJob")["spec"]["suspend"] is False
    assert "NOTHING WILL RUN YET" not in notes(armed)
    assert "suspended" not in notes(armed)


@pytest.mark.parametrize("source", ["values-list", "values-map", "configmap", "chart-file"])
def test_any_policy_source_arms_the_cronjob(source, chart_copy: Path):
    values, chart_dir = {}, CHART_DIR
    if source == "values-list":
        values = {"policies": [POLICY]}
    elif source == "values-map":
        values = {"policies": {"p.yaml": yaml.safe_dump(POLICY)}}
    elif source == "configmap":
        values = {"policiesConfigMap": "team-policies"}
    else:
        (chart_copy / "policies" / "shipped.yaml").write_text(yaml.safe_dump(POLICY))
        chart_dir = chart_copy
    cj = one(manifests(render(values, chart_dir=chart_dir)), "CronJob")
    assert cj["spec"]["suspend"] is False
    assert "annotations" not in cj["metadata"]
    # suspend: true still suspends an armed CronJob.
    cj = one(manifests(render({**values, "suspend": True}, chart_dir=chart_dir)), "CronJob")
    assert cj["spec"]["suspend"] is True


def test_policies_config_map_replaces_the_charts():
    rendered = render({"policiesConfigMap": "team-policies"})
    objs = manifests(rendered)
    assert objects_of(objs, "ConfigMap") == []
    volumes = {v["name"]: v for v in pod_spec(one(objs, "CronJob"))["volumes"]}
    assert volumes["policies"]["configMap"]["name"] == "team-policies"
    assert f"kubectl -n {NAMESPACE} get configmap team-policies -o yaml" in notes(rendered)
    with pytest.raises(Exception, match="policies and policiesConfigMap are both set"):
        render({"policiesConfigMap": "team-policies", "policies": [POLICY]})


# --- time zone, security contexts, extras ------------------------------------------------


def test_time_zone_goes_to_spec_time_zone():
    rendered = render({"schedule": "0 3 * * *", "timeZone": "Europe/Berlin"}, kube_version="v1.27.0")
    spec = one(manifests(rendered), "CronJob")["spec"]
    assert (spec["schedule"], spec["timeZone"]) == ("0 3 * * *", "Europe/Berlin")
    assert '"0 3 * * *" (Europe/Berlin)' in notes(rendered)
    # spec.timeZone arrived in 1.27: an older server would drop it and run at UTC.
    with pytest.raises(Exception, match="timeZone: CronJob spec.timeZone needs Kubernetes 1.27"):
        render({"timeZone": "Europe/Berlin"}, **V1_21)


def test_openshift_restricted_unsets_the_user_and_keeps_the_rest():
    nulls = {"runAsUser": None, "runAsGroup": None}
    cj = one(manifests(render({"podSecurityContext": nulls, "securityContext": nulls})), "CronJob")
    pod, sc = pod_spec(cj)["securityContext"], container(cj)["securityContext"]
    assert pod == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert sc == {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                  "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "seccompProfile": {"type": "RuntimeDefault"}}


def test_security_contexts_come_from_values():
    cj = one(manifests(render({"podSecurityContext": {"fsGroup": 2000, "runAsUser": 1000},
                               "securityContext": {"runAsUser": 1000}})), "CronJob")
    assert pod_spec(cj)["securityContext"]["fsGroup"] == 2000
    assert pod_spec(cj)["securityContext"]["runAsUser"] == 1000
    assert container(cj)["securityContext"]["runAsUser"] == 1000
    # Values merge into the defaults: the rest of the hardening stays.
    assert container(cj)["securityContext"]["readOnlyRootFilesystem"] is True


def test_extra_args_env_from_volumes_and_ttl():
    values = {
        "dryRun": True,
        "extraArgs": ["--max-bounces", "5", "--log-format=text"],
        "envFrom": [{"secretRef": {"name": "bouncer-env"}}, {"configMapRef": {"name": "c"}, "prefix": "X_"}],
        "extraVolumes": [{"name": "team", "configMap": {"name": "team-policies"}}],
        "extraVolumeMounts": [{"name": "team", "mountPath": "/etc/team", "readOnly": True}],
        "ttlSecondsAfterFinished": 3600,
    }
    cj = one(manifests(render(values)), "CronJob")
    c = container(cj)
    assert c["args"] == ["run", "--dry-run", "--max-bounces", "5", "--log-format=text"]
    assert c["envFrom"] == values["envFrom"]
    assert c["volumeMounts"][-1] == values["extraVolumeMounts"][0]
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/etc/bouncer/policies", "/tmp", "/etc/team"]
    assert pod_spec(cj)["volumes"][-1] == values["extraVolumes"][0]
    assert cj["spec"]["jobTemplate"]["spec"]["ttlSecondsAfterFinished"] == 3600
    zero = one(manifests(render({"ttlSecondsAfterFinished": 0})), "CronJob")
    assert zero["spec"]["jobTemplate"]["spec"]["ttlSecondsAfterFinished"] == 0


def test_pods_carry_the_standard_labels():
    cj = one(manifests(render({"podLabels": {"team": "platform"}})), "CronJob")
    labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert STANDARD_LABELS <= set(labels)
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["team"] == "platform"
