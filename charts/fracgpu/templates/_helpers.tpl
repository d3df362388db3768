{{/* Chart name, truncated to a DNS label. */}}
{{- define "fracgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; the prefix of every object name (cluster-scoped ones included). */}}
{{- define "fracgpu.fullname" -}}
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

{{- define "fracgpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fracgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fracgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fracgpu.labels" -}}
helm.sh/chart: {{ include "fracgpu.chart" . }}
{{ include "fracgpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Component names, labels and selectors. */}}
{{- define "fracgpu.controller.fullname" -}}
{{- printf "%s-controller" (include "fracgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "fracgpu.kubeletPlugin.fullname" -}}
{{- printf "%s-kubelet-plugin" (include "fracgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "fracgpu.controller.selectorLabels" -}}
{{ include "fracgpu.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}
{{- define "fracgpu.kubeletPlugin.selectorLabels" -}}
{{ include "fracgpu.selectorLabels" . }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{- define "fracgpu.controller.serviceAccountName" -}}
{{- default (include "fracgpu.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- end }}
{{- define "fracgpu.kubeletPlugin.serviceAccountName" -}}
{{- default (include "fracgpu.kubeletPlugin.fullname" .) .Values.kubeletPlugin.serviceAccount.name }}
{{- end }}

{{- define "fracgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "fracgpu.deviceClassName" -}}
{{- default .Values.driverName .Values.deviceClass.name }}
{{- end }}

{{/* The extended resource a pod's resources.limits asks for whole GPUs by ("" when off). */}}
{{- define "fracgpu.extendedResourceName" -}}
{{- $er := .Values.deviceClass.extendedResource | default dict }}
{{- if $er.enabled }}{{ default (printf "%s/gpu" .Values.driverName) $er.name }}{{ end }}
{{- end }}

{{- define "fracgpu.enforcedDeviceClassName" -}}
{{- default (printf "enforced.%s" .Values.driverName) (.Values.deviceClass.enforced | default dict).name }}
{{- end }}

{{- define "fracgpu.migDeviceClassName" -}}
{{- default (printf "mig.%s" .Values.driverName) (.Values.deviceClass.mig | default dict).name }}
{{- end }}

{{- define "fracgpu.mpsDeviceClassName" -}}
{{- default (printf "mps.%s" .Values.driverName) (.Values.deviceClass.mps | default dict).name }}
{{- end }}
{{- define "fracgpu.mps.fullname" -}}
{{- printf "%s-mps" (include "fracgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fracgpu.webhookConfigName" -}}
{{- default .Values.driverName .Values.controller.webhook.configName }}
{{- end }}

{{- define "fracgpu.webhookServiceName" -}}
{{- printf "%s-webhook" (include "fracgpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where the node plugin sees the NVML library (LD_LIBRARY_PATH) and the host directory holding it. */}}
{{- define "fracgpu.nvmlDir" -}}/opt/fracgpu/nvml{{- end }}
{{- define "fracgpu.nvmlHostDir" -}}/opt/fracgpu/nvml-host{{- end }}

{{/* True when the node plugin mounts HAMi-core. */}}
{{- define "fracgpu.hamiCoreMounted" -}}
{{- if or (eq .Values.enforcement.mode "hami-core") .Values.enforcement.hamiCore.allowPerClaim }}true{{- end }}
{{- end }}

{{/* KUBERNETES_SERVICE_HOST/PORT overrides for both pods. */}}
{{- define "fracgpu.apiServerEnv" -}}
{{- if .Values.kubernetesServiceHost }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.kubernetesServiceHost | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ default 443 .Values.kubernetesServicePort | quote }}
{{- end }}
{{- end }}

{{/* Checks of value combinations the schema cannot express; fails rendering with a message. */}}
{{- define "fracgpu.validate" -}}
{{- if and (gt (int .Values.controller.replicas) 1) (not .Values.controller.leaderElection.enabled) }}
{{- fail "controller.replicas > 1 needs controller.leaderElection.enabled: without a leader every replica would write" }}
{{- end }}
{{- with .Values.controller.leaderElection }}
{{- if and .enabled (not (and (lt (float64 .retryPeriod) (float64 .renewDeadline)) (lt (float64 .renewDeadline) (float64 .leaseDuration)))) }}
{{- fail "controller.leaderElection: retryPeriod < renewDeadline < leaseDuration is required" }}
{{- end }}
{{- end }}
{{- if and .Values.kubernetesServicePort (not .Values.kubernetesServiceHost) }}
{{- fail "kubernetesServicePort is set but kubernetesServiceHost is not: set both to override the API server address" }}
{{- end }}
{{- $c := .Values.controller }}
{{- $ports := list (int $c.healthPort) }}
{{- if $c.webhook.enabled }}{{ $ports = append $ports (int $c.webhook.port) }}{{ end }}
{{- if $c.metricsPort }}{{ $ports = append $ports (int $c.metricsPort) }}{{ end }}
{{- if ne (len $ports) (len (uniq $ports)) }}
{{- fail (printf "controller.healthPort, controller.webhook.port and controller.metricsPort must differ (got %v)" $ports) }}
{{- end }}
{{- if and $c.hostNetwork .Values.kubeletPlugin.hostNetwork .Values.kubeletPlugin.metricsPort (has (int .Values.kubeletPlugin.metricsPort) $ports) }}
{{- fail (printf "kubeletPlugin.metricsPort %v is also a controller port; with both on the host network they would clash on a node running both" .Values.kubeletPlugin.metricsPort) }}
{{- end }}
{{- if and (eq .Values.enforcement.mode "nvml") (ne .Values.driverEdits "toolkit") }}
{{- fail "enforcement.mode nvml needs driverEdits: toolkit: the node plugin installs NVIDIA's nvidia-cdi-hook (which applies the limit) with the driver edits" }}
{{- end }}
{{- if and ((.Values.deviceClass.enforced | default dict).create) (eq .Values.enforcement.mode "none") }}
{{- fail "deviceClass.enforced.create with enforcement.mode none would select enforcing GPUs whose claims then get no enforcement: use mode auto (or a tier)" }}
{{- end }}
{{- $mig := splitList "," (nospace (.Values.mig | default dict).gpus) | compact }}
{{- $mps := splitList "," (nospace .Values.mps.gpus) | compact }}
{{- range $mig }}
{{- if or (has . $mps) (and (eq . "all") $mps) (and (has "all" $mps) $mig) }}
{{- fail (printf "mig.gpus and mps.gpus both name GPU %s: a MIG GPU is never an MPS GPU; name each GPU in at most one of them" .) }}
{{- end }}
{{- end }}
{{- $er := include "fracgpu.extendedResourceName" . }}
{{- if or (contains "kubernetes.io/" $er) (hasPrefix "requests." $er) }}
{{- fail (printf "deviceClass.extendedResource.name %q is not an extended resource name: the kubernetes.io domains and the requests. prefix are reserved; use a domain of your own such as gpu.fracgpu.dev/gpu" $er) }}
{{- end }}
{{- if not (hasPrefix "/" .Values.enforcement.hamiCore.libraryPath) }}
{{- fail "enforcement.hamiCore.libraryPath must be an absolute host path" }}
{{- end }}
{{- end }}

{{/* The Secret the controller replicas share their webhook certificate in (the first replica creates it). */}}
{{- define "fracgpu.webhookCertSecretName" -}}
{{- printf "%s-webhook-cert" (include "fracgpu.controller.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
