"""`helm install` and `helm upgrade` of the chart (Helm's own engine, helm-python-sdk) against the
live API server and its CronJob controller: a fresh install without policies starts no Job, an
upgrade that adds one arms the schedule, and a broken policy fails the install before anything is
written."""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any

import helm_python as helm
import pytest

from conftest import CHART_DIR, manifests, one, render
from live import Cluster, kubectl

POLICY = {
    "apiVersion": "bouncer.dev/v1alpha1",
    "kind": "BouncePolicy",
    "metadata": {"name": "nightly"},
    "spec": {"target": {"selector": {"matchLabels": {"app": "nothing-matches-this"}}},
             "triggers": {"schedule": {"cron": "0 3 * * *"}}},
}
# Every minute, so the CronJob controller acts within the test; the admission policy is another
# module's subject and would only slow the installs down.
BASE = {"schedule": "* * * * *", "admissionPolicy": {"enabled": False}}


@pytest.fixture
def helm_ns(cluster: Cluster):
    """Namespaces with a Helm client each; every release in them is uninstalled afterwards."""
    made: list[tuple[str, Any]] = []

    def make() -> tuple[str, Any]:
        ns = f"bouncer-install-{secrets.token_hex(3)}"
        kubectl("create", "namespace", ns)
        cfg = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=ns)
        made.append((ns, cfg))
        return ns, cfg

    yield make
    for ns, cfg in made:
        try:
            cfg.uninstall("bouncer", ignore_not_found=True, timeout=60)
        except helm.HelmError:
            pass
        finally:
            cfg.close()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def cronjob(ns: str) -> dict[str, Any]:
    return json.loads(kubectl("-n", ns, "get", "cronjob", "bouncer", "-o", "json").stdout)


def jobs(ns: str) -> list[dict[str, Any]]:
    return json.loads(kubectl("-n", ns, "get", "jobs", "-o", "json").stdout)["items"]


def test_an_install_without_policies_runs_nothing_until_an_upgrade_adds_one(helm_ns):
    idle_ns, idle = helm_ns()
    armed_ns, armed = helm_ns()
    release = idle.install(str(CHART_DIR), "bouncer", BASE, namespace=idle_ns, timeout=60)
    assert release["status"] == "deployed"
    assert "NOTHING WILL RUN YET" in release["notes"]
    assert cronjob(idle_ns)["spec"]["suspend"] is True

    # The same chart with a policy, every minute, in a time zone, with OpenShift's restricted
    # settings and the extras: the API server keeps them, and the controller starts a Job.
    nulls = {"runAsUser": None, "runAsGroup": None}
    armed.install(str(CHART_DIR), "bouncer", {
        **BASE, "policies": [POLICY], "timeZone": "Europe/Berlin",
        "podSecurityContext": nulls, "securityContext": nulls,
        "extraArgs": ["--max-bounces", "1"], "ttlSecondsAfterFinished": 600,
        "envFrom": [{"configMapRef": {"name": "bouncer-extra", "optional": True}}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }, namespace=armed_ns, timeout=60)
    spec = cronjob(armed_ns)["spec"]
    assert (spec["suspend"], spec["timeZone"]) == (False, "Europe/Berlin")

    deadline = time.monotonic() + 90
    while not jobs(armed_ns):
        assert time.monotonic() < deadline, "the armed CronJob started no Job within 90 s"
        time.sleep(1)
    job = jobs(armed_ns)[0]
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert "runAsUser" not in pod["spec"]["securityContext"]
    c = pod["spec"]["containers"][0]
    assert "runAsUser" not in c["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["args"] == ["run", "--max-bounces", "1"]
    assert c["volumeMounts"][-1]["mountPath"] == "/scratch"

    # The idle release's every-minute slot passed too (both were installed before the first
    # Job): the controller started nothing there.
    assert jobs(idle_ns) == []
    assert "lastScheduleTime" not in cronjob(idle_ns).get("status", {})

    # Adding a policy is all it takes.
    idle.upgrade(str(CHART_DIR), "bouncer", {"policies": [POLICY]}, namespace=idle_ns,
                 reuse_values=True, timeout=60)
    assert cronjob(idle_ns)["spec"]["suspend"] is False
    assert "annotations" not in cronjob(idle_ns)["metadata"] or \
        "bouncer.dev/suspended" not in cronjob(idle_ns)["metadata"]["annotations"]


def test_a_broken_policy_fails_install_and_upgrade_before_anything_is_written(helm_ns):
    ns, cfg = helm_ns()
    broken = {**POLICY, "spec": {**POLICY["spec"], "triggers": {"schedule": {"crn": "0 3 * * *"}}}}
    with pytest.raises(helm.HelmError) as err:
        cfg.install(str(CHART_DIR), "bouncer", {**BASE, "policies": [broken]}, namespace=ns,
                    timeout=60)
    assert "/policies/0/spec/triggers/schedule" in str(err.value), err.value
    left = kubectl("-n", ns, "get", "cronjobs,configmaps,serviceaccounts,secrets", "-o", "name",
                   "-l", "app.kubernetes.io/instance=bouncer").stdout
    assert left.strip() == "", left
    assert not [r for r in cfg.list() if r["name"] == "bouncer"]

    cfg.install(str(CHART_DIR), "bouncer", {**BASE, "policies": [POLICY]}, namespace=ns, timeout=60)
    with pytest.raises(helm.HelmError):
        cfg.upgrade(str(CHART_DIR), "bouncer", {"policies": [broken]}, namespace=ns,
                    reuse_values=True, timeout=60)
    configmap = json.loads(kubectl("-n", ns, "get", "configmap", "bouncer-policies", "-o",
                                   "json").stdout)
    assert "crn" not in configmap["data"]["values-policies.yaml"]
    assert cfg.status("bouncer")["revision"] == 1


@pytest.mark.parametrize("schedule", ["CRON_TZ=Europe/Berlin 0 3 * * *", "TZ=UTC 0 3 * * *"])
def test_the_api_server_refuses_a_time_zone_prefix_the_schema_refuses_too(cluster: Cluster,
                                                                         schedule: str):
    """Why the values schema refuses a TZ prefix in `schedule`: this API server would refuse the
    CronJob (spec.timeZone is the way), so the install would fail half-way instead of up front."""
    cj = one(manifests(render({"policies": [POLICY]}, kube_version=cluster.kube_version,
                              api_versions=cluster.api_versions)), "CronJob")
    cj["metadata"]["namespace"] = "default"
    cj["spec"]["schedule"] = schedule
    proc = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(cj), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "spec.schedule" in proc.stderr and "TZ" in proc.stderr, proc.stderr
    cj["spec"]["schedule"], cj["spec"]["timeZone"] = "0 3 * * *", "Europe/Berlin"
    kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(cj))
