{{/* The base name of every object: <release>, or <release>-podctl when the release name lacks it. */}}
{{- define "podctl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "podctl" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-podctl" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "podctl.labels" -}}
app.kubernetes.io/name: podctl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The coordinator pods. */}}
{{- define "podctl.selector" -}}
app.kubernetes.io/name: podctl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{/* The worker pods the controller makes (it labels them so). */}}
{{- define "podctl.workerSelector" -}}
app.kubernetes.io/name: podctl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "podctl.serviceAccount" -}}
{{- default (include "podctl.fullname" .) .Values.coordinator.serviceAccount.name -}}
{{- end -}}

{{- define "podctl.workerServiceAccount" -}}
{{- default (printf "%s-worker" (include "podctl.fullname" .)) .Values.workers.serviceAccount.name -}}
{{- end -}}

{{- define "podctl.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "podctl.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{/* The workers' TLS Secret: never the coordinators' (that one holds the server key). */}}
{{- define "podctl.workerTlsSecret" -}}
{{- if not .Values.tls.workerSecretName -}}
{{- fail "tls.workerSecretName is empty; name a Secret with ca.pem, client.pem and client.key only (docs/gke.md creates podctl-worker-tls)" -}}
{{- else if eq .Values.tls.workerSecretName .Values.tls.secretName -}}
{{- fail (printf "tls.workerSecretName is %q, the coordinators' Secret, which holds the server key; give workers a Secret with ca.pem, client.pem and client.key only (docs/gke.md creates podctl-worker-tls)" .Values.tls.secretName) -}}
{{- else -}}
{{- .Values.tls.workerSecretName -}}
{{- end -}}
{{- end -}}

{{/* The address workers dial: the client Service. */}}
{{- define "podctl.clientAddress" -}}
{{- printf "%s.%s.svc:%d" (include "podctl.fullname" .) .Release.Namespace (int .Values.coordinator.port) -}}
{{- end -}}
