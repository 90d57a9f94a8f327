#!/usr/bin/env python3
"""Runs the `scripts/bench` contenders against a loaded cluster, prints the tables and checks the
targets.

Contenders, run in alternation (a warm-up round first, then medians):
  bouncer      `bouncer plan` with one percentOfLimit: 85 memory policy over every bench pod
  pods         the pods LIST alone, one unpaged request with curl: the floor of the slowest kind
  pods-paged   the pods LIST by pages of 5,000 (as bouncer reads it), one connection, nothing parsed
  floor-par    the raw LISTs the plan needs, all at once (curl --parallel): the concurrent floor
  floor-seq    the same LISTs one after the other (curl): the sequential floor
  diy          `kubectl get pods -A -o json` + `kubectl get --raw` PodMetrics + jq, same decision
  descheduler  the descheduler (sigs.k8s.io/descheduler), one dry-run cycle of PodLifeTime over
               the bench pods (only when BENCH_DESCHEDULER names its binary)

Wall time is measured around the process; peak RSS is /usr/bin/time -v's maximum resident set
size (for the DIY pipeline: its largest process). Requests are counted from the API server's audit
log by user agent (`bouncer/`, `kubectl/`, `descheduler/`).

Correctness checks fail the run (exit 1): bouncer's decisions equal to the DIY script's, its
requests one LIST per kind per page (nothing per workload, nothing per policy), the descheduler's
dry-run decisions covering every bench pod it may evict, one patch and one watch per bounce. The
targets (plan wall against the pods LIST, peak RSS, bounce overhead) are printed as holding or
missed; a miss does not change the exit code.

Environment: BENCH_SERVER, BENCH_CA, BENCH_TOKEN, KUBECONFIG, BENCH_KUBECTL, BENCH_BOUNCER,
BENCH_AUDIT_LOG; optional BENCH_DESCHEDULER (binary), BENCH_MLR_STATUS (why memory-leak-reloader
is not measured).
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
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Objects per LIST page, as bouncer asks for them (src/cluster/list.rs).
PAGE = 5000
MIB = 1024  # KiB per MiB

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

# Contender names, their column headings, in the order they run in each round.
LABELS = {
    "bouncer": "bouncer plan",
    "pods": "pods LIST alone",
    "pods-paged": f"pods LIST by {PAGE:,}",
    "floor-par": "raw LISTs, concurrent",
    "floor-seq": "raw LISTs, sequential",
    "diy": "kubectl + jq (DIY)",
    "descheduler": "descheduler (dry-run)",
}
AGENTS = {"bouncer": "bouncer/", "diy": "kubectl/", "descheduler": "descheduler/"}

# The targets (issue-style: ratios in one run; absolute figures only as context).
PLAN_VS_PODS_LIST = 1.0
RSS_TARGETS_MIB = {("owned", 5000): 25, ("bare", 5000): 25, ("owned", 50000): 40}

# The fleets (scripts/bench.d/load.py): `owned`, pods of Deployments and StatefulSets (and 2 bare
# pods in 100); `bare`, bare pods only, in label groups of 5, one workload row each. The policy's
# kinds follow: a bare pod is only a workload under `kinds: [Pod]`.
SHAPES = {"owned": "controller-owned pods", "bare": "bare pods"}
KINDS_OF = {"owned": "[Deployment, StatefulSet, Pod]", "bare": "[Pod]"}
BOUNCE_OVERHEAD_S = 0.5

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
    kinds: {kinds}
  triggers:
    memory:
      percentOfLimit: 85
  # The benchmark's pods are minutes old: a production cooldown would hold every one back.
  cooldown: 1s
  maxPerRun: 100000
  allowDowntime: true
"""

