"""bouncer as its users run it, on a real node: the image scripts/image builds, the chart installed
with Helm, its CronJob firing every minute, its Job pod running bouncer in-cluster under the
chart's ServiceAccount and securityContext, against a process whose working set really grows
(measured by the real kubelet, served by metrics-server)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from conftest import (MIB, ON_NODE, ROOT, get, image, kubectl, leaky_deployment, parse_quantity,
                      pod_memory, running_pods, wait_until)

THRESHOLD_MIB = 40
# Leaks 1 MiB a second: over the threshold about 40 s after it starts, so a CronJob that fires
# every minute finds it over within two fires, and a restarted pod is still far below it when
# metrics-server first reports it (about 20 s after it starts).
RATE_MIB = 1


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def chart_values(namespace: str, policy: dict[str, Any], **extra: Any) -> dict[str, Any]:
    repo, tag = image("bouncer").rsplit(":", 1)
    return {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "schedule": "* * * * *",
        "startingDeadlineSeconds": 50,
        "rolloutTimeout": "90s",
        "rbac": {"namespaces": [namespace]},
        "policies": {"leaky.yaml": yaml.safe_dump(policy)},
        "tolerations": ON_NODE["tolerations"],
        "nodeSelector": ON_NODE["nodeSelector"],
        **extra,
    }


def memory_policy(namespace: str, app: str, trigger: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "bouncer.dev/v1alpha1", "kind": "BouncePolicy",
        "metadata": {"name": f"{app}-memory"},
        "spec": {
            "target": {"namespaces": [namespace], "selector": {"matchLabels": {"app": app}},
                       "kinds": ["Deployment"]},
            "triggers": {"memory": trigger},
            # Counted from the oldest pod's start too: short, so the pod that just started is due.
            "cooldown": "20s",
            **spec,
        },
    }


def job_log(namespace: str, job: str) -> list[dict[str, Any]]:
    out = kubectl("logs", "-n", namespace, f"job/{job}", check=False).stdout
    lines = []
    for line in out.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            lines.append({"unparsed": line})
    return lines


def reports(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`kubectl logs job/... | jq 'select(.kind == "BounceReport")'`"""
    return [line for line in lines if line.get("kind") == "BounceReport"]


def finished_jobs(namespace: str) -> list[dict[str, Any]]:
    jobs = get("jobs", "-n", namespace, "-l", "app.kubernetes.io/name=bouncer")["items"]
    done = [j for j in jobs if j["status"].get("succeeded") or j["status"].get("failed")]
    return sorted(done, key=lambda j: j["metadata"]["creationTimestamp"])


def audit_patches(namespace: str, name: str) -> list[tuple[float, str]]:
    """(time, user) of each PATCH of deployment NAMESPACE/NAME, as the API server's audit log
    (scripts/cluster writes it) records them, in order."""
    log = Path(os.environ["BOUNCER_CLUSTER_DIR"]) / "audit.log"
    patches = []
    for line in log.read_text().splitlines():
        e = json.loads(line)
        ref = e.get("objectRef") or {}
        if (e.get("verb") == "patch" and ref.get("resource") == "deployments"
                and not ref.get("subresource") and ref.get("namespace") == namespace
                and ref.get("name") == name):
            patches.append((ts(e["stageTimestamp"]), e["user"]["username"]))
    return patches


