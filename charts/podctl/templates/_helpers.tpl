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

{{/* One slice is one host: a slice type whose slices span several hosts is refused, saying what
works. (The controller places and replaces multi-host slices, but their hosts do not train as
one program yet.) Same default chips per host as the controller's (crates/controller slice.rs). */}}
{{- define "podctl.singleHostSlices" -}}
{{- $tpu := .Values.tpu -}}
{{- $chips := 1 -}}
{{- range (splitList "x" (toString $tpu.topology)) }}{{ $chips = mul $chips (atoi .) }}{{ end -}}
{{- $small := and (has $tpu.accelerator (list "tpu-v6e-slice" "tpu-v5-lite-podslice")) (le (int $chips) 8) -}}
{{- $perHost := int ($tpu.chipsPerHost | default (ternary $chips (min $chips 4) $small)) -}}
{{- if or (lt $perHost 1) (gt (int $chips) $perHost) -}}
{{- fail (printf "tpu.topology %s of %s is one slice across %d hosts, and training one slice across several hosts is not built yet; what works is several single-host slices over DCN: install with a single-host slice type (tpu.topology=2x4 on ct6e-standard-8t nodes, v6e-8) and give jobs more slices with mesh.dcn" (toString $tpu.topology) $tpu.accelerator (div (int $chips) (max $perHost 1))) -}}
{{- end -}}
{{- end -}}

{{/* The address workers dial: the client Service. */}}
{{- define "podctl.clientAddress" -}}
{{- printf "%s.%s.svc:%d" (include "podctl.fullname" .) .Release.Namespace (int .Values.coordinator.port) -}}
{{- end -}}
