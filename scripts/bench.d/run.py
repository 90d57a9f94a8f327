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
import datetime
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

# What `bouncer plan` reads, one URL per kind.
KINDS = [
    ("pods", "/api/v1/pods"),
    ("replicasets", "/apis/apps/v1/replicasets"),
    ("deployments", "/apis/apps/v1/deployments"),
    ("statefulsets", "/apis/apps/v1/statefulsets"),
    ("daemonsets", "/apis/apps/v1/daemonsets"),
    ("poddisruptionbudgets", "/apis/policy/v1/poddisruptionbudgets"),
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
  # The benchmark's pods are minutes old: a production cooldown would hold every one back.
  cooldown: 1s
  maxPerRun: 100000
  allowDowntime: true
"""


BOUNCE_POLICY = """\
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata:
  name: bench-bounce
spec:
  target:
    namespaces: [{ns}]
    selector:
      matchLabels:
        bench-bounce: "true"
    kinds: [Deployment]
  triggers:
    memory:
      above: 100Mi
  cooldown: 1s
"""


def parse_time(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def timed(cmd, stdout=subprocess.DEVNULL, env=None):
    """(wall seconds, peak RSS KiB, CPU seconds) of one command under /usr/bin/time -v."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-v", "-o", tf.name, *cmd], stdout=stdout, stderr=subprocess.PIPE,
                           env=env)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed (exit {r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
        out = tf.read()
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out).group(1))
        cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", out))
        return wall, rss, cpu


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

    def audit_requests(self, start, end, agents=("bouncer/",)):
        """Requests in [start, end) of the audit log by each user agent prefix, read in one pass:
        [Counter of (verb, resource)] in the order of `agents`."""
        counts = [collections.Counter() for _ in agents]
        agent_of = lambda e: next((i for i, a in enumerate(agents) if e.get("userAgent", "").startswith(a)), None)
        needles = [f'"{a}'.encode() for a in agents]
        for e in self.audit_events(start, end, needles, lambda e: agent_of(e) is not None):
            ref = e.get("objectRef", {})
            res = ref.get("resource", e.get("requestURI", "?"))
            if ref.get("apiGroup") == "metrics.k8s.io":
                res += ".metrics.k8s.io"
            counts[agent_of(e)][(e["verb"], res)] += 1
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
        """Alternating runs; returns {contender: [(wall, rss_kib)]}, bouncer's requests per round and the
        DIY script's (kubectl's) requests per round."""
        results = {name: [] for name in self.contenders}
        walls = {}
        offsets = []
        for i in range(warmup + runs):
            for name, fn in self.contenders.items():
                if name == "bouncer":
                    offsets.append(self.audit_size())
                m = fn()
                walls[name] = m[0]
                if i >= warmup:
                    results[name].append(m)
            log(f"  round {i + 1}/{warmup + runs}" + (" (warm-up)" if i < warmup else "") + ": " +
                ", ".join(f"{n} {w:.2f} s" for n, w in walls.items()))
        time.sleep(1.5)  # the audit backend writes ResponseComplete after the response
        offsets.append(self.audit_size())
        rounds = [self.audit_requests(a, b, ("bouncer/", "kubectl/")) for a, b in zip(offsets, offsets[1:])]
        return results, [r[0] for r in rounds], [r[1] for r in rounds]

    def many_policies(self, n=25):
        """bouncer's requests with n policies (one per app, memory and schedule triggers) instead of one."""
        d = os.path.join(self.work, "many-policies")
        os.makedirs(d, exist_ok=True)
        docs = []
        for i in range(n):
            docs.append(POLICY.replace("name: bench-memory", f"name: bench-{i:02d}")
                        .replace('bench: "true"', f'app: web-{i % 14:02d}')
                        .replace("  cooldown: 1s\n", "  cooldown: 1h\n")
                        .replace("    memory:\n", '    schedule: {cron: "0 3 * * *"}\n    memory:\n'))
        with open(os.path.join(d, "policies.yaml"), "w") as f:
            f.write("---\n".join(docs))
        env = dict(os.environ, BOUNCER_POLICIES=d, BOUNCER_LOG="warn")
        start = self.audit_size()
        timed([self.bouncer, "plan", "--output", "json"], env=env)
        time.sleep(1.5)
        return self.audit_requests(start, self.audit_size())[0]

    def bounce_round(self):
        """One `bouncer run` that restarts the three Deployments of bounce.py. Returns the report
        rows, bouncer's requests in that namespace per (verb, resource), and for each bounce after
        the first the gap between the previous rollout's completion and the next patch, as the API
        server saw it: the deployment controller's last status write before bouncer's next patch
        (audit log timestamps, microseconds; the report's are whole seconds)."""
        r = subprocess.run([sys.executable, os.path.join(HERE, "bounce.py")], stdout=subprocess.PIPE, check=True)
        ns = json.loads(r.stdout)["namespace"]
        d = os.path.join(self.work, "bounce-policies")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "bounce.yaml"), "w") as f:
            f.write(BOUNCE_POLICY.format(ns=ns))
        report = os.path.join(self.work, "bounce-report.json")
        env = dict(os.environ, BOUNCER_POLICIES=d, BOUNCER_LOG="warn")
        start = self.audit_size()
        wall, rss, _ = timed([self.bouncer, "run", "--output", "json", "--report", report,
                              "--lease-namespace", ns], env=env)
        time.sleep(1.5)
        events = list(self.audit_events(start, self.audit_size(), [f'"namespace":"{ns}"'.encode()],
                                        lambda e: e.get("objectRef", {}).get("namespace") == ns))
        with open(report) as f:
            rows = sorted(json.load(f)["rows"], key=lambda row: row.get("order") or 0)
        mine = collections.Counter()
        patches, status = [], collections.defaultdict(list)
        for e in events:
            ref = e.get("objectRef", {})
            res = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            ts = parse_time(e["requestReceivedTimestamp"])
            if e.get("userAgent", "").startswith("bouncer/"):
                mine[(e["verb"], res)] += 1
                if e["verb"] == "patch" and res == "deployments":
                    patches.append((ts, ref.get("name")))
            elif res == "deployments/status" and e["verb"] == "update":
                status[ref.get("name")].append(parse_time(e["stageTimestamp"]))
        patches.sort()
        gaps = []
        for (_, prev), (ts, _) in zip(patches, patches[1:]):
            done = max((t for t in status[prev] if t < ts), default=None)
            gaps.append(None if done is None else (ts - done).total_seconds())
        return rows, mine, gaps, wall, rss

    def audit_events(self, start, end, needles, keep):
        """ResponseComplete audit events in [start, end) of the log whose line holds one of
        `needles` (bytes; a cheap filter before parsing) and for which `keep(event)` holds."""
        with open(self.audit, "rb") as f:
            f.seek(start)
            for line in f.read(end - start).splitlines():
                if not any(n in line for n in needles):
                    continue
                e = json.loads(line)
                if e.get("stage") == "ResponseComplete" and keep(e):
                    yield e

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


