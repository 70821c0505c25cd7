{{- define "oomwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oomwatch.fullname" -}}
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

{{- define "oomwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oomwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "oomwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "oomwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: oomwatch
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "oomwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "oomwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- /* No image is published for this project: the user builds one (scripts/build-image or the Dockerfile),
pushes it to a registry of theirs and names it here. */ -}}
{{- define "oomwatch.image" -}}
{{- $repository := required "image.repository is not set: oomwatch publishes no image. Build it (scripts/build-image, or docker build from the Dockerfile), push it to your registry and install with --set image.repository=REGISTRY/oomwatch (docs/release.md)" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "oomwatch.kubeApiEnabled" -}}
{{- if eq (toString .Values.kubeApi.mode) "auto" }}true{{ end }}
{{- end }}
