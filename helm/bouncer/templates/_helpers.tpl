{{/* Chart name, overridable. */}}
{{- define "bouncer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's namespaced objects. */}}
{{- define "bouncer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Name of cluster-scoped objects and of the Roles the release puts into other namespaces. It carries
the release namespace, so two releases of the same name in different namespaces do not collide.
*/}}
{{- define "bouncer.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "bouncer.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{- define "bouncer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bouncer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bouncer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bouncer.labels" -}}
helm.sh/chart: {{ include "bouncer.chart" . }}
{{ include "bouncer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "bouncer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bouncer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "bouncer.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* RBAC rules bouncer needs in every namespace it may bounce in. */}}
{{- define "bouncer.namespacedRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [replicasets, deployments, statefulsets, daemonsets]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [deployments, statefulsets, daemonsets]
  verbs: [get, patch]
- apiGroups: [metrics.k8s.io]
  resources: [pods]
  verbs: [get, list]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list]
{{- if .Values.eviction.enabled }}
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
{{- end }}
{{- if .Values.toolhive.enabled }}
- apiGroups: [toolhive.stacklok.dev]
  resources: [mcpservers]
  verbs: [get, patch]
{{- end }}
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* RBAC rules that only exist cluster-wide. */}}
{{- define "bouncer.clusterRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end -}}

{{/* Whether the cluster serves ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, 1.30+). */}}
{{- define "bouncer.admissionPolicyServed" -}}
{{- if and (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding") -}}
true
{{- end -}}
{{- end -}}

{{/* CEL for the admission policy: the keys of map A that differ from map B (added, changed or removed). */}}
{{- define "bouncer.celChanged" -}}
({{ index . 0 }}.filter(k, !(k in {{ index . 1 }}) || {{ index . 0 }}[k] != {{ index . 1 }}[k]) + {{ index . 1 }}.filter(k, !(k in {{ index . 0 }})))
{{- end -}}

{{/*
"true" when the pod gets at least one policy: from values.policies, the chart's policies/ files or
a ConfigMap of the user's own. Without one every run would fail, so the CronJob stays suspended.
*/}}
{{- define "bouncer.hasPolicies" -}}
{{- if or .Values.policies .Values.policiesConfigMap (.Files.Glob "policies/*.yaml") -}}
true
{{- end -}}
{{- end -}}

{{/* The ConfigMap mounted at /etc/bouncer/policies. */}}
{{- define "bouncer.policiesConfigMap" -}}
{{- .Values.policiesConfigMap | default (printf "%s-policies" (include "bouncer.fullname" .)) -}}
{{- end -}}
