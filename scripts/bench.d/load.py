#!/usr/bin/env python3
"""Loads a cluster with a realistic, deterministic fleet for `scripts/bench` (standard library only).

Every namespace `bench-NNN` holds the same 100 pods in 20 workloads:
  14 Deployments x 5 replicas (pods created by the real ReplicaSet controller),
   4 StatefulSets x 7 replicas (2 containers each; created by the real StatefulSet controller),
   2 bare pods,
plus one PodDisruptionBudget. `--pods N` loads ceil(N/100) namespaces; the loader is idempotent
(existing objects are kept), so a bigger N only adds namespaces.

`--shape bare` loads the other fleet instead: namespaces `bare-NNN` of 100 bare pods in 20 label
groups of 5 (pods that share every label, as a fleet of single-pod servers does), one workload
each. A cluster holds one shape at a time: loading one first deletes the other's namespaces.

Pods are bound to the benchmark cluster's KWOK nodes by their template (`nodeName`, 5,000 pods
per node: namespaces bench-000..049 on kwok-node-1, 050..099 on kwok-node-2...), so KWOK runs
them (Running and Ready, with IPs) and serves their kubelet resource metrics, which the real
metrics-server scrapes. Each workload's memory is set by the test memory-model annotation on its
pod template (tests/cluster/kwok.yaml): about 1 workload in 10 uses more than 85% of its limit.
The loader waits until metrics-server reports every pod.

Connection settings come from the environment: BENCH_SERVER, BENCH_CA, BENCH_TOKEN.
"""

import argparse
import hashlib
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

PODS_PER_NS = 100
DEPLOYMENTS, DEPLOYMENT_REPLICAS = 14, 5
STATEFULSETS, STATEFULSET_REPLICAS = 4, 7
BARE = 2
LIMIT_MI = 256
SIDECAR_LIMIT_MI = 64
NODE = os.environ.get("BENCH_NODE", "kwok-node-1")
# Pods per KWOK node: one node's resource-metrics endpoint with 20,000 pods takes longer than
# metrics-server's scrape timeout, so namespace i goes to node kwok-node-(1 + i // 50).
PODS_PER_NODE = 5000
MEMORY_BASE = "bouncer.dev/test-memory-base"

SERVER = urllib.parse.urlparse(os.environ["BENCH_SERVER"])
CTX = ssl.create_default_context(cafile=os.environ["BENCH_CA"])
HEADERS = {"Authorization": "Bearer " + os.environ["BENCH_TOKEN"], "Accept": "application/json",
           "User-Agent": "bouncer-bench-loader"}
_local = threading.local()


def log(msg):
    print(f"load: {msg}", file=sys.stderr, flush=True)


def request(method, path, body=None, content_type="application/json", ok=(200, 201), tolerate=()):
    """One request on this thread's keep-alive connection, retried on overload and lost connections."""
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    headers = dict(HEADERS)
    if data is not None:
        headers["Content-Type"] = content_type
    for attempt in range(30):
        conn = getattr(_local, "conn", None)
        if conn is None:
            conn = _local.conn = http.client.HTTPSConnection(SERVER.hostname, SERVER.port, context=CTX, timeout=120)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            _local.conn = None
            time.sleep(min(0.1 * 2**attempt, 2))
            continue
        if resp.status in ok:
            return json.loads(payload) if payload else None
        if resp.status in tolerate:
            return None
        if resp.status in (429, 500, 503, 504):
            time.sleep(min(0.1 * 2**attempt, 2))
            continue
        raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {payload[:300].decode(errors='replace')}")
    raise RuntimeError(f"{method} {path}: gave up after retries")


def create(path, obj):
    request("POST", path, obj, tolerate=(409,))


def parallel(fn, items, workers=16):
    items = list(items)
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass
    return len(items)


def list_all(path, params=""):
    """Every item of a paged LIST."""
    items, cont = [], ""
    while True:
        q = f"?limit=500{params}" + (f"&continue={urllib.parse.quote(cont)}" if cont else "")
        page = request("GET", path + q)
        items.extend(page["items"])
        cont = page["metadata"].get("continue", "")
        if not cont:
            return items


# --- the fleet ---------------------------------------------------------------------------------

def ns_name(i, prefix="bench"):
    return f"{prefix}-{i:03d}"


