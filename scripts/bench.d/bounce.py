#!/usr/bin/env python3
"""Prepares the bounce round of `scripts/bench`: three small Deployments that the KWOK node runs,
in namespace `bench-bounce`, whose pods' memory (the memory-model annotation, 200Mi) is above the
round's 100Mi threshold, so that one `bouncer run` restarts all three, one after the other.

Idempotent: the Deployments are kept between runs and only need to be settled, and metrics-server
must report their current pods (the previous round replaced them). Prints the namespace.

Connection settings come from the environment: BENCH_SERVER, BENCH_CA, BENCH_TOKEN.
"""

import json

from load import MEMORY_BASE, NODE, create, list_all, log, request, wait_for

NS = "bench-bounce"
APPS = ["leak-a", "leak-b", "leak-c"]
REPLICAS = 2


def deployment(app):
    labels = {"app": app, "bench-bounce": "true"}
    return {
        "metadata": {"name": app, "labels": labels},
        "spec": {
            "replicas": REPLICAS,
            # Longer than bouncer's 2 s verification settle, as real rollouts are, so the gap
            # to the next bounce shows bouncer's own overhead rather than the settle.
            "minReadySeconds": 3,
            "selector": {"matchLabels": {"app": app}},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": labels, "annotations": {MEMORY_BASE: "200Mi"}}, "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": "registry.example.com/bench/leak:1",
                                "resources": {"limits": {"memory": "256Mi"}}}],
            }},
        },
    }


def settled():
    """Deployments whose rollout is complete by kubectl's rules and whose old pods are gone."""
    done = 0
    for app in APPS:
        d = request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{app}")
        st = d.get("status") or {}
        done += (st.get("observedGeneration", 0) >= d["metadata"]["generation"]
                 and st.get("updatedReplicas", 0) == REPLICAS and st.get("replicas", 0) == REPLICAS
                 and st.get("availableReplicas", 0) == REPLICAS)
    pods = [p for p in list_all(f"/api/v1/namespaces/{NS}/pods") if not p["metadata"].get("deletionTimestamp")]
    return done + (len(pods) == len(APPS) * REPLICAS), len(APPS) + 1


def main():
    create("/api/v1/namespaces", {"metadata": {"name": NS}})
    wait_for(f"serviceaccount {NS}/default", lambda: (
        int(request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default", tolerate=(404,)) is not None), 1), 60)
    for app in APPS:
        create(f"/apis/apps/v1/namespaces/{NS}/deployments", deployment(app))
    wait_for("the bounce Deployments to settle", settled, 300)
    def measured():
        pods = {p["metadata"]["name"] for p in list_all(f"/api/v1/namespaces/{NS}/pods")
                if not p["metadata"].get("deletionTimestamp")}
        have = {m["metadata"]["name"] for m in list_all(f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods")}
        return len(pods & have), len(pods)

    wait_for("metrics-server to report the bounce round's pods", measured, 300)
    log(f"{len(APPS)} Deployments x {REPLICAS} pods settled in {NS}, memory 200Mi")
    print(json.dumps({"namespace": NS, "workloads": APPS}))


if __name__ == "__main__":
    main()