# The descheduler's nearest equivalent: it has no per-pod memory trigger (its utilization
# plugins balance nodes), so it runs PodLifeTime, the "restart what has run too long" strategy,
# over the same pods: one dry-run cycle, every bench pod older than a minute is a decision.
DESCHEDULER_POLICY = """\
apiVersion: descheduler/v1alpha2
kind: DeschedulerPolicy
profiles:
- name: bench
  pluginConfig:
  - name: DefaultEvictor
    args: {}
  - name: PodLifeTime
    args:
      maxPodLifeTimeSeconds: 60
      labelSelector:
        matchLabels:
          bench: "true"
  plugins:
    deschedule:
      enabled: [PodLifeTime]
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


def timed(cmd, stdout=subprocess.DEVNULL, env=None, stderr=None):
    """(wall seconds, peak RSS KiB, CPU seconds) of one command under /usr/bin/time -v. `stderr`:
    a file to write the command's stderr to (default: kept for the error message)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        err = open(stderr, "w") if stderr else subprocess.PIPE
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-v", "-o", tf.name, *cmd], stdout=stdout, stderr=err, env=env)
        wall = time.perf_counter() - t0
        if stderr:
            err.close()
        if r.returncode != 0:
            text = open(stderr, errors="replace").read() if stderr else r.stderr.decode(errors="replace")
            raise RuntimeError(f"{cmd[0]} failed (exit {r.returncode}): {text[-2000:]}")
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
        self.descheduler = os.environ.get("BENCH_DESCHEDULER") or None
        os.makedirs(os.path.join(work, "policies"), exist_ok=True)
        self.shape("owned")
        self.report = os.path.join(work, "report.json")
        self.curl = ["curl", "-sS", "--fail", "--cacert", os.environ["BENCH_CA"], "-H", "Accept: application/json",
                     "-H", "Authorization: Bearer " + os.environ["BENCH_TOKEN"], "-A", "bouncer-bench-floor"]
        urls = []
        for _, path in KINDS:
            urls += ["-o", "/dev/null", os.environ["BENCH_SERVER"] + path]
        pods = ["-o", "/dev/null", os.environ["BENCH_SERVER"] + "/api/v1/pods"]
        diy = os.path.join(HERE, "diy.sh")
        env = dict(os.environ, BOUNCER_POLICIES=os.path.join(work, "policies"), BOUNCER_MAX_BOUNCES="100000",
                   BOUNCER_LOG="warn")
        self.contenders = {
            "bouncer": lambda: timed([self.bouncer, "plan", "--output", "json", "--report", self.report], env=env),
            "pods": lambda: timed(self.curl + pods),
            "pods-paged": self.paged,
            "floor-par": lambda: timed(self.curl + ["--parallel", "--parallel-immediate", "--parallel-max",
                                                    str(len(KINDS))] + urls),
            "floor-seq": lambda: timed(self.curl + urls),
            "diy": lambda: timed([diy], stdout=open(os.path.join(work, "diy.out"), "w")),
        }
        if self.descheduler:
            policy = os.path.join(work, "descheduler-policy.yaml")
            with open(policy, "w") as f:
                f.write(DESCHEDULER_POLICY)
            self.descheduler_log = os.path.join(work, "descheduler.log")
            # No leader election, no serving port, no metrics; -v=1 logs each dry-run decision and
            # each cycle's total. A cycle every second: in dry-run, v0.36.0's first cycle runs
            # before its sandbox (the fake client its dry run evicts from) has received every pod
            # from the real informers, so a one-shot run decides on part of the pods only; the
            # time that counts is to the first cycle that decides on every pod.
            self.descheduler_cmd = [
                self.descheduler, "--kubeconfig", os.environ["KUBECONFIG"], "--policy-config-file", policy,
                "--dry-run", "--leader-elect=false", "--secure-port=0", "--disable-metrics", "--v=1",
                "--descheduling-interval", "1s"]
            self.descheduler_want = None  # set per size: the pods it may evict
            self.descheduler_cycles = []  # per round: [(seconds, pods decided)] up to the complete one
            self.contenders["descheduler"] = self.run_descheduler

    def shape(self, shape):
        """The policies of one fleet (the plan's, and the 25 of `many_policies`)."""
        self.policy = POLICY.replace("{kinds}", KINDS_OF[shape])
        with open(os.path.join(self.work, "policies", "bench.yaml"), "w") as f:
            f.write(self.policy)

    def paged(self):
        """The pods LIST by pages of PAGE: its own timing (from the connection to the last page), the
        process's RSS and CPU."""
        out = os.path.join(self.work, "paged.out")
        with open(out, "w") as f:
            _, rss, cpu = timed([sys.executable, os.path.join(HERE, "paged.py"), "/api/v1/pods", str(PAGE)],
                                  stdout=f)
        with open(out) as f:
            return float(f.read().split()[1]), rss, cpu

    def run_descheduler(self):
        """(seconds to the first dry-run cycle that decided on every pod it may evict, peak RSS
        KiB, CPU seconds): the descheduler runs its cycles until one is complete (or a deadline)
        and is then stopped with SIGTERM."""
        want = self.descheduler_want
        deadline = 120 + want / 100
        with tempfile.NamedTemporaryFile("r", suffix=".time") as tf, open(self.descheduler_log, "w") as logf:
            t0 = time.perf_counter()
            p = subprocess.Popen(["/usr/bin/time", "-v", "-o", tf.name, *self.descheduler_cmd],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")

            def stop():
                # /usr/bin/time reports once its child has exited: signal the child, not time.
                try:
                    with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                        for pid in f.read().split():
                            os.kill(int(pid), 15)
                except (OSError, ValueError):
                    pass

            timer = threading.Timer(deadline, stop)
            timer.start()
            cycles, done = [], None
            for line in p.stderr:
                logf.write(line)
                if done is None and "Number of evictions/requests" in line:
                    m = re.search(r"totalEvicted=(\d+)", line)
                    cycles.append((time.perf_counter() - t0, int(m.group(1)) if m else -1))
                    if cycles[-1][1] >= want:
                        done = cycles[-1][0]
                        stop()
            p.wait()
            timer.cancel()
            self.descheduler_cycles.append(cycles)
            if done is None:
                raise RuntimeError(f"descheduler: no dry-run cycle decided on all {want} pods within {deadline:.0f} s "
                                   f"(cycles: {cycles}; log {self.descheduler_log})")
            out = tf.read()
            rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out).group(1))
            cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", out))
            return done, rss, cpu

    def server_metrics(self):
        """The API server's own /metrics, parsed: {(name, frozenset(labels)): value} for the
        series the cost table reads."""
        r = subprocess.run(self.curl + ["-H", "Accept: text/plain", os.environ["BENCH_SERVER"] + "/metrics"],
                           capture_output=True, check=True)
        out = {}
        for line in r.stdout.decode().splitlines():
            m = SERIES.match(line)
            if m:
                labels = frozenset(LABEL.findall(m.group(2) or ""))
                out[(m.group(1), labels)] = float(m.group(3))
        return out

    def server_cost(self, cmd):
        """What one command costs the API server, from its /metrics before and after: requests,
        the seconds it spent serving them and the bytes it sent, per verb and resource (the
        resources the plan reads), its CPU seconds, and its resident memory before, after and
        at its peak (VmHWM, reset first, where /proc allows). Plus the command's own wall time."""
        pid = apiserver_pid()
        time.sleep(1)
        before = self.server_metrics()
        peak = None
        if pid:
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")  # resets the peak resident set size to the current one
                peak = 0
            except OSError:
                pass
        t0 = time.perf_counter()
        cmd()
        wall = time.perf_counter() - t0
        if peak is not None:
            with open(f"/proc/{pid}/status") as f:
                peak = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024
        time.sleep(1.5)  # a watch's duration is observed when it ends
        after = self.server_metrics()
        return cost_of(before, after, wall, peak)

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
            res = ref.get("resource", e.get("requestURI", "?").split("?")[0])
            if ref.get("apiGroup") == "metrics.k8s.io":
                res += ".metrics.k8s.io"
            counts[agent_of(e)][(e["verb"], res)] += 1
        return counts

    def metadata(self, path):
        """The items of one LIST as PartialObjectMetadata (names, labels, owners: no specs)."""
        meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
        r = subprocess.run(self.curl + ["-H", "Accept: " + meta, os.environ["BENCH_SERVER"] + path],
                           capture_output=True, check=True)
        return json.loads(r.stdout)["items"]

    def wait_metrics(self, timeout=300):
        """Until metrics-server reports every pod: a scrape of a busy KWOK node that times out
        drops its pods' metrics until the next one, and bouncer and the DIY script must decide
        from the same numbers."""
        deadline = time.time() + timeout
        paths = dict(KINDS)
        while True:
            pods = len(self.metadata(paths["pods"]))
            metrics = len(self.metadata(paths["pods.metrics.k8s.io"]))
            if metrics >= pods or time.time() > deadline:
                if metrics < pods:
                    log(f"  metrics-server reports {metrics} of {pods} pods")
                return
            time.sleep(5)

    def object_counts(self):
        """Objects per kind as the API server lists them (for the expected page counts), and the
        bench pods the descheduler may evict (those a controller owns)."""
        out = {}
        for kind, path in KINDS:
            items = self.metadata(path)
            out[kind] = len(items)
            if kind == "pods":
                out["owned-bench-pods"] = sum(
                    1 for p in items if (p["metadata"].get("labels") or {}).get("bench") == "true"
                    and any(o.get("controller") for o in p["metadata"].get("ownerReferences") or []))
        return out

    def run(self, runs, warmup):
        """Alternating runs; returns {contender: [(wall, rss_kib, cpu)]} and, per round, each
        contender's requests {contender: [Counter]} (those with a user agent of their own)."""
        results = {name: [] for name in self.contenders}
        walls = {}
        offsets = []
        names = list(self.contenders)
        for i in range(warmup + runs):
            self.wait_metrics()
            offsets.append(self.audit_size())
            # Each round starts with the next contender: none always follows the DIY script (at
            # 50,000 pods, minutes of GiBs churned) or always meets the cluster first.
            for name in names[i % len(names):] + names[:i % len(names)]:
                m = self.contenders[name]()
                walls[name] = m[0]
                if i >= warmup:
                    results[name].append(m)
            log(f"  round {i + 1}/{warmup + runs}" + (" (warm-up)" if i < warmup else "") + ": " +
                ", ".join(f"{n} {walls[n]:.2f} s" for n in names))
        time.sleep(1.5)  # the audit backend writes ResponseComplete after the response
        offsets.append(self.audit_size())
        names = [n for n in AGENTS if n in self.contenders]
        rounds = [self.audit_requests(a, b, tuple(AGENTS[n] for n in names))
                  for a, b in list(zip(offsets, offsets[1:]))[warmup:]]
        return results, {n: [r[i] for r in rounds] for i, n in enumerate(names)}

    def many_policies(self, n=25):
        """bouncer's requests with n policies (one per app, memory and schedule triggers) instead of one."""
        d = os.path.join(self.work, "many-policies")
        os.makedirs(d, exist_ok=True)
        docs = []
        for i in range(n):
            docs.append(self.policy.replace("name: bench-memory", f"name: bench-{i:02d}")
                        .replace('bench: "true"', f'app: web-{i % 14:02d}')
                        .replace("  cooldown: 1s\n", "  cooldown: 1h\n")
                        .replace("    memory:\n", '    schedule: {cron: "0 3 * * *"}\n    memory:\n'))
        with open(os.path.join(d, "policies.yaml"), "w") as f:
            f.write("---\n".join(docs))
        env = dict(os.environ, BOUNCER_POLICIES=d, BOUNCER_LOG="warn",
                   BOUNCER_VERIFY_SETTLE=f"{SETTLE:g}s")
        start = self.audit_size()
        timed([self.bouncer, "plan", "--output", "json"], env=env)
        time.sleep(1.5)
        return self.audit_requests(start, self.audit_size())[0]

    def bounce_round(self):
        """One `bouncer run` that restarts the three Deployments of bounce.py, back to back.
        Returns the report rows, bouncer's requests in that namespace per (verb, resource), the
        timeline of each bounce from the audit log, the run's wall time and peak RSS.

        Per bounce: the patch (bouncer's), the rollout's completion (the deployment controller's
        last status write for that Deployment before the next patch, or before bouncer's last
        request for the last one), and bouncer's first request about that Deployment (its fresh
        read before acting) and its last (verification, Event). The overhead of a bounce is its
        span (first request to last) less its rollout (patch to completion): what bouncer adds
        beyond the rollout itself, from the audit log's microsecond timestamps."""
        r = subprocess.run([sys.executable, os.path.join(HERE, "bounce.py")], stdout=subprocess.PIPE, check=True)
        ns = json.loads(r.stdout)["namespace"]
        d = os.path.join(self.work, "bounce-policies")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "bounce.yaml"), "w") as f:
            f.write(BOUNCE_POLICY.format(ns=ns))
        report = os.path.join(self.work, "bounce-report.json")
        env = dict(os.environ, BOUNCER_POLICIES=d, BOUNCER_LOG="warn",
                   BOUNCER_VERIFY_SETTLE=f"{SETTLE:g}s")
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
        mine_events = []
        for e in events:
            ref = e.get("objectRef", {})
            res = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            received, done = parse_time(e["requestReceivedTimestamp"]), parse_time(e["stageTimestamp"])
            if e.get("userAgent", "").startswith("bouncer/"):
                mine[(e["verb"], res)] += 1
                mine_events.append((received, done, e["verb"], res, ref.get("name")))
                if e["verb"] == "patch" and res == "deployments":
                    patches.append((received, ref.get("name")))
            elif res == "deployments/status" and e["verb"] == "update":
                status[ref.get("name")].append(done)
        patches.sort()
        mine_events.sort()
        # Bounce i spans from its fresh read (bouncer's first request naming its Deployment) to the
        # next bounce's fresh read, or for the last one to bouncer's last request (its Event). Lease
        # renewals run beside the bounces and watches end with the rollouts: neither marks an end.
        timeline = []
        for i, (patched, name) in enumerate(patches):
            first = next((rc for rc, _, _, res, n in mine_events if res == "deployments" and n == name), None)
            timeline.append({"name": name, "first": first, "patch": patched})
        for i, t in enumerate(timeline):
            if i + 1 < len(timeline):
                t["end"] = timeline[i + 1]["first"]
            else:
                t["end"] = max((dn for _, dn, v, res, _ in mine_events if res != "leases" and v != "watch"), default=None)
            t["last"] = max((dn for rc, dn, v, res, _ in mine_events if res != "leases" and v != "watch"
                             and t["end"] and rc < t["end"]), default=None)
            t["complete"] = max((x for x in status[t["name"]] if t["end"] and x < t["end"]), default=None)
        return rows, mine, timeline, wall, rss

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

    def descheduler_decisions(self):
        """(pods its last complete dry-run cycle would evict, pods its first cycle decided on, the
        cycles it took) from the measured rounds."""
        cycles = self.descheduler_cycles[-1]
        return cycles[-1][1], cycles[0][1], statistics.median(len(c) for c in self.descheduler_cycles)