def labels(app, tier):
    return {"bench": "true", "app": app, "tier": tier, "app.kubernetes.io/name": app,
            "app.kubernetes.io/part-of": "bench", "app.kubernetes.io/managed-by": "bench-loader"}


def container(name, limit_mi, port):
    return {
        "name": name,
        "image": f"registry.example.com/bench/{name}:1.4.2",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--listen", f":{port}", "--log-format", "json"],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [{"name": "GOMAXPROCS", "value": "1"}, {"name": "LOG_LEVEL", "value": "info"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": f"{limit_mi}Mi"}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
    }


def node_of(ns):
    return f"kwok-node-{1 + int(ns.rsplit('-', 1)[1]) * PODS_PER_NS // PODS_PER_NODE}"


def pod_spec(sidecar, node=NODE):
    containers = [container("app", LIMIT_MI, 8080)]
    if sidecar:
        containers.append(container("proxy", SIDECAR_LIMIT_MI, 9090))
    return {"nodeName": node, "containers": containers, "terminationGracePeriodSeconds": 5}


def template(app, tier, ns, sidecar=False):
    # The model's first container ("app") carries the usage; a sidecar reports 4Mi.
    memory = f"{usage_mi(ns + '/' + app, LIMIT_MI)}Mi"
    return {"metadata": {"labels": labels(app, tier),
                         "annotations": {"bench/owner": "team-" + app[-2:], MEMORY_BASE: memory}},
            "spec": pod_spec(sidecar, node_of(ns))}