def print_table(pods, results, requests, diy_requests, counts, load_s, load_avg):
    cols = [results[k] for k in ("bouncer", "floor", "diy")]
    n = len(cols[0])
    print(f"\n### {pods} pods ({counts['namespaces']} namespaces, {counts['deployments']} Deployments, "
          f"{counts['replicasets']} ReplicaSets, {counts['statefulsets']} StatefulSets, "
          f"{counts['pods.metrics.k8s.io']} PodMetrics; loaded in {load_s:.0f} s; median of {n}; "
          f"load average {load_avg})\n")
    rows = [
        ("", ["bouncer plan", "raw LISTs (curl, sequential)", "kubectl + jq (DIY)"]),
        ("wall time", [f"{med([x[0] for x in c]):.2f} s" for c in cols]),
        ("wall min-max", [f"{min(x[0] for x in c):.2f}-{max(x[0] for x in c):.2f} s" for c in cols]),
        ("peak RSS", [fmt_mib(med([x[1] for x in c])) for c in cols]),
        ("client CPU", [f"{med([x[2] for x in c]):.2f} s" for c in cols]),
        ("API requests", [f"{med([sum(r.values()) for r in requests]):.0f}", str(len(KINDS)),
                          f"{med([sum(r.values()) for r in diy_requests]):.0f}"]),
    ]
    widths = [max(len(r[0]) for r in rows)] + [max(len(r[1][i]) for r in rows) for i in range(3)]
    for j, (label, cells) in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip([label, *cells], widths))) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print()
    per = collections.Counter()
    for r in requests:
        per.update(r)
    same = all(r == requests[0] for r in requests)
    print(f"bouncer requests per run ({'identical in every run' if same else 'VARIES between runs'}):")
    for (verb, res), c in sorted(per.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {verb:5} {res:28} {c / len(requests):6.1f}")


def print_bounce_round(bench):
    """Runs and prints the bounce round; returns the failed checks."""
    log("bounce round: one `bouncer run` over 3 Deployments x 2 pods")
    rows, requests, gaps, wall, rss = bench.bounce_round()
    print("\n### bounce round (one `bouncer run`, 3 Deployments x 2 pods, on the loaded cluster)\n")
    for r in rows:
        w = r["workload"]
        print(f"  {w['kind']}/{w['name']}: {r['decision']} in {r.get('durationSeconds') or 0:.1f} s "
              f"({r.get('verification') or r['reason']})")
    print(f"  run: {wall:.1f} s wall, {rss / 1024:.1f} MiB peak RSS")
    fmt = lambda xs: ", ".join("?" if x is None else f"{x:.2f} s" for x in xs) or "-"
    print(f"  previous rollout complete -> next patch: {fmt(gaps)} (the deployment controller's last status "
          f"write -> bouncer's patch, from the audit log)")
    bounced = sum(r["decision"] == "bounced" for r in rows)
    print(f"  bouncer's requests in the namespace (per bounce, {bounced} bounces):")
    for (verb, res), c in sorted(requests.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"    {verb:6} {res:28} {c / max(bounced, 1):5.1f}")
    failed = []
    if bounced != 3:
        failed.append(f"bounce round: {bounced} of 3 Deployments bounced")
    if requests[("patch", "deployments")] != bounced or requests[("watch", "deployments")] != bounced:
        failed.append(f"bounce round: expected one patch and one watch per bounce, saw "
                      f"{requests[('patch', 'deployments')]} patches and {requests[('watch', 'deployments')]} watches")
    if any(g is None or g > 1.0 for g in gaps):
        failed.append(f"bounce round: a next bounce started more than 1 s after the previous rollout completed: {gaps}")
    return failed


def expected_lists(counts):
    want = {("list", k): max(1, math.ceil(n / PAGE)) for k, n in counts.items()}
    # The policy lists Pod: bare pods' attempt marks live on the run Lease, read once per run.
    want[("get", "leases")] = 1
    return want


def check_requests(requests, counts):
    """Problems with bouncer's requests: anything but one LIST per kind per page of 500 (and the
    one Lease read for bare pods' attempt marks): nothing per workload."""
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
        load_avg = " ".join(f"{x:.1f}" for x in os.getloadavg())
        results, requests, diy_requests = bench.run(args.runs, args.warmup)
        print_table(load["pods"], results, requests, diy_requests, counts, load["seconds"], load_avg)
        planned, diy_workloads, diy_pods = bench.decisions()
        print(f"decisions: bouncer plans {planned} bounces; the DIY script finds {diy_pods} pods over 85% "
              f"in {diy_workloads} workloads" + ("" if planned == diy_workloads else "  <-- MISMATCH"))
        if planned != diy_workloads or planned == 0:
            failed.append(f"{size} pods: bouncer planned {planned}, DIY found {diy_workloads} workloads")
        failed += [f"{size} pods: {p}" for p in check_requests(requests, counts)]
        many = bench.many_policies()
        print(f"with 25 policies instead of 1: {sum(many.values())} requests"
              + (", the same" if many == requests[0] else f"  <-- DIFFERENT: {sorted(many.items())}"))
        if many != requests[0]:
            failed.append(f"{size} pods: requests depend on the number of policies")
        scale.append((load["pods"], results))
    if len(scale) > 1:
        print("\n### scaling (medians)\n")
        print("| pods   | bouncer wall | bouncer RSS | bouncer CPU | floor wall | DIY wall | DIY RSS    |")
        print("|--------|--------------|-------------|-------------|------------|----------|------------|")
        for pods, res in scale:
            bw, br = med([x[0] for x in res["bouncer"]]), med([x[1] for x in res["bouncer"]])
            print(f"| {pods:6} | {bw:10.2f} s | {fmt_mib(br):>11} | {med([x[2] for x in res['bouncer']]):9.2f} s | "
                  f"{med([x[0] for x in res['floor']]):8.2f} s | {med([x[0] for x in res['diy']]):6.2f} s | "
                  f"{fmt_mib(med([x[1] for x in res['diy']])):>10} |")
    failed += print_bounce_round(bench)
    size = os.path.getsize(os.environ["BENCH_BOUNCER"])
    print(f"\nrelease binary: {size / 1e6:.1f} MB ({size} bytes)")
    if failed:
        print("\nFAILED checks:\n  " + "\n  ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