SERIES = re.compile(r"^(apiserver_request_total|apiserver_request_duration_seconds_sum|apiserver_response_sizes_sum|"
                    r"apiserver_watch_list_duration_seconds_sum|apiserver_watch_list_duration_seconds_count|process_cpu_seconds_total|process_resident_memory_bytes)"
                    r"(?:\{(.*)\})? ([0-9.e+-]+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
# The resources a plan reads (the API server's names), for the cost table.
READ = {"pods", "replicasets", "deployments", "statefulsets", "daemonsets", "poddisruptionbudgets", "namespaces",
        "leases"}


def apiserver_pid():
    """The kube-apiserver process (scripts/cluster records the shell that runs it)."""
    pid = os.environ.get("BENCH_APISERVER_PID")
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "kube-apiserver":
                return pid
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/comm") as c:
                    if c.read().strip() == "kube-apiserver":
                        return child
    except OSError:
        pass
    return None


def cost_of(before, after, wall, peak):
    """The difference of two /metrics scrapes, summed over the read resources by verb. Reads
    only (LIST, GET, and WATCH as streaming lists): the other clients' writes (node and leader
    leases) go on meanwhile. A watch's request metrics are observed when it ends, so the
    components' own long watches ending in the window would count: WATCH requests and seconds
    come from the streaming lists' own histogram."""
    out = {"wall": wall, "requests": collections.Counter(), "seconds": collections.Counter(),
           "bytes": collections.Counter(), "rss_before": None, "rss_after": None, "rss_peak": peak}
    for (name, labels), v in after.items():
        d = v - before.get((name, labels), 0.0)
        lab = dict(labels)
        if name == "process_cpu_seconds_total":
            out["cpu"] = d
        elif name == "process_resident_memory_bytes":
            out["rss_before"], out["rss_after"] = before.get((name, labels)), v
        elif lab.get("resource") in READ and not lab.get("subresource") and d > 0:
            verb = lab.get("verb", "WATCH").upper()
            if verb not in ("LIST", "GET", "WATCH"):
                continue
            key = (verb, lab["resource"] + (".metrics" if lab.get("group") == "metrics.k8s.io" else ""))
            if name == "apiserver_watch_list_duration_seconds_count":
                out["requests"][key] += d
            elif name == "apiserver_watch_list_duration_seconds_sum":
                out["seconds"][key] += d
            elif verb == "WATCH" and name != "apiserver_response_sizes_sum":
                continue
            elif name == "apiserver_request_total":
                out["requests"][key] += d
            elif name == "apiserver_request_duration_seconds_sum":
                out["seconds"][key] += d
            elif name == "apiserver_response_sizes_sum":
                out["bytes"][key] += d
    return out


def med(xs):
    return statistics.median(xs)


def fmt_mib(kib):
    return f"{kib / MIB:.1f} MiB"


def print_rows(rows):
    widths = [max(len(r[0]) for r in rows)] + [max(len(r[1][i]) for r in rows) for i in range(len(rows[0][1]))]
    for j, (label, cells) in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip([label, *cells], widths))) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def request_counts(names, counts, requests):
    """Median API requests per run of each contender."""
    fixed = {"pods": 1, "pods-paged": max(1, math.ceil(counts["pods"] / PAGE)),
             "floor-par": len(KINDS), "floor-seq": len(KINDS)}
    return {n: fixed[n] if n in fixed else med([sum(r.values()) for r in requests[n]]) for n in names}


