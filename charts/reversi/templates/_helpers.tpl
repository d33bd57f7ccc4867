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
The admission webhooks reversi-admission serves: the one place to change a path, a resource or an
operation. Paths are the admission server's contract (operator/reversi/handlers/admission.py:
kopf admission handlers whose ids are the paths; operator/reversi/adapters/webhooks.py holds the
same table for the local control plane, and a chart test holds the two equal); every webhook is
for group reversi.dev, version v1alpha1, AdmissionReview v1, sideEffects None unless the entry
says otherwise (validate-run and mutate-runstep count refused calls in a metric, but not for
dry-run requests: NoneOnDryRun). Status subresources are never matched: the operator writes status
and must never wait for a webhook. A RunStep's create crosses mutate-runstep only (it stamps, then
checks); its outcome write crosses no webhook (matchOutcome: the condition below), the API
server's policy checks it (recording-policies.yaml).
*/}}
{{- define "reversi.webhooks" -}}
mutating:
  - name: run
    path: /mutate-run
    resources: [runs]
    operations: [CREATE, UPDATE]
  - name: runstep
    path: /mutate-runstep
    resources: [runsteps]
    operations: [CREATE, UPDATE]
    sideEffects: NoneOnDryRun
    matchOutcome: true
    matchRecordedCall: true
  - name: rollbackrequest
    path: /mutate-rollbackrequest
    resources: [rollbackrequests]
    operations: [CREATE, UPDATE]
validating:
  - name: run
    path: /validate-run
    resources: [runs]
    operations: [CREATE, UPDATE]
    sideEffects: NoneOnDryRun
  - name: runstep
    path: /validate-runstep
    resources: [runsteps]
    operations: [UPDATE, DELETE]
    matchOutcome: true
    matchCleanup: true
  - name: rollbackrequest
    path: /validate-rollbackrequest
    resources: [rollbackrequests]
    operations: [CREATE, UPDATE]
  - name: toolmanifest
    path: /validate-toolmanifest
    resources: [toolmanifests]
    operations: [CREATE, UPDATE]
  - name: halt
    path: /validate-halt
    resources: [halts]
    operations: [CREATE, UPDATE]
    # a halt is stored while no admission replica answers: it is in force through the API server's
    # halts policy (recording-policies.yaml); its pattern is checked when a replica answers
    failOpen: true
  - name: clusterhalt
    path: /validate-clusterhalt
    resources: [clusterhalts]
    operations: [CREATE, UPDATE]
    # a halt is stored while no admission replica answers: it is in force through the API server's
    # halts policy (recording-policies.yaml); its pattern is checked when a replica answers
    failOpen: true
{{- end }}

{{/*
The RunStep webhooks are called unless the update is only an outcome write of a step that carries
its principal (operator/reversi/adapters/webhooks.py, OUTCOME_MATCH; a chart test holds them equal).
*/}}
{{- /* a RunStep deleted by the garbage collector or the namespace controller (with its Run or its
namespace) crosses no webhook (operator/reversi/adapters/webhooks.py, CLEANUP_MATCH) */ -}}
{{- define "reversi.cleanupMatch" -}}
request.operation != 'DELETE' || !(request.userInfo.username in ['system:serviceaccount:kube-system:generic-garbage-collector', 'system:serviceaccount:kube-system:namespace-controller', 'system:kube-controller-manager'])
{{- end }}

{{- /* a recorded call (a RunStep create that carries spec.runAtOpen) is stamped and checked by the
API server's policies (recording-policies.yaml), not by mutate-runstep
(operator/reversi/adapters/webhooks.py, RECORDED_CALL_SKIP) */ -}}
{{- define "reversi.recordedCallSkip" -}}
!(request.operation == 'CREATE' && has(object.spec.runAtOpen) && !has(object.spec.snapshot) && !has(object.spec.recordedAt))
{{- end }}

{{- define "reversi.outcomeMatch" -}}
request.operation != 'UPDATE' || !has(oldObject.spec.principal) || has(object.spec.resolution) != has(oldObject.spec.resolution) || !has(object.spec.principal) || has(object.spec.snapshot) != has(oldObject.spec.snapshot) || has(object.spec.recordedAt) != has(oldObject.spec.recordedAt) || (has(object.metadata.labels) ? object.metadata.labels : {}) != (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}) || (has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) != (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])
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