def test_cronjob_bounces_a_real_leak(namespace: str, helm_release) -> None:
    app = "leaky"
    kubectl("apply", "-f", "-", stdin=json.dumps(
        leaky_deployment(app, namespace, mib_per_step=RATE_MIB)))
    first = wait_until("the leaky pod to run", 60, lambda: running_pods(namespace, app))[0]
    old_pod = first["metadata"]["name"]
    release = helm_release(namespace, chart_values(
        namespace, memory_policy(namespace, app, {"above": f"{THRESHOLD_MIB}Mi"})))
    assert release["status"] == "deployed", {k: v for k, v in release.items() if k != "manifest"}

    # The real working set, as the kubelet measures it, climbs past the threshold.
    samples: list[tuple[float, int]] = []

    def over() -> bool:
        usage = pod_memory(namespace, old_pod)
        if usage is not None:
            samples.append((time.time(), usage))
        return usage is not None and usage > THRESHOLD_MIB * MIB

    wait_until(f"{old_pod}'s working set to pass {THRESHOLD_MIB}Mi", 120, over, every=2)
    crossed = samples[-1][0]
    assert samples[0][1] < samples[-1][1], f"the working set did not grow: {samples}"

    # A Job of the CronJob bounces it: the report is in the Job's log.
    def bounced_job() -> tuple[dict[str, Any], dict[str, Any]] | None:
        for job in finished_jobs(namespace):
            for report in reports(job_log(namespace, job["metadata"]["name"])):
                rows = [r for r in report["rows"] if r["workload"]["name"] == app]
                if rows and rows[0]["decision"] == "bounced":
                    return job, report
        return None

    job, report = wait_until("a CronJob run that bounces the leaky app", 200, bounced_job, every=3)
    name = job["metadata"]["name"]
    assert job["status"].get("succeeded") == 1, job["status"]
    row = next(r for r in report["rows"] if r["workload"]["name"] == app)
    assert row["memory"]["pod"] == old_pod and row["memory"]["usage"] > THRESHOLD_MIB * MIB, row
    assert [t["type"] for t in row["triggers"]] == ["memory"], row
    assert report["summary"]["bounced"] == 1 and report["summary"]["failed"] == 0, report["summary"]
    assert report["mode"] == "run"

    # It ran as the chart says: the release's ServiceAccount, uid 65532, read-only root, and
    # nothing it did needed a write to its filesystem.
    pod = get("pods", "-n", namespace, "-l", f"job-name={name}")["items"][0]
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "bouncer"
    c = spec["containers"][0]
    assert c["image"] == image("bouncer") and c["imagePullPolicy"] == "Never"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsUser"] == 65532 and spec["securityContext"]["runAsNonRoot"]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    text = json.dumps(job_log(namespace, name))
    assert "Read-only file system" not in text and "os error 30" not in text, text
    # The restartedAt patch and the attempt mark's: all by the chart's ServiceAccount.
    assert {user for _, user in audit_patches(namespace, app)} == {
        f"system:serviceaccount:{namespace}:bouncer"}

    # The Bounced Event is on the workload.
    events = get("events", "-n", namespace,
                 "--field-selector", f"reason=Bounced,involvedObject.name={app}")["items"]
    assert [e["involvedObject"]["kind"] for e in events] == ["Deployment"], events

    # The restarted pod's memory starts low again.
    new = wait_until("the restarted pod", 60, lambda: [
        p for p in running_pods(namespace, app) if p["metadata"]["name"] != old_pod])[0]
    new_pod = new["metadata"]["name"]
    assert new["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
    fresh = wait_until(f"metrics for {new_pod}", 90, lambda: pod_memory(namespace, new_pod), every=2)
    assert fresh < THRESHOLD_MIB * MIB and fresh < row["memory"]["usage"], (fresh, row["memory"])

    started = ts(job["status"]["startTime"])
    verified = ts(row["completedAt"])
    print(f"\nbounce latency on the real node: threshold crossed at +0 s (metrics {samples[-1][1] // MIB}Mi),"
          f" Job {name} started at {started - crossed:+.0f} s, bounce verified at"
          f" {verified - crossed:+.0f} s ({row['durationSeconds']:.1f} s rollout);"
          f" restarted pod at {fresh // MIB}Mi")


def test_a_failed_bounce_fails_the_job(namespace: str, helm_release) -> None:
    """The new pod cannot be scheduled (its memory request only fits once): the rollout times
    out, the run fails, and so does the Job (exit 1, backoffLimit 0)."""
    app = "stuck"
    allocatable = get("node", "real-node")["status"]["allocatable"]["memory"]
    request = f"{int(parse_quantity(allocatable) * 0.6) // MIB}Mi"
    deployment = leaky_deployment(app, namespace, mib_per_step=1)
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": request}}
    kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    wait_until("the stuck pod to run", 60, lambda: running_pods(namespace, app))
    helm_release(namespace, chart_values(namespace, memory_policy(
        namespace, app, {"above": "1Mi"}, restart={"timeout": "15s"})))

    def failed_job() -> dict[str, Any] | None:
        jobs = [j for j in finished_jobs(namespace) if j["status"].get("failed")]
        return jobs[0] if jobs else None

    job = wait_until("a CronJob run that fails", 200, failed_job, every=3)
    name = job["metadata"]["name"]
    failed = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["status"] == "True", job["status"]
    pod = get("pods", "-n", namespace, "-l", f"job-name={name}")["items"]
    assert len(pod) == 1, "backoffLimit 0: one pod, no retry"
    assert pod[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    (report,) = reports(job_log(namespace, name))
    row = next(r for r in report["rows"] if r["workload"]["name"] == app)
    assert row["decision"] == "failed", row
    assert report["summary"]["failed"] == 1 and report["summary"]["bounced"] == 0
    events = get("events", "-n", namespace,
                 "--field-selector", f"reason=BounceFailed,involvedObject.name={app}")["items"]
    assert [e["involvedObject"]["kind"] for e in events] == ["Deployment"], events


GATE = "bouncer.dev/test-ready"


def set_ready(namespace: str, pod: str) -> None:
    """Opens the pod's readiness gate (a strategic merge keeps the kubelet's own conditions)."""
    kubectl("patch", "pod", "-n", namespace, pod, "--subresource=status", "-p",
            json.dumps({"status": {"conditions": [{"type": GATE, "status": "True"}]}}))


def test_concurrency_forbid_holds_across_a_slow_rollout(namespace: str, helm_release) -> None:
    """A bounce whose rollout outlasts the next schedule tick: the CronJob starts no second Job
    (concurrencyPolicy: Forbid), and the workload is restarted exactly once."""
    app = "slow"
    deployment = leaky_deployment(app, namespace, mib_per_step=1)
    # Pods are Ready only when the test says so: the new pod of the bounce holds the rollout open.
    deployment["spec"]["template"]["spec"]["readinessGates"] = [{"conditionType": GATE}]
    kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    first = wait_until("the slow pod to run", 60, lambda: running_pods(namespace, app))[0]
    set_ready(namespace, first["metadata"]["name"])
    kubectl("rollout", "status", "-n", namespace, f"deployment/{app}", "--timeout=60s")
    helm_release(namespace, chart_values(namespace, memory_policy(
        namespace, app, {"above": "1Mi"}, restart={"timeout": "5m"}), rolloutTimeout="5m"))

    new = wait_until("the bounce's new pod", 200, lambda: [
        p for p in get("pods", "-n", namespace, "-l", f"app={app}")["items"]
        if p["metadata"]["name"] != first["metadata"]["name"]], every=2)[0]
    # (An earlier run may have found it not due yet: the new pod's metrics came later.)
    def active() -> list[str]:
        return [j["metadata"]["name"] for j in get("jobs", "-n", namespace)["items"]
                if j["status"].get("active")]

    running = active()
    assert len(running) == 1, running
    name = running[0]
    before = {j["metadata"]["name"] for j in get("jobs", "-n", namespace)["items"]}
    # Past the next schedule tick, with that run still waiting on the rollout.
    tick = (int(time.time()) // 60 + 1) * 60
    time.sleep(max(0.0, tick - time.time()) + 15)
    assert active() == [name]
    assert {j["metadata"]["name"] for j in get("jobs", "-n", namespace)["items"]} == before
    skipped = get("events", "-n", namespace, "--field-selector",
                  "reason=JobAlreadyActive,involvedObject.kind=CronJob")["items"]
    assert skipped, "the CronJob controller did not report the tick it skipped"

    set_ready(namespace, new["metadata"]["name"])
    wait_until(f"job/{name} to succeed", 120, lambda: get("job", "-n", namespace, name)["status"]
               .get("succeeded"), every=2)
    (report,) = reports(job_log(namespace, name))
    assert [r["decision"] for r in report["rows"]] == ["bounced"], report["rows"]
    # Restarted once while it ran: one patch (restartedAt and the attempt mark together) before
    # the Job completed. A run the CronJob starts afterwards for the tick it skipped (within
    # startingDeadlineSeconds) comes strictly after it, as Forbid promises.
    done = ts(get("job", "-n", namespace, name)["status"]["completionTime"])
    patches = [t for t, _ in audit_patches(namespace, app)]
    assert len([t for t in patches if t <= done]) == 1, (patches, done)
    # Jobs from before the bounce's (runs that found it not due yet) are not "later".
    later = [j for j in get("jobs", "-n", namespace)["items"] if j["metadata"]["name"] not in before]
    # Forbid counts active Jobs: a Job stops being active when its pod ends, a moment before the
    # Job controller stamps completionTime, and the run for the skipped tick may start in between.
    (pod,) = get("pods", "-n", namespace, "-l", f"job-name={name}")["items"]
    ended = ts(pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
    assert all(ts(j["metadata"]["creationTimestamp"]) >= ended for j in later), (later, ended)


def run_validate(namespace: str, name: str, files: dict[str, str]) -> tuple[int, str]:
    """`docker run -v "$PWD/policies:/p:ro" bouncer:TAG validate /p`, as a pod on the real node."""
    kubectl("create", "configmap", "-n", namespace, name,
            *[f"--from-literal={k}={v}" for k, v in files.items()])
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {**ON_NODE, "restartPolicy": "Never", "automountServiceAccountToken": False,
                 "enableServiceLinks": False,
                 "containers": [{"name": "bouncer", "image": image("bouncer"),
                                 "imagePullPolicy": "Never", "args": ["validate", "/p"],
                                 "securityContext": {"readOnlyRootFilesystem": True,
                                                     "allowPrivilegeEscalation": False},
                                 "volumeMounts": [{"name": "p", "mountPath": "/p",
                                                   "readOnly": True}]}],
                 "volumes": [{"name": "p", "configMap": {"name": name}}]},
    }
    kubectl("apply", "-f", "-", stdin=json.dumps(pod))

    def terminated() -> dict[str, Any] | None:
        statuses = get("pod", "-n", namespace, name)["status"].get("containerStatuses") or []
        return statuses[0]["state"].get("terminated") if statuses else None

    state = wait_until(f"pod {name} to finish", 90, terminated)
    log = kubectl("logs", "-n", namespace, name).stdout + state.get("message", "")
    return state["exitCode"], log


def test_validate_runs_in_the_image(namespace: str) -> None:
    policies = {p.name: p.read_text() for p in sorted((ROOT / "policies").glob("*.yaml"))}
    code, log = run_validate(namespace, "good", policies)
    assert code == 0, log
    bad = {"bad.yaml": yaml.safe_dump(memory_policy(namespace, "x", {"above": "lots"}))}
    code, log = run_validate(namespace, "bad", bad)
    assert code == 2 and "bad.yaml" in log, (code, log)


def oom_kills(pod: dict[str, Any]) -> int:
    status = (pod["status"].get("containerStatuses") or [{}])[0]
    last = status.get("lastState", {}).get("terminated") or {}
    return status.get("restartCount", 0) if last.get("reason") == "OOMKilled" else 0


def test_a_real_oom_against_a_percent_of_limit_bounce(namespace: str, helm_release) -> None:
    """Two copies of a leak under a 120Mi limit: the kernel OOM-kills the one no policy covers;
    a percentOfLimit policy restarts the other first, on the CronJob's schedule."""
    limit_mib, percent = 120, 20
    for app in ("unguarded", "guarded"):
        kubectl("apply", "-f", "-", stdin=json.dumps(leaky_deployment(
            app, namespace, mib_per_step=RATE_MIB, limit=f"{limit_mib}Mi")))
    t0 = time.time()
    helm_release(namespace, chart_values(namespace, memory_policy(
        namespace, "guarded", {"percentOfLimit": percent})))

    def killed() -> list[dict[str, Any]]:
        return [p for p in get("pods", "-n", namespace, "-l", "app=unguarded")["items"]
                if oom_kills(p)]

    (victim,) = wait_until("the kernel to OOM-kill the unguarded leak", 240, killed, every=2)
    terminated = victim["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert terminated["exitCode"] == 137
    oom_at = ts(terminated["finishedAt"])

    bounces = [(job, row) for job in finished_jobs(namespace)
               for report in reports(job_log(namespace, job["metadata"]["name"]))
               for row in report["rows"] if row["workload"]["name"] == "guarded"
               and row["decision"] == "bounced"]
    assert bounces, "no run bounced the guarded leak before the other one was OOM-killed"
    job, row = bounces[0]
    assert row["memory"]["threshold"] == limit_mib * MIB * percent // 100, row["memory"]
    bounced_at = ts(row["completedAt"])
    assert bounced_at < oom_at
    guarded = get("pods", "-n", namespace, "-l", "app=guarded")["items"]
    assert not [p for p in guarded if oom_kills(p)], "the guarded leak was OOM-killed too"
    print(f"\nreal OOM vs bounce ({limit_mib}Mi limit, {RATE_MIB} MiB/s): unguarded OOM-killed at"
          f" +{oom_at - t0:.0f} s (exit 137), guarded bounced at +{bounced_at - t0:.0f} s by"
          f" {job['metadata']['name']} at {row['memory']['usage'] // MIB}Mi"
          f" ({percent}% of the limit is {limit_mib * percent // 100}Mi)")