def print_table(shape, pods, results, requests, counts, load_s, load_avg, mlr_status):
    names = list(results)
    n = len(results["bouncer"])
    walls = {k: med([x[0] for x in results[k]]) for k in names}
    reqs = request_counts(names, counts, requests)
    print(f"\n### {pods} {SHAPES[shape]} ({counts['namespaces']} namespaces, {counts['deployments']} Deployments, "
          f"{counts['replicasets']} ReplicaSets, {counts['statefulsets']} StatefulSets, "
          f"{counts['pods.metrics.k8s.io']} PodMetrics; loaded in {load_s:.0f} s; median of {n}; "
          f"load average {load_avg})\n")
    rows = [
        ("", [LABELS[k] for k in names]),
        ("wall time", [f"{walls[k]:.2f} s" for k in names]),
        ("wall min-max", [f"{min(x[0] for x in results[k]):.2f}-{max(x[0] for x in results[k]):.2f} s" for k in names]),
        ("bouncer / this", [f"{walls['bouncer'] / walls[k]:.2f}x" for k in names]),
        ("peak RSS", [fmt_mib(med([x[1] for x in results[k]])) for k in names]),
        ("client CPU", [f"{med([x[2] for x in results[k]]):.2f} s" for k in names]),
        ("API requests", [f"{reqs[k]:.0f}" for k in names]),
    ]
    print_rows(rows)
    print()
    if mlr_status:
        print(f"memory-leak-reloader: not measured: {mlr_status}\n")
    for name in AGENTS:
        if name not in requests or name == "diy":
            continue
        per = collections.Counter()
        for r in requests[name]:
            per.update(r)
        same = all(r == requests[name][0] for r in requests[name])
        print(f"{name} requests per run ({'identical in every run' if same else 'VARIES between runs'}):")
        for (verb, res), c in sorted(per.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            print(f"  {verb:5} {res:28} {c / len(requests[name]):6.1f}")


# What one run costs the API server: these, one after the other, each once.
COSTED = {
    "bouncer": "bouncer plan",
    "kubectl": "kubectl get pods -A -o json",
    "pods": "pods LIST alone",
    "pods-paged": f"pods LIST by {PAGE:,}",
    "watchlist": "pods streaming list",
}


def measure_costs(bench):
    """{name: cost} for the COSTED commands, and whether the server streamed the list."""
    out, streamed = {}, None
    watchlist = os.path.join(bench.work, "watchlist.out")

    def stream():
        with open(watchlist, "w") as f:
            timed([sys.executable, os.path.join(HERE, "watchlist.py"), "/api/v1/pods"], stdout=f)

    cmds = {"bouncer": bench.contenders["bouncer"], "pods": bench.contenders["pods"],
            "pods-paged": bench.contenders["pods-paged"],
            "kubectl": lambda: timed([os.environ["BENCH_KUBECTL"], "get", "pods", "-A", "-o", "json"]),
            "watchlist": stream}
    for name in COSTED:
        out[name] = bench.server_cost(cmds[name])
        if name == "watchlist":
            with open(watchlist) as f:
                words = f.read().split()
            streamed = words[0] != "unsupported"
            if not streamed:
                out[name]["refused"] = " ".join(words[1:])
    return out, streamed


def print_costs(costs, streamed):
    print("\n#### what one run costs the API server (its /metrics before and after each, one run each; "
          "the resources the plan reads)\n")
    names = list(costs)
    fmt_req = lambda c: ", ".join(f"{v:.0f} {verb} {res}" for (verb, res), v in sorted(c["requests"].items()))
    mib = lambda b: "-" if b is None else f"{b / 2**20:.0f} MiB"
    rows = [("", [COSTED[n] for n in names]),
            ("client wall time", [f"{costs[n]['wall']:.2f} s" for n in names]),
            ("requests", [f"{sum(costs[n]['requests'].values()):.0f}" for n in names]),
            ("server time serving them", [f"{sum(costs[n]['seconds'].values()):.2f} s" for n in names]),
            ("bytes sent", [f"{sum(costs[n]['bytes'].values()) / 1e6:.1f} MB" for n in names]),
            ("server CPU (whole process)", [f"{costs[n].get('cpu', 0):.2f} s" for n in names]),
            ("server RSS before -> after", [f"{mib(costs[n]['rss_before'])} -> {mib(costs[n]['rss_after'])}"
                                            for n in names]),
            ("server peak RSS during", [mib(costs[n]["rss_peak"]) for n in names])]
    print_rows(rows)
    for n in names:
        print(f"  {COSTED[n]}: {fmt_req(costs[n]) or '-'}")
    if streamed:
        print("  the server streams lists (WatchList: sendInitialEvents=true answered with the initial events "
              "and their closing bookmark)")
    else:
        print(f"  the server refused the streaming list: {costs['watchlist'].get('refused', '?')}")


def print_bounce_round(bench):
    """Runs and prints the bounce round; returns (failed checks, figures)."""
    log("bounce round: one `bouncer run` over 3 Deployments x 2 pods")
    rows, requests, timeline, wall, rss = bench.bounce_round()
    print("\n### bounce round (one `bouncer run`, 3 Deployments x 2 pods, back to back, on the loaded cluster)\n")
    for r in rows:
        w = r["workload"]
        print(f"  {w['kind']}/{w['name']}: {r['decision']} in {r.get('durationSeconds') or 0:.1f} s "
              f"({r.get('verification') or r['reason']})")
    print(f"  run: {wall:.1f} s wall, {rss / MIB:.1f} MiB peak RSS")
    bounced = sum(r["decision"] == "bounced" for r in rows)
    failed = []
    overheads = []
    print("  per bounce, from the audit log (first request = bouncer's fresh read; rollout = patch -> the "
          "deployment controller's last status write; last = its verification and Event):")
    for t in timeline:
        if None in (t["first"], t["complete"], t["last"], t["end"]):
            print(f"    {t['name']}: incomplete timeline {t}")
            failed.append(f"bounce round: no complete audit timeline for {t['name']}")
            continue
        rollout = (t["complete"] - t["patch"]).total_seconds()
        overhead = (t["end"] - t["first"]).total_seconds() - rollout
        overheads.append(overhead)
        print(f"    {t['name']}: fresh read -> patch {(t['patch'] - t['first']).total_seconds():.3f} s, rollout "
              f"{rollout:.2f} s, complete -> its last request {(t['last'] - t['complete']).total_seconds():.3f} s, "
              f"-> the next bounce's fresh read {(t['end'] - t['last']).total_seconds():.3f} s: "
              f"overhead {overhead:.3f} s")
    gaps = [(b["first"] - a["complete"]).total_seconds() for a, b in zip(timeline, timeline[1:])
            if a["complete"] and b["first"]]
    fmt = lambda xs: ", ".join(f"{x:.2f} s" for x in xs) or "-"
    print(f"  previous rollout complete -> next bounce's first request: {fmt(gaps)}")
    print(f"  bouncer's requests in the namespace (per bounce, {bounced} bounces):")
    for (verb, res), c in sorted(requests.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"    {verb:6} {res:28} {c / max(bounced, 1):5.1f}")
    if bounced != 3:
        failed.append(f"bounce round: {bounced} of 3 Deployments bounced")
    if requests[("patch", "deployments")] != bounced or requests[("watch", "deployments")] != bounced:
        failed.append(f"bounce round: expected one patch and one watch per bounce, saw "
                      f"{requests[('patch', 'deployments')]} patches and {requests[('watch', 'deployments')]} watches")
    # The queue gives a reverting owner the settle past a rollout's completion, then confirms the
    # restart, before the next bounce starts.
    if any(g > SETTLE + 1.0 for g in gaps):
        failed.append(f"bounce round: a next bounce started more than the settle ({SETTLE:g} s) + 1 s "
                      f"after the previous rollout completed: {gaps}")
    figures = {"wall": wall, "rss_kib": rss, "overheads": overheads, "gaps": gaps,
               "rollouts": [(t["complete"] - t["patch"]).total_seconds() for t in timeline if t["complete"]]}
    return failed, figures


# BOUNCER_VERIFY_SETTLE of the bounce round (bouncer's default).
SETTLE = 2.0


def expected_lists(counts):
    want = {("list", k): max(1, math.ceil(counts[k] / PAGE)) for k, _ in KINDS}
    # metrics-server ignores limit: it answers the PodMetrics LIST whole, with no continue token.
    want[("list", "pods.metrics.k8s.io")] = 1
    # The policy lists Pod: bare pods' attempt marks live on the run Lease, read once per run.
    want[("get", "leases")] = 1
    return want


def check_requests(requests, counts):
    """Problems with bouncer's requests: anything but one LIST per kind per page (and the
    one Lease read for bare pods' attempt marks): nothing per workload."""
    want = expected_lists(counts)
    problems = []
    for i, r in enumerate(requests):
        if dict(r) != want:
            extra = {k: v for k, v in r.items() if want.get(k) != v}
            problems.append(f"run {i + 1}: expected {sorted(want.items())}, differs in {sorted(extra.items())}")
    return problems


def summary(results, counts, requests, extra):
    """The figures of one size, for the scaling table, the targets and the plot."""
    out = {"pods": extra["pods"], "shape": extra["shape"], "load_seconds": extra["load_seconds"], "counts": counts, "contenders": {}}
    reqs = request_counts(list(results), counts, requests)
    for name, ms in results.items():
        out["contenders"][name] = {"wall": med([m[0] for m in ms]), "wall_min": min(m[0] for m in ms),
                                   "wall_max": max(m[0] for m in ms), "rss_kib": med([m[1] for m in ms]),
                                   "cpu": med([m[2] for m in ms]), "requests": reqs[name], "runs": len(ms)}
    out.update({k: v for k, v in extra.items() if k not in out})
    return out


def print_scaling(sizes):
    names = [n for n in LABELS if any(n in s["contenders"] for s in sizes)]
    print("\n### scaling (medians: wall time / peak RSS)\n")
    rows = [("pods", [LABELS[n] for n in names] + ["bouncer requests"])]
    for s in sizes:
        c = s["contenders"]
        rows.append((size_label(s), [f"{c[n]['wall']:.2f} s / {fmt_mib(c[n]['rss_kib'])}" if n in c else "-"
                                        for n in names] + [f"{c['bouncer']['requests']:.0f}"]))
    print_rows(rows)
    print(f"\n### requests per run (bouncer's are one LIST per kind per page of {PAGE:,}, plus the Lease GET)\n")
    rows = [("pods", [LABELS[n] for n in names if n in AGENTS]
             + ["bouncer, expected"])]
    for s in sizes:
        c = s["contenders"]
        rows.append((size_label(s), [f"{c[n]['requests']:.0f}" if n in c else "-" for n in names if n in AGENTS]
                     + [str(sum(expected_lists(s["counts"]).values()))]))
    print_rows(rows)


def size_label(s):
    return f"{s['pods']:,}" + (" bare" if s.get("shape") == "bare" else "")


def parse_sizes(text):
    """"500,bare:5000,5000" -> [(shape, pods)]: the bare fleet first (loading a shape deletes the
    other's pods), then the controller-owned sizes in order (loaded incrementally)."""
    out = []
    for item in text.split(","):
        shape, _, pods = item.rpartition(":")
        out.append((shape or "owned", int(pods)))
    return sorted(out, key=lambda sp: (sp[0] != "bare", sp[1]))


def targets(sizes, bounce):
    """[(target, figure, holds)] over every size measured."""
    out = []
    for s in sizes:
        c = s["contenders"]
        ratio = c["bouncer"]["wall"] / c["pods"]["wall"]
        shape = s.get("shape", "owned")
        out.append((f"{s['pods']:,} {SHAPES[shape]}: bouncer plan wall <= {PLAN_VS_PODS_LIST}x the pods LIST alone",
                    f"{ratio:.2f}x ({c['bouncer']['wall']:.2f} s vs {c['pods']['wall']:.2f} s; "
                    f"{c['bouncer']['wall'] / c['floor-par']['wall']:.2f}x the concurrent floor, "
                    f"{c['bouncer']['wall'] / c['pods-paged']['wall']:.2f}x the pods LIST by {PAGE:,})",
                    ratio <= PLAN_VS_PODS_LIST))
        if (shape, s["pods"]) in RSS_TARGETS_MIB:
            mib, want = c["bouncer"]["rss_kib"] / MIB, RSS_TARGETS_MIB[(shape, s["pods"])]
            out.append((f"{s['pods']:,} {SHAPES[shape]}: bouncer peak RSS <= {want} MiB", f"{mib:.1f} MiB", mib <= want))
        cost = s.get("server_cost")
        if cost:
            b, k = cost["bouncer"], cost["kubectl"]
            served = lambda x: sum(x["seconds"].values())
            sent = lambda x: sum(x["bytes"].values())
            # kubectl reads the pods only; the plan also reads the workloads and PodMetrics (the
            # latter through the aggregator: metrics-server's time counts as the server's).
            pods_only = b["seconds"].get("LIST pods", 0.0)
            # Time serving, not bytes: kubectl (Go's HTTP transport) accepts gzip, so the server
            # compresses its pages and sends a twentieth of the bytes, at a CPU cost of its own.
            out.append((f"{s['pods']:,} {SHAPES[shape]}: the API server's time serving one bouncer plan <= one "
                        f"`kubectl get pods -A -o json`",
                        f"{served(b):.2f} s vs {served(k):.2f} s (of the plan's, its pods LISTs "
                        f"{pods_only:.2f} s; bytes sent {sent(b) / 1e6:.1f} MB vs "
                        f"{sent(k) / 1e6:.1f} MB) "
                        f"(lists {'streamed' if s.get('streamed') and b['requests'].get('WATCH pods') else 'paginated'};"
                        f" the server {'supports' if s.get('streamed') else 'refuses'} streaming lists)",
                        served(b) <= served(k)))
        out.append((f"{s['pods']:,} {SHAPES[shape]}: one LIST per kind per page, nothing per workload or policy",
                    f"{c['bouncer']['requests']:.0f} requests, expected {sum(expected_lists(s['counts']).values())}"
                    + ("" if s["requests_ok"] else " (DIFFERENT)"), s["requests_ok"]))
    if bounce and bounce["overheads"]:
        worst = max(bounce["overheads"])
        out.append((f"bounce overhead beyond the rollout <= {BOUNCE_OVERHEAD_S} s per bounce",
                    f"{statistics.mean(bounce['overheads']):.3f} s mean, {worst:.3f} s worst over "
                    f"{len(bounce['overheads'])} bounces", worst <= BOUNCE_OVERHEAD_S))
    return out


def write_figures(path, sizes, bounce, mlr_status):
    """The figures, for the plot; merged into those already in `path` (a size measured now
    replaces the same size measured before; the bounce round is kept until one is measured)."""
    if not path:
        return
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    key = lambda s: (s.get("shape", "owned") != "bare", s["pods"])
    mine = {key(s) for s in sizes}
    merged = sorted([s for s in old.get("sizes", []) if key(s) not in mine] + sizes, key=key)
    with open(path, "w") as f:
        json.dump({"sizes": merged, "bounce": bounce or old.get("bounce"), "labels": LABELS, "mlr": mlr_status,
                   "binary_bytes": os.path.getsize(os.environ["BENCH_BOUNCER"])}, f, indent=1, default=str)
        f.write("\n")


def rounds_at(size, runs, warmup):
    """The big sizes are expensive (the DIY script alone takes minutes and GiBs at 50,000 pods):
    fewer measured rounds there."""
    if size >= 50000:
        return min(runs, 2), min(warmup, 1)
    if size >= 20000:
        return min(runs, 3), min(warmup, 1)
    return runs, warmup


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="5000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--work", required=True)
    ap.add_argument("--figures", help="write the measured figures (JSON) here, for the plot")
    args = ap.parse_args()
    bench = Bench(args, args.work)
    mlr_status = os.environ.get("BENCH_MLR_STATUS", "")
    sizes = []
    failed = []
    for shape, size in parse_sizes(args.sizes):
        log(f"loading {size} {SHAPES[shape]}")
        bench.shape(shape)
        r = subprocess.run([sys.executable, os.path.join(HERE, "load.py"), "--pods", str(size), "--shape", shape],
                           stdout=subprocess.PIPE, check=True)
        load = json.loads(r.stdout)
        counts = bench.object_counts()
        runs, warmup = rounds_at(size, args.runs, args.warmup)
        log(f"loaded in {load['seconds']} s; running {warmup} warm-up + {runs} rounds")
        load_avg = " ".join(f"{x:.1f}" for x in os.getloadavg())
        bench.descheduler_want = counts["owned-bench-pods"]
        bench.descheduler_cycles = []
        results, requests = bench.run(runs, warmup)
        print_table(shape, load["pods"], results, requests, counts, load["seconds"], load_avg, mlr_status)
        planned, diy_workloads, diy_pods = bench.decisions()
        print(f"decisions: bouncer plans {planned} bounces; the DIY script finds {diy_pods} pods over 85% "
              f"in {diy_workloads} workloads" + ("" if planned == diy_workloads else "  <-- MISMATCH"))
        if planned != diy_workloads or planned == 0:
            failed.append(f"{size} {SHAPES[shape]}: bouncer planned {planned}, DIY found {diy_workloads} workloads")
        extra = {"pods": load["pods"], "shape": shape, "load_seconds": load["seconds"], "load_average": load_avg,
                 "planned": planned, "diy_workloads": diy_workloads}
        if "descheduler" in results:
            evicted, first, ncycles = bench.descheduler_decisions()
            want = counts["owned-bench-pods"]
            print(f"decisions: the descheduler's dry-run PodLifeTime evicts {evicted} pods in its first complete "
                  f"cycle (cycle {ncycles:.0f}; its first cycle decided on {first}); {want} bench pods are owned by a "
                  f"controller and older than a minute" + ("" if evicted == want else "  <-- MISMATCH"))
            if evicted != want:
                failed.append(f"{size} {SHAPES[shape]}: the descheduler decided on {evicted} pods, expected {want}")
            extra.update(descheduler_evicted=evicted, descheduler_first_cycle=first, descheduler_cycles=ncycles)
        problems = check_requests(requests["bouncer"], counts)
        failed += [f"{size} {SHAPES[shape]}: {p}" for p in problems]
        many = bench.many_policies()
        print(f"with 25 policies instead of 1: {sum(many.values())} requests"
              + (", the same" if many == requests["bouncer"][0] else f"  <-- DIFFERENT: {sorted(many.items())}"))
        if many != requests["bouncer"][0]:
            failed.append(f"{size} {SHAPES[shape]}: requests depend on the number of policies")
        extra["requests_ok"] = not problems and many == requests["bouncer"][0]
        log("what one run costs the API server")
        costs, streamed = measure_costs(bench)
        print_costs(costs, streamed)
        extra["server_cost"] = {n: {k: ({f"{verb} {res}": v for (verb, res), v in x.items()} if isinstance(x, dict) else x)
                                    for k, x in c.items()} for n, c in costs.items()}
        extra["streamed"] = streamed
        sizes.append(summary(results, counts, requests, extra))
        write_figures(args.figures, sizes, None, mlr_status)
    if len(sizes) > 1:
        print_scaling(sizes)
    bounce_failed, bounce = print_bounce_round(bench)
    failed += bounce_failed
    size = os.path.getsize(os.environ["BENCH_BOUNCER"])
    print(f"\nrelease binary: {size / 1e6:.1f} MB ({size} bytes)")
    print("\n### targets\n")
    for what, figure, holds in targets(sizes, bounce):
        print(f"  {'HOLDS ' if holds else 'MISSED'}  {what}: {figure}")
    write_figures(args.figures, sizes, bounce, mlr_status)
    if failed:
        print("\nFAILED checks:\n  " + "\n  ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
