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
{{- else if or .Values.serviceAccount.name .Values.rbac.create }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- else }}
{{- /* The Go original's fallback, kept only where the chart binds nothing
to it: binding the daemon's ClusterRole to "default" would give it to
every pod of the namespace. */}}
{{- "default" }}
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

{{/*
The Go original's values (docs/chart.md, "Values of the Go original"): its
keys under daemon moved to the top level or were renamed. An old key takes
effect when it is given non-empty and the new key is at the chart's
default, stated here (Helm gives templates no other way to tell a default
from a value set; ci/chart-check's go-original-keys render fails if one
drifts from values.yaml). A new key set to anything else wins. An empty
old value counts as not given: the original's own values file carries
every key, most of them empty.
*/}}
{{- define "kyverno-runtime.goKeys" -}}
keys:
  - {old: daemon.podLabels, new: podLabels, default: {}}
  - {old: daemon.podAnnotations, new: podAnnotations, default: {}}
  - {old: daemon.resources, new: resources, default: {requests: {cpu: 50m, memory: 96Mi}, limits: {memory: 256Mi}}}
  - {old: daemon.priorityClassName, new: priorityClassName, default: system-node-critical}
  - {old: daemon.nodeSelector, new: nodeSelector, default: {}}
  - {old: daemon.tolerations, new: tolerations, default: [{operator: Exists}]}
  - {old: daemon.affinity, new: affinity, default: {}}
  - {old: daemon.updateStrategy, new: updateStrategy, default: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}}
  - {old: daemon.observeInterval, new: daemon.drainInterval, default: ""}
  - {old: daemon.eventBufferSize, new: daemon.eventBuffer, default: ""}
  - {old: daemon.logLevel, new: daemon.log.level, default: info}
  - {old: daemon.rbac.extraRules, new: rbac.extraRules, default: []}
{{- end }}

{{/* The value at dotted path .path of map .m ("" if absent), as {"v": value} JSON. */}}
{{- define "kyverno-runtime.lookup" -}}
{{- $v := .m }}
{{- range splitList "." .path }}
{{- if and (kindIs "map" $v) (hasKey $v .) }}
{{- $v = index $v . }}
{{- else }}
{{- $v = "" }}
{{- end }}
{{- end }}
{{- toJson (dict "v" $v) }}
{{- end }}

{{/* The Go original's integer verbosity (daemon.logLevel) as a log level, as the daemon maps its --log-level. */}}
{{- define "kyverno-runtime.goLogLevel" -}}
{{- $n := int64 . }}
{{- if le $n -2 }}error{{ else if eq $n -1 }}warn{{ else if eq $n 0 }}info{{ else if eq $n 1 }}debug{{ else }}trace{{ end }}
{{- end }}

{{/*
The values the templates read where the Go original had a key of its own,
as JSON keyed by the new key's path: the new key's value, or the old key's
(see goKeys). Every template reads these through it, so an old key and
its new key render the same objects.
*/}}
{{- define "kyverno-runtime.effective" -}}
{{- $out := dict }}
{{- range (include "kyverno-runtime.goKeys" . | fromYaml).keys }}
{{- $old := .old }}
{{- $new := .new }}
{{- $o := (include "kyverno-runtime.lookup" (dict "m" $.Values "path" $old) | fromJson).v }}
{{- $n := (include "kyverno-runtime.lookup" (dict "m" $.Values "path" $new) | fromJson).v }}
{{- $d := (dict "v" .default | toJson | fromJson).v }}
{{- $v := $n }}
{{- if and (not (empty $o)) (deepEqual $n $d) }}
{{- if eq $old "daemon.logLevel" }}
{{- $v = include "kyverno-runtime.goLogLevel" $o }}
{{- else }}
{{- $v = $o }}
{{- end }}
{{- end }}
{{- $_ := set $out $new $v }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* One NOTES line per key of the Go original given: where it went, or why it is ignored. */}}
{{- define "kyverno-runtime.goNotes" -}}
{{- range (include "kyverno-runtime.goKeys" . | fromYaml).keys }}
{{- $old := .old }}
{{- $new := .new }}
{{- $o := (include "kyverno-runtime.lookup" (dict "m" $.Values "path" $old) | fromJson).v }}
{{- $n := (include "kyverno-runtime.lookup" (dict "m" $.Values "path" $new) | fromJson).v }}
{{- $d := (dict "v" .default | toJson | fromJson).v }}
{{- if not (empty $o) }}
{{- if deepEqual $n $d }}
- {{ $old }} is deprecated (the Go original's key): applied as {{ $new }}; set {{ $new }} instead.
{{- else }}
- {{ $old }} is deprecated (the Go original's key) and ignored: {{ $new }} is set, and wins.
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.daemon.securityContext }}
- daemon.securityContext is ignored (the Go original's key): the container's securityContext is fixed (privileged, readOnlyRootFilesystem), which loading and attaching the BPF programs needs.
{{- end }}
{{- with .Values.daemon.clusterDomain }}
{{- if eq (trimSuffix "." .) "cluster.local" }}
- daemon.clusterDomain is deprecated (the Go original's key): cluster.local is the only cluster domain the daemon recognizes in Service names, so it changes nothing.
{{- else }}
- daemon.clusterDomain={{ . }} is ignored (the Go original's key): Service names are recognized as NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local only; write NAME.NAMESPACE.svc (NAME.NAMESPACE.svc.{{ . }} is treated as an external domain name).
{{- end }}
{{- end }}
{{- end }}
