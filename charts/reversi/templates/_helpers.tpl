{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "reversi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reversi.fullname" -}}
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

{{- define "reversi.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reversi.instanceLabels" -}}
app.kubernetes.io/name: {{ include "reversi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "reversi.selectorLabels" -}}
{{ include "reversi.instanceLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The admission server's pods (reversi-admission): the webhooks' Service selects them. */}}
{{- define "reversi.admissionSelectorLabels" -}}
{{ include "reversi.instanceLabels" . }}
app.kubernetes.io/component: admission
{{- end }}

{{- define "reversi.admissionLabels" -}}
helm.sh/chart: {{ include "reversi.chart" . }}
{{ include "reversi.admissionSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: reversi
{{- end }}

{{- define "reversi.admissionServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- printf "%s-admission" (include "reversi.serviceAccountName" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "reversi.labels" -}}
helm.sh/chart: {{ include "reversi.chart" . }}
{{ include "reversi.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: reversi
{{- end }}

{{- define "reversi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "reversi.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "reversi.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "reversi.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "reversi.fullname" .) }}
{{- end }}

{{/* The Service's DNS names: the webhook serving certificate is issued for these. */}}
{{- define "reversi.serviceDNSNames" -}}
{{- $svc := include "reversi.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/*
The webhook serving certificate made by the chart, once per render (the Secret, both webhook
configurations and the Deployment's checksum share it): the existing Secret is reused so that the
CA stays the same across upgrades; otherwise a new CA and a certificate for the Service's names.
Returns a dict with ca, crt, key (PEM).
*/}}
{{- define "reversi.webhookTLS" -}}
{{- $cache := .Values.webhook }}
{{- if not (hasKey $cache "_tls") }}
{{- $name := include "reversi.webhookSecretName" . }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- $tls := dict }}
{{- if and $existing $existing.data (index $existing.data "ca.crt") (index $existing.data "tls.crt") (index $existing.data "tls.key") }}
{{- $tls = dict "ca" (index $existing.data "ca.crt" | b64dec) "crt" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) }}
{{- else }}
{{- $days := int .Values.webhook.certValidityDays }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "reversi.fullname" .)) $days }}
{{- $dns := include "reversi.serviceDNSNames" . | fromJsonArray }}
{{- $cert := genSignedCert (index $dns 2) nil $dns $days $ca }}
{{- $tls = dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key }}
{{- end }}
{{- $_ := set $cache "_tls" $tls }}
{{- end }}
{{- toJson (get $cache "_tls") }}
{{- end }}

{{- define "reversi.certificateName" -}}
{{- printf "%s-webhook" (include "reversi.fullname" .) }}
{{- end }}

{{/* Namespaces where the operator's namespaced rules are bound (empty: the whole cluster). */}}
{{- define "reversi.namespaced" -}}
{{- if .Values.watchNamespaces }}true{{ end }}
{{- end }}
