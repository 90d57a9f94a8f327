#!/usr/bin/env bash
# The script users write instead of bouncer: every pod whose working set is above 85% of its
# memory limit (sum over its containers), from kubectl and jq. Prints one line per pod:
# NAMESPACE POD OWNER_KIND OWNER_NAME. Needs KUBECONFIG; BENCH_KUBECTL picks the kubectl binary.
set -euo pipefail
kubectl="${BENCH_KUBECTL:-kubectl}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$kubectl" get pods -A -o json >"$dir/pods.json"
"$kubectl" get --raw /apis/metrics.k8s.io/v1beta1/pods >"$dir/metrics.json"
jq -r --slurpfile metrics "$dir/metrics.json" '
  def bytes: capture("^(?<n>[0-9.]+)(?<u>[A-Za-z]*)$")
    | (.n | tonumber) * ({"": 1, "m": 0.001, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                          "Ki": 1024, "Mi": 1048576, "Gi": 1073741824, "Ti": 1099511627776})[.u];
  ($metrics[0].items | map({key: "\(.metadata.namespace)/\(.metadata.name)",
                            value: ([.containers[].usage.memory | bytes] | add)}) | from_entries) as $usage
  | .items[]
  | select(.metadata.labels.bench == "true")
  | "\(.metadata.namespace)/\(.metadata.name)" as $key
  | [.spec.containers[].resources.limits.memory // empty | bytes] as $limits
  | select(($limits | length) > 0 and $usage[$key] != null)
  | select($usage[$key] > 0.85 * ($limits | add))
  | (.metadata.ownerReferences // [] | map(select(.controller)) | first) as $owner
  | "\(.metadata.namespace) \(.metadata.name) \($owner.kind // "-") \($owner.name // .metadata.name)"
' "$dir/pods.json"
