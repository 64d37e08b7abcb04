{{/*
Names, labels, the image reference and the operator's RBAC rules.
*/}}

{{- define "rlkube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlkube.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Deployment, ServiceAccount and namespaced RBAC objects: <fullname>-operator (54 + 9 chars). */}}
{{- define "rlkube.operatorName" -}}
{{- printf "%s-operator" (include "rlkube.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* Cluster-scoped objects carry the release namespace, so two releases never collide. */}}
{{- define "rlkube.clusterObjectName" -}}
{{- printf "%s-%s" .Release.Namespace (include "rlkube.operatorName" .) }}
{{- end }}

{{- define "rlkube.metricsServiceName" -}}
{{- printf "%s-metrics" (include "rlkube.operatorName" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "rlkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rlkube.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rlkube.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rlkube.labels" -}}
helm.sh/chart: {{ include "rlkube.chart" . }}
{{ include "rlkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rlkube
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "rlkube.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "rlkube.jobImage" -}}
{{- default (include "rlkube.image" .) .Values.jobDefaults.image }}
{{- end }}

{{/* jobDefaults as JSON, without empty values: {"trainer": {...}, "evaluator": {...}}. */}}
{{- define "rlkube.defaultPodSettings" -}}
{{- $out := dict }}
{{- range $role := list "trainer" "evaluator" }}
{{- $settings := dict }}
{{- range $key, $value := index $.Values.jobDefaults $role }}
{{- if $value }}
{{- $_ := set $settings $key $value }}
{{- end }}
{{- end }}
{{- $_ := set $out $role $settings }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The operator's permissions, mirroring rlkube_operator/rbac.py (NAMESPACED_RULES, CLUSTER_RULES).
tests/delivery/test_chart_rbac.py fails when the two differ.
*/}}
