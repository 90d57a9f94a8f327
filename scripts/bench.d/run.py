#!/usr/bin/env python3
"""Runs the `scripts/bench` contenders against a loaded cluster and prints the tables.

Contenders, run in alternation (a warm-up round first, then medians):
  bouncer   `bouncer plan` with one percentOfLimit: 85 memory policy over every bench pod
  floor     the raw LISTs the plan needs with curl: one request per kind, sequential
  diy       `kubectl get pods -A -o json` + `kubectl get --raw` PodMetrics + jq, same decision

Wall time is measured around the process; peak RSS is /usr/bin/time -v's maximum resident set
size (for the DIY pipeline: its largest process). bouncer's requests are counted from the API
server's audit log (user agent `bouncer/`).

Environment: BENCH_SERVER, BENCH_CA, BENCH_TOKEN, KUBECONFIG, BENCH_KUBECTL, BENCH_BOUNCER,
BENCH_AUDIT_LOG.
"""

import argparse
import collections
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 500

# What `bouncer plan` reads, one URL per kind (PodDisruptionBudgets: policy/v1beta1 on v1.20).
KINDS = [
    ("pods", "/api/v1/pods"),
    ("replicasets", "/apis/apps/v1/replicasets"),
    ("deployments", "/apis/apps/v1/deployments"),
    ("statefulsets", "/apis/apps/v1/statefulsets"),
    ("daemonsets", "/apis/apps/v1/daemonsets"),
    ("poddisruptionbudgets", "/apis/policy/v1beta1/poddisruptionbudgets"),
    ("namespaces", "/api/v1/namespaces"),
    ("pods.metrics.k8s.io", "/apis/metrics.k8s.io/v1beta1/pods"),
]

POLICY = """\
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata:
  name: bench-memory
spec:
  target:
    selector:
      matchLabels:
        bench: "true"
    kinds: [Deployment, StatefulSet, Pod]
  triggers:
    memory:
      percentOfLimit: 85
  maxPerRun: 100000
  allowDowntime: true
"""


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def timed(cmd, stdout=subprocess.DEVNULL, env=None):
    """(wall seconds, peak RSS KiB) of one command under /usr/bin/time -v."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-v", "-o", tf.name, *cmd], stdout=stdout, stderr=subprocess.PIPE,
                           env=env)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed (exit {r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", tf.read())
        return wall, int(m.group(1))


class Bench:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.bouncer = os.environ["BENCH_BOUNCER"]
        self.audit = os.environ["BENCH_AUDIT_LOG"]
        os.makedirs(os.path.join(work, "policies"), exist_ok=True)
        with open(os.path.join(work, "policies", "bench.yaml"), "w") as f:
            f.write(POLICY)
        self.report = os.path.join(work, "report.json")
        curl = ["curl", "-sS", "--fail", "--cacert", os.environ["BENCH_CA"], "-H", "Accept: application/json",
                "-H", "Authorization: Bearer " + os.environ["BENCH_TOKEN"], "-A", "bouncer-bench-floor"]
        for _, path in KINDS:
            curl += ["-o", os.path.join(work, "floor.json"), os.environ["BENCH_SERVER"] + path]
        diy = os.path.join(HERE, "diy.sh")
        env = dict(os.environ, BOUNCER_POLICIES=os.path.join(work, "policies"), BOUNCER_MAX_BOUNCES="100000",
                   BOUNCER_LOG="warn")
        self.contenders = {
            "bouncer": lambda: timed([self.bouncer, "plan", "--output", "json", "--report", self.report], env=env),
            "floor": lambda: timed(curl),
            "diy": lambda: timed([diy], stdout=open(os.path.join(work, "diy.out"), "w")),
        }

    def audit_size(self):
        return os.path.getsize(self.audit)

    def audit_requests(self, start, end):
        """Requests by bouncer in [start, end) of the audit log: Counter of (verb, resource)."""
        counts = collections.Counter()
        with open(self.audit, "rb") as f:
            f.seek(start)
            for line in f.read(end - start).splitlines():
                if b'"bouncer/' not in line:
                    continue
                e = json.loads(line)
                if e.get("stage") != "ResponseComplete" or not e.get("userAgent", "").startswith("bouncer/"):
                    continue
                ref = e.get("objectRef", {})
                res = ref.get("resource", e.get("requestURI", "?"))
                if ref.get("apiGroup") == "metrics.k8s.io":
                    res += ".metrics.k8s.io"
                counts[(e["verb"], res)] += 1
        return counts

    def object_counts(self):
        """Objects per kind as the API server lists them (for the expected page counts)."""
        out = {}
        for kind, path in KINDS:
            r = subprocess.run(["curl", "-sS", "--fail", "--cacert", os.environ["BENCH_CA"],
                                "-H", "Authorization: Bearer " + os.environ["BENCH_TOKEN"],
                                "-A", "bouncer-bench-floor", os.environ["BENCH_SERVER"] + path],
                               capture_output=True, check=True)
            out[kind] = len(json.loads(r.stdout)["items"])
        return out

    def run(self, runs, warmup):
        """Alternating runs; returns {contender: [(wall, rss_kib)]} and bouncer's per-run requests."""
        results = {name: [] for name in self.contenders}
        offsets = []
        for i in range(warmup + runs):
            for name, fn in self.contenders.items():
                if name == "bouncer":
                    offsets.append(self.audit_size())
                wall, rss = fn()
                if i >= warmup:
                    results[name].append((wall, rss))
            log(f"  round {i + 1}/{warmup + runs}" + (" (warm-up)" if i < warmup else "") + ": " +
                ", ".join(f"{n} {results[n][-1][0]:.2f} s" for n in results if i >= warmup and results[n]))
        time.sleep(1.5)  # the audit backend writes ResponseComplete after the response
        offsets.append(self.audit_size())
        requests = [self.audit_requests(a, b) for a, b in zip(offsets, offsets[1:])]
        return results, requests

    def decisions(self):
        with open(self.report) as f:
            rep = json.load(f)
        with open(os.path.join(self.work, "diy.out")) as f:
            diy = [line.split() for line in f if line.strip()]
        # DIY prints pods with their owner; bouncer plans workloads: compare the workloads.
        workloads = {(ns, kind, re.sub(r"-[^-]+$", "", owner) if kind == "ReplicaSet" else owner)
                     for ns, _pod, kind, owner in diy}
        return rep["summary"]["planned"], len(workloads), len(diy)


