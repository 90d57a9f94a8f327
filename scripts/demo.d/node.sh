# scripts/demo --node: one real node beside the KWOK nodes, the image built without a registry,
# the chart installed with Helm's engine, and its CronJob bouncing a process that really leaks.
# Sourced by scripts/demo (which defines `say`); functions only.

NODE_NS=node-demo
NODE_APP=leaky
NODE_THRESHOLD_MIB=40
# 1 MiB a second: past the threshold about 40 s after the pod starts; the restarted pod is far
# below it when metrics-server first measures it (about 20 s after it starts).
NODE_RATE_MIB=1

node_die() { echo "scripts/demo: $*" >&2; exit 1; }

node_preflight() {
  [ "$(id -u)" = 0 ] || node_die "--node needs root (cgroups, iptables, a bridge): run it as root or with sudo"
  # The API server binds the pod bridge's address so the CronJob's pods reach it (scripts/cluster).
  export BOUNCER_CLUSTER_NODE=1
  local state="${BOUNCER_CLUSTER_DIR:-/tmp/bouncer-cluster}"
  if scripts/cluster status >/dev/null 2>&1 && [ ! -f "$state/real-node" ]; then
    node_die "the running cluster listens on loopback only and has no room for a real node; stop it with 'scripts/cluster down', then run 'scripts/demo --node' again"
  fi
  # One real node per machine: runs take turns (scripts/node-test takes the same lock).
  exec 7>/tmp/bouncer-node.lock
  flock -n 7 || node_die "another real-node run (scripts/node-test or a demo) holds /tmp/bouncer-node.lock; try again when it ends"
}

node_deployment() {
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $NODE_APP, namespace: $NODE_NS}
spec:
  replicas: 1
  selector: {matchLabels: {app: $NODE_APP}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: $NODE_APP}}
    spec:
      tolerations: [{key: bouncer.dev/real-node, operator: Exists, effect: NoSchedule}]
      nodeSelector: {kubernetes.io/hostname: real-node}
      terminationGracePeriodSeconds: 5
      enableServiceLinks: false
      automountServiceAccountToken: false
      containers:
      - name: leaky
        image: $(scripts/image ref leaky)
        imagePullPolicy: Never
        args: ["$NODE_RATE_MIB", "1"]
        securityContext: {runAsNonRoot: true, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
YAML
}

node_values() {
  local ref policy
  ref="$(scripts/image ref bouncer)"
  policy="$(cat <<YAML
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {name: leaky-memory}
spec:
  target: {namespaces: [$NODE_NS], selector: {matchLabels: {app: $NODE_APP}}, kinds: [Deployment]}
  triggers: {memory: {above: ${NODE_THRESHOLD_MIB}Mi}}
  # Counted from the oldest pod's start too: short, so the minutes-old pod is due.
  cooldown: 20s
YAML
)"
  jq -n --arg repo "${ref%:*}" --arg tag "${ref##*:}" --arg ns "$NODE_NS" --arg policy "$policy" '{
    image: {repository: $repo, tag: $tag, pullPolicy: "Never"},
    schedule: "* * * * *", startingDeadlineSeconds: 50, rolloutTimeout: "90s",
    rbac: {namespaces: [$ns]}, policies: {"leaky.yaml": $policy},
    tolerations: [{key: "bouncer.dev/real-node", operator: "Exists", effect: "NoSchedule"}],
    nodeSelector: {"kubernetes.io/hostname": "real-node"}}'
}

node_start() {
  local t0=$SECONDS venv="${BOUNCER_CACHE_DIR}/helm-venv"
  say "a real node: the images without a registry (scripts/image), kubelet, kube-proxy and a containerd of its own (scripts/node)"
  scripts/image build bouncer leaky >/dev/null
  scripts/node up 7>&-
  scripts/image import "$(scripts/node socket)" bouncer leaky
  # Helm's engine (helm-python-sdk) in the virtualenv the chart tests use; created on first use.
  scripts/helm-test --version >/dev/null 2>&1 || node_die "could not create the virtualenv in $venv (scripts/helm-test --version)"
  if kubectl get namespace "$NODE_NS" >/dev/null 2>&1; then
    say "removing the previous demo's release and namespace $NODE_NS"
    "$venv/bin/python" scripts/demo.d/chart.py uninstall "$NODE_NS"
    kubectl delete namespace "$NODE_NS" --wait=true --timeout=120s >/dev/null
  fi
  say "a process that leaks ${NODE_RATE_MIB} MiB a second on the real node, and the chart: a CronJob every minute, a policy bouncing it above ${NODE_THRESHOLD_MIB}Mi"
  kubectl create namespace "$NODE_NS" >/dev/null
  node_deployment | kubectl apply -f -
  "$venv/bin/python" scripts/demo.d/chart.py install "$NODE_NS" "$(node_values)"
  kubectl -n "$NODE_NS" rollout status "deployment/$NODE_APP" --timeout=90s >/dev/null
  kubectl -n "$NODE_NS" get pods -o wide
  echo "(real node part ready in $((SECONDS - t0)) s; the CronJob works while the ToolHive part runs)"
}

