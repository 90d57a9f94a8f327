"""Times bounces of a real leak by the chart's CronJob on the real node (scripts/bench.d/node-bounce
sets it up): prints one line per bounce and the medians."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import helm_python as helm

ROOT = Path(__file__).resolve().parents[2]
NS = "bench-node"
APP = "leaky"
THRESHOLD_MIB = 40
MIB = 1024 * 1024
ON_NODE = {
    "tolerations": [{"key": "bouncer.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"kubernetes.io/hostname": "real-node"},
}
POLICY = f"""apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {{name: leaky-memory}}
spec:
  target: {{namespaces: [{NS}], selector: {{matchLabels: {{app: {APP}}}}}, kinds: [Deployment]}}
  triggers: {{memory: {{above: {THRESHOLD_MIB}Mi}}}}
  cooldown: 20s
"""


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(["kubectl", "--request-timeout=20s", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout if proc.returncode == 0 else ""


def get(*args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(kubectl("get", *args, "-o", "json"))
    return out


def quantity(q: str) -> int:
    for suffix, factor in (("Ki", 1024), ("Mi", MIB), ("Gi", 1024 * MIB)):
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * factor
    return int(q)


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP, "namespace": NS},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": APP}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": APP}}, "spec": {
                **ON_NODE, "terminationGracePeriodSeconds": 5, "enableServiceLinks": False,
                "automountServiceAccountToken": False,
                "containers": [{"name": "leaky", "image": os.environ["LEAKY_IMAGE"],
                                "imagePullPolicy": "Never", "args": ["1", "1"]}]}},
        },
    }


def current_pod() -> str | None:
    pods = [p for p in get("pods", "-n", NS, "-l", f"app={APP}")["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return max(pods, key=lambda p: p["metadata"]["creationTimestamp"])["metadata"]["name"] if pods else None


def bounce_of(pod: str) -> tuple[dict[str, Any], dict[str, Any], float] | None:
    """The Job whose report bounced POD, the report's row, and when its log says the bounce was
    done (verified; the log's timestamps have microseconds, the report's whole seconds)."""
    for job in get("jobs", "-n", NS)["items"]:
        if not job["status"].get("succeeded"):
            continue
        lines = []
        for line in kubectl("logs", "-n", NS, f"job/{job['metadata']['name']}", check=False).splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        done = [ts(e["timestamp"]) for e in lines
                if (e.get("fields") or {}).get("status") == "bounced"
                and e["fields"].get("workload") == f"deployment/{NS}/{APP}"]
        for report in (e for e in lines if e.get("kind") == "BounceReport"):
            for row in report["rows"]:
                if row["decision"] == "bounced" and (row.get("memory") or {}).get("pod") == pod and done:
                    return job, row, done[0]
    return None


def first_request(user: str, after: float) -> float | None:
    """When the API server received USER's first request at or after AFTER (audit log)."""
    log = Path(os.environ["BOUNCER_CLUSTER_DIR"]) / "audit.log"
    times = []
    for line in log.read_text().splitlines():
        e = json.loads(line)
        if e["user"]["username"] == user:
            t = ts(e["requestReceivedTimestamp"])
            if t >= after - 1:
                times.append(t)
    return min(times) if times else None


def one_round(n: int) -> dict[str, float]:
    deadline = time.monotonic() + 300
    pod = None
    crossed = None
    while time.monotonic() < deadline:
        pod = pod or current_pod()
        if pod and crossed is None:
            raw = kubectl("get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods/{pod}",
                          check=False)
            if raw:
                m = json.loads(raw)
                if sum(quantity(c["usage"]["memory"]) for c in m["containers"]) > THRESHOLD_MIB * MIB:
                    crossed = ts(m["timestamp"])
        if pod and crossed is not None:
            found = bounce_of(pod)
            if found:
                break
        time.sleep(2)
    else:
        sys.exit(f"round {n}: no bounce of {pod} within 5 minutes")
    job, row, verified = found
    name = job["metadata"]["name"]
    jpod = get("pods", "-n", NS, "-l", f"job-name={name}")["items"][0]
    pod_start = ts(jpod["status"]["startTime"])
    container_start = ts(jpod["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"])
    first = first_request(f"system:serviceaccount:{NS}:bouncer", pod_start)
    assert first is not None, f"no request by the ServiceAccount after {name}'s pod started"
    fig = {
        "start_to_container": container_start - pod_start,
        "start_to_first_request": first - pod_start,
        "crossed_to_job": ts(job["metadata"]["creationTimestamp"]) - crossed,
        "crossed_to_verified": verified - crossed,
        "rollout": row["durationSeconds"],
    }
    print(f"  bounce {n}: {pod} at {row['memory']['usage'] // MIB}Mi by Job {name}: pod start -> "
          f"container {fig['start_to_container']:.0f} s -> first API request "
          f"{fig['start_to_first_request']:.2f} s; threshold crossed -> Job created "
          f"{fig['crossed_to_job']:.0f} s -> bounce verified {fig['crossed_to_verified']:.0f} s "
          f"(rollout {fig['rollout']:.1f} s)", flush=True)
    # The next round waits for the new pod.
    wait = time.monotonic() + 60
    while current_pod() in (None, pod) and time.monotonic() < wait:
        time.sleep(1)
    return fig


def main() -> None:
    rounds = int(sys.argv[1])
    kubectl("create", "namespace", NS)
    kubectl("apply", "-f", "-", stdin=json.dumps(deployment()))
    repo, tag = os.environ["BOUNCER_IMAGE"].rsplit(":", 1)
    cfg = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=NS)
    cfg.install(str(ROOT / "helm" / "bouncer"), "bouncer", {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "schedule": "* * * * *", "startingDeadlineSeconds": 50, "rolloutTimeout": "90s",
        "rbac": {"namespaces": [NS]}, "policies": {"leaky.yaml": POLICY}, **ON_NODE,
    }, namespace=NS, timeout=60)
    cfg.close()
    print(f"\n== a bounce on the real node (chart CronJob every minute; leak 1 MiB/s; threshold "
          f"{THRESHOLD_MIB}Mi; {rounds} bounces)", flush=True)
    figs = [one_round(n + 1) for n in range(rounds)]

    def med(key: str) -> float:
        return statistics.median(f[key] for f in figs)

    print(f"  median: Job pod start -> container start {med('start_to_container'):.0f} s -> first API "
          f"request {med('start_to_first_request'):.2f} s; threshold crossed -> Job created "
          f"{med('crossed_to_job'):.0f} s (the schedule's tick) -> bounce verified "
          f"{med('crossed_to_verified'):.0f} s (rollout {med('rollout'):.1f} s)")


if __name__ == "__main__":
    main()
