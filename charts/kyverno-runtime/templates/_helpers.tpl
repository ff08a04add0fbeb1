{{/*
Chart name, truncated to 63 characters: label values and DNS-1123 names
allow no more.
*/}}
{{- define "kyverno-runtime.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release-chart, or the release name alone when it already contains
the chart name. Every object of the release is named after it, and the daemon
is told it (DAEMONSET_NAME) to find its own DaemonSet.
*/}}
{{- define "kyverno-runtime.fullname" -}}
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

{{- define "kyverno-runtime.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "kyverno-runtime.labels" -}}
helm.sh/chart: {{ include "kyverno-runtime.chart" . }}
{{ include "kyverno-runtime.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: kyverno-runtime
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The DaemonSet's selector: immutable, so only what never changes. */}}
{{- define "kyverno-runtime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kyverno-runtime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kyverno-runtime.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kyverno-runtime.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kyverno-runtime.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Where the push TLS Secret is mounted; the daemon's --push-tls-* flags point into it. */}}
{{- define "kyverno-runtime.pushTLSDir" -}}
/etc/kyverno-runtime/push-tls
{{- end }}

{{/*
Combinations the daemon would refuse at boot fail the render instead, so
that a bad configuration never becomes a crash-looping DaemonSet.
*/}}
{{- define "kyverno-runtime.validate" -}}
{{- $d := .Values.daemon }}
{{- if and $d.push.target (not $d.push.tls.secretName) }}
{{- fail (printf "daemon.push.target is %q but daemon.push.tls.secretName is empty: the push sink is mTLS only; set daemon.push.tls.secretName to a Secret holding ca.crt, tls.crt and tls.key" $d.push.target) }}
{{- end }}
{{- if and $d.events.enabled (not $d.reports.enabled) }}
{{- fail "daemon.events.enabled is true but daemon.reports.enabled is false: Events are emitted from the reporter's flush; set daemon.reports.enabled=true or daemon.events.enabled=false" }}
{{- end }}
{{- end }}