node_pod_mib() { # pod: its working set in MiB as metrics-server reports it, or nothing
  kubectl get --raw "/apis/metrics.k8s.io/v1beta1/namespaces/$NODE_NS/pods/$1" 2>/dev/null |
    jq -r '[.containers[].usage.memory | if endswith("Ki") then (.[:-2] | tonumber) / 1024
      elif endswith("Mi") then .[:-2] | tonumber else (tonumber / 1048576) end] | add | floor' 2>/dev/null || true
}

node_app_pod() { # the leaky app's running pod (not one that is terminating)
  kubectl -n "$NODE_NS" get pods -l "app=$NODE_APP" --field-selector status.phase=Running -o json |
    jq -r '[.items[] | select(.metadata.deletionTimestamp == null)] | sort_by(.metadata.creationTimestamp) | last | .metadata.name // empty'
}

node_bounced_job() { # the first of the CronJob's Jobs whose report says it bounced the leak
  local job
  for job in $(kubectl -n "$NODE_NS" get jobs -l app.kubernetes.io/name=bouncer --sort-by=.metadata.creationTimestamp \
    -o jsonpath='{range .items[?(@.status.succeeded)]}{.metadata.name}{"\n"}{end}'); do
    if kubectl -n "$NODE_NS" logs "job/$job" 2>/dev/null |
      jq -e 'select(.kind? == "BounceReport") | .rows[] | select(.decision == "bounced")' >/dev/null 2>&1; then
      echo "$job"; return 0
    fi
  done
  return 1
}

node_show() {
  local t0=$SECONDS job="" pod mib
  say "on the real node: the chart's CronJob bounces the leak once the kubelet measures it past ${NODE_THRESHOLD_MIB}Mi"
  until job="$(node_bounced_job)"; do
    [ $((SECONDS - t0)) -lt 240 ] || node_die "no run of the CronJob bounced the leak within 4 minutes (kubectl -n $NODE_NS get jobs,pods)"
    pod="$(node_app_pod)"
    mib="$(node_pod_mib "$pod")"
    echo "waiting: $pod ${mib:+${mib}Mi}${mib:-no metrics yet} (threshold ${NODE_THRESHOLD_MIB}Mi); Jobs so far: $(kubectl -n "$NODE_NS" get jobs --no-headers 2>/dev/null | wc -l)"
    sleep 10
  done
  kubectl -n "$NODE_NS" get cronjob,jobs
  echo
  echo "\$ kubectl -n $NODE_NS logs job/$job | jq 'select(.kind == \"BounceReport\")'   (rows, trimmed)"
  kubectl -n "$NODE_NS" logs "job/$job" | jq -c 'select(.kind? == "BounceReport") | .rows[] |
    {policy, workload: "\(.workload.kind | ascii_downcase)/\(.workload.namespace)/\(.workload.name)",
     pod: .memory.pod, memory: "\(.memory.usage / 1048576 | floor)Mi", decision, durationSeconds, reason}'
  kubectl -n "$NODE_NS" logs "job/$job" | jq -c 'select(.kind? == "BounceReport") | .summary'
  echo
  kubectl -n "$NODE_NS" get events --field-selector reason=Bounced
  echo
  echo "the Job's pod: $(kubectl -n "$NODE_NS" get pods -l "job-name=$job" -o jsonpath='{.items[0].spec.nodeName}, serviceAccount {.items[0].spec.serviceAccountName}, uid {.items[0].spec.containers[0].securityContext.runAsUser}, readOnlyRootFilesystem {.items[0].spec.containers[0].securityContext.readOnlyRootFilesystem}, exit {.items[0].status.containerStatuses[0].state.terminated.exitCode}')"
  pod="$(node_app_pod)"
  until mib="$(node_pod_mib "$pod")"; [ -n "$mib" ]; do
    [ $((SECONDS - t0)) -lt 330 ] || break
    sleep 3
  done
  echo "the restarted pod $pod: ${mib:-no metrics yet}Mi (restartedAt $(kubectl -n "$NODE_NS" get pod "$pod" -o jsonpath='{.metadata.annotations.kubectl\.kubernetes\.io/restartedAt}'))"
}