def namespace_objects(ns):
    """(path, object) for everything in one namespace, parents first."""
    out = [("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {"bench": "true"}}})]
    for d in range(DEPLOYMENTS):
        app = f"web-{d:02d}"
        out.append((f"/apis/apps/v1/namespaces/{ns}/deployments", {
            "metadata": {"name": app, "labels": labels(app, "web")},
            "spec": {"replicas": DEPLOYMENT_REPLICAS, "selector": {"matchLabels": {"app": app}},
                     "template": template(app, "web", ns)},
        }))
    for s in range(STATEFULSETS):
        app = f"db-{s:02d}"
        out.append((f"/apis/apps/v1/namespaces/{ns}/statefulsets", {
            "metadata": {"name": app, "labels": labels(app, "db")},
            "spec": {"replicas": STATEFULSET_REPLICAS, "serviceName": app, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": {"app": app}}, "template": template(app, "db", ns, sidecar=True)},
        }))
    for b in range(BARE):
        app = f"job-{b:02d}"
        out.append((f"/api/v1/namespaces/{ns}/pods", {
            "metadata": {"name": app, **template(app, "batch", ns)["metadata"]}, "spec": pod_spec(False, node_of(ns)),
        }))
    out.append((f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", {
        "metadata": {"name": "web-00"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web-00"}}},
    }))
    return out


BARE_GROUPS, BARE_GROUP_PODS = 20, 5
# Namespace prefix of each shape.
SHAPES = {"owned": "bench", "bare": "bare"}


def bare_namespace_objects(ns):
    """(path, object) for one namespace of the bare shape, the namespace first."""
    out = [("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {"bench": "true"}}})]
    for g in range(BARE_GROUPS):
        app = f"mcp-{g:02d}"
        for k in range(BARE_GROUP_PODS):
            name = f"{app}-{k}"
            memory = f"{usage_mi(ns + '/' + name, LIMIT_MI)}Mi"
            out.append((f"/api/v1/namespaces/{ns}/pods", {
                "metadata": {"name": name, "labels": labels(app, "mcp"),
                             "annotations": {"bench/owner": "team-" + app[-2:], MEMORY_BASE: memory}},
                "spec": pod_spec(False, node_of(ns)),
            }))
    return out


def delete_shape(prefix):
    """Deletes the bench namespaces of the other shape and waits until their pods are gone."""
    gone = [n["metadata"]["name"] for n in list_all("/api/v1/namespaces", "&labelSelector=bench%3Dtrue")
            if n["metadata"]["name"].startswith(prefix + "-") and n["metadata"]["name"] != "bench-bounce"]
    if not gone:
        return
    log(f"deleting the {len(gone)} namespaces of the other shape ({prefix}-*)")
    # Pods first, without grace: the namespace controller would delete them at its own pace.
    parallel(lambda ns: request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0",
                                ok=(200,), tolerate=(404,)), gone)
    parallel(lambda ns: request("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202), tolerate=(404,)), gone)
    wait_for(f"namespaces {prefix}-* to be gone", lambda: (
        len(gone) - sum(1 for n in list_all("/api/v1/namespaces", "&labelSelector=bench%3Dtrue")
                        if n["metadata"]["name"] in gone), len(gone)), 900)


def count_pods():
    return sum(1 for _ in list_all("/api/v1/pods", "&labelSelector=bench%3Dtrue"))


def wait_for(what, check, timeout):
    deadline = time.time() + timeout
    while True:
        done, total = check()
        if done >= total:
            return
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}: {done}/{total}")
        log(f"  waiting for {what}: {done}/{total}")
        time.sleep(3)


def fraction(name):
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") / 2**32


def usage_mi(name, limit_mi):
    """Deterministic usage: 1 in 10 above 85% of the limit, the rest between 20% and 80%."""
    f = fraction(name)
    if f < 0.1:
        return int(limit_mi * (0.86 + f))  # 86%..96%
    return int(limit_mi * (0.2 + 0.6 * (f - 0.1) / 0.9))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="owned")
    args = ap.parse_args()
    prefix = SHAPES[args.shape]
    namespaces = [ns_name(i, prefix) for i in range(max(1, -(-args.pods // PODS_PER_NS)))]
    expected = len(namespaces) * PODS_PER_NS
    t0 = time.time()
    for other in SHAPES.values():
        if other != prefix:
            delete_shape(other)
    extra = [n["metadata"]["name"] for n in list_all("/api/v1/namespaces", "&labelSelector=bench%3Dtrue")
             if n["metadata"]["name"] not in namespaces and n["metadata"]["name"].startswith(prefix + "-")]
    if extra:
        raise SystemExit(f"load: the cluster already holds {len(extra) + len(namespaces)} bench namespaces, more than "
                         f"the {len(namespaces)} asked for: measure smaller sizes on a fresh cluster")
    objects = [(bare_namespace_objects if args.shape == "bare" else namespace_objects)(ns) for ns in namespaces]
    parallel(lambda o: create(*o), [o[0] for o in objects], args.workers)
    # A new namespace's default ServiceAccount (needed for pods) takes a moment to appear.
    parallel(lambda ns: wait_for(f"serviceaccount {ns}/default", lambda: (
        int(request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default", tolerate=(404,)) is not None), 1), 60),
        namespaces, args.workers)
    n = parallel(lambda o: create(*o), [o for objs in objects for o in objs[1:]], args.workers)
    log(f"{len(namespaces)} namespaces, {n} objects created or present ({time.time() - t0:.0f} s)")

    wait_for("pods created by the controllers", lambda: (count_pods(), expected), 1800)
    log(f"{expected} pods exist ({time.time() - t0:.0f} s)")


    def settled():
        ready, total = 0, 0
        for kind in ("deployments", "statefulsets"):
            for o in list_all(f"/apis/apps/v1/{kind}", "&labelSelector=bench%3Dtrue"):
                st, want = o.get("status") or {}, o["spec"]["replicas"]
                ok = st.get("readyReplicas", 0) == want and st.get("observedGeneration", 0) >= o["metadata"]["generation"]
                if kind == "deployments":
                    ok = ok and st.get("availableReplicas", 0) == want
                ready, total = ready + ok, total + 1
        return ready, total

    if args.shape == "owned":
        wait_for("controllers to report every workload ready", settled, 1800)
    else:
        wait_for("every bare pod ready", lambda: (sum(
            1 for p in list_all("/api/v1/pods", "&labelSelector=bench%3Dtrue")
            if any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (p.get("status") or {}).get("conditions") or [])), expected), 1800)
    # metrics-server has a pod once it has scraped its node twice after the pod started.
    wait_for("metrics-server to report every pod", lambda: (sum(1 for _ in list_all(
        "/apis/metrics.k8s.io/v1beta1/pods", "&labelSelector=bench%3Dtrue")), expected), 600)
    log(f"loaded {expected} pods in {len(namespaces)} namespaces in {time.time() - t0:.0f} s")
    print(json.dumps({"pods": expected, "namespaces": len(namespaces), "shape": args.shape,
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