def med(xs):
    return statistics.median(xs)


def fmt_mib(kib):
    return f"{kib / 1024:.1f} MiB"


def print_table(pods, results, requests, counts, load_s):
    b, f, d = (results[k] for k in ("bouncer", "floor", "diy"))
    n = len(b)
    print(f"\n### {pods} pods ({counts['namespaces']} namespaces, {counts['deployments']} Deployments, "
          f"{counts['statefulsets']} StatefulSets, {counts['pods.metrics.k8s.io']} PodMetrics; "
          f"load {load_s:.0f} s; median of {n})\n")
    print("| metric            | bouncer plan | raw LISTs (curl, sequential) | kubectl + jq (DIY) |")
    print("|-------------------|--------------|------------------------------|--------------------|")
    print(f"| wall time         | {med([x[0] for x in b]):9.2f} s  | {med([x[0] for x in f]):25.2f} s  "
          f"| {med([x[0] for x in d]):15.2f} s  |")
    print(f"| wall time min-max | {min(x[0] for x in b):.2f}-{max(x[0] for x in b):.2f} s  "
          f"| {min(x[0] for x in f):22.2f}-{max(x[0] for x in f):.2f} s  "
          f"| {min(x[0] for x in d):12.2f}-{max(x[0] for x in d):.2f} s  |")
    print(f"| peak RSS          | {fmt_mib(med([x[1] for x in b])):>12} | {fmt_mib(med([x[1] for x in f])):>28} "
          f"| {fmt_mib(med([x[1] for x in d])):>18} |")
    total = [sum(r.values()) for r in requests]
    kinds = len(KINDS)
    print(f"| API requests      | {med(total):12.0f} | {kinds:>28} | {2:>18} |")
    print()
    per = collections.Counter()
    for r in requests:
        per.update(r)
    same = all(r == requests[0] for r in requests)
    print(f"bouncer requests per run ({'identical in every run' if same else 'VARIES between runs'}):")
    for (verb, res), c in sorted(per.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {verb:5} {res:28} {c / len(requests):6.1f}")


def expected_lists(counts):
    return {("list", k): max(1, math.ceil(n / PAGE)) for k, n in counts.items()}


def check_requests(requests, counts):
    """Problems with bouncer's requests: anything but one LIST per kind per page of 500."""
    want = expected_lists(counts)
    problems = []
    for i, r in enumerate(requests):
        if dict(r) != want:
            extra = {k: v for k, v in r.items() if want.get(k) != v}
            problems.append(f"run {i + 1}: expected {sorted(want.items())}, differs in {sorted(extra.items())}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="5000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--work", required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    bench = Bench(args, args.work)
    scale = []
    failed = []
    for size in [int(s) for s in args.sizes.split(",")]:
        log(f"loading {size} pods")
        r = subprocess.run([sys.executable, os.path.join(HERE, "load.py"), "--pods", str(size)],
                           stdout=subprocess.PIPE, check=True)
        load = json.loads(r.stdout)
        counts = bench.object_counts()
        log(f"loaded in {load['seconds']} s; running {args.warmup} warm-up + {args.runs} rounds")
        results, requests = bench.run(args.runs, args.warmup)
        print_table(load["pods"], results, requests, counts, load["seconds"])
        planned, diy_workloads, diy_pods = bench.decisions()
        print(f"decisions: bouncer plans {planned} bounces; the DIY script finds {diy_pods} pods over 85% "
              f"in {diy_workloads} workloads" + ("" if planned == diy_workloads else "  <-- MISMATCH"))
        if planned != diy_workloads or planned == 0:
            failed.append(f"{size} pods: bouncer planned {planned}, DIY found {diy_workloads} workloads")
        failed += [f"{size} pods: {p}" for p in check_requests(requests, counts)]
        scale.append((load["pods"], results))
    if len(scale) > 1:
        print("\n### scaling (medians)\n")
        print("| pods   | bouncer wall | bouncer RSS | RSS / 1k pods | floor wall | DIY wall | DIY RSS    |")
        print("|--------|--------------|-------------|---------------|------------|----------|------------|")
        for pods, res in scale:
            bw, br = med([x[0] for x in res["bouncer"]]), med([x[1] for x in res["bouncer"]])
            print(f"| {pods:6} | {bw:10.2f} s | {fmt_mib(br):>11} | {fmt_mib(br * 1000 / pods):>13} | "
                  f"{med([x[0] for x in res['floor']]):8.2f} s | {med([x[0] for x in res['diy']]):6.2f} s | "
                  f"{fmt_mib(med([x[1] for x in res['diy']])):>10} |")
    size = os.path.getsize(os.environ["BENCH_BOUNCER"])
    print(f"\nrelease binary: {size / 1e6:.1f} MB ({size} bytes)")
    if failed:
        print("\nFAILED checks:\n  " + "\n  ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
