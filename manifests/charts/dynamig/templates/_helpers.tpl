{{/* The release namespace: where the scheduler, the device plugins and the webhook run. */}}
{{- define "dynamig.namespace" -}}
{{ .Release.Namespace }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "dynamig.labels" -}}
app.kubernetes.io/part-of: dynamig
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* An image reference: (dict "image" .Values.images.X "root" $ ["perMinor" true]). perMinor:
the image is built once per Kubernetes minor (the scheduler), and the tag ends in the cluster's:
0.1.0-k8s1.37. Chart.yaml's kubeVersion refuses a cluster of a minor dynamig is not built for. */}}
{{- define "dynamig.image" -}}
{{- $registry := .root.Values.global.imageRegistry -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- if .perMinor -}}
{{- $kube := .root.Capabilities.KubeVersion -}}
{{- $tag = printf "%s-k8s%s.%s" $tag $kube.Major (regexFind "^[0-9]+" $kube.Minor) -}}
{{- end -}}
{{- if $registry -}}
{{ printf "%s/%s:%s" $registry .image.repository $tag }}
{{- else -}}
{{ printf "%s:%s" .image.repository $tag }}
{{- end -}}
{{- end }}

{{/* imagePullSecrets of a pod spec, from global.imagePullSecrets: names or {name: ...} entries. */}}
{{- define "dynamig.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
- name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The user name a component's service account authenticates as: (dict "root" $ "sa" NAME). */}}
{{- define "dynamig.user" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ .sa }}
{{- end }}

{{/* The CEL condition "this container list asks for the GPU resource" (policy and webhook). */}}
{{- define "dynamig.asksForGPU" -}}
(object.spec.containers + object.spec.?initContainers.orValue([])).exists(c,
  '{{ .Values.resourceName }}' in c.?resources.?limits.orValue({}) ||
  '{{ .Values.resourceName }}' in c.?resources.?requests.orValue({}))
{{- end }}

{{/* The webhook's condition: asksForGPU, or a regular container asking for GPU memory or
cores in its limits, which the webhook gives the device config's defaultGPUNum devices. */}}
{{- define "dynamig.asksForGPUOrShare" -}}
{{ include "dynamig.asksForGPU" . }} ||
object.spec.containers.exists(c, ['{{ .Values.resourceMem }}', '{{ .Values.resourceMemPercentage }}', '{{ .Values.resourceCores }}'].exists(r,
  r in c.?resources.?limits.orValue({})))
{{- end }}

{{/* Whether the scheduler runs with the Workload API's gang scheduling, "true" or "false", from
scheduler.gangScheduling: auto is on where the cluster serves scheduling.k8s.io/v1beta1
PodGroups (1.37 and later); true before 1.37 is refused, the Workload API being alpha there. */}}
{{- define "dynamig.gangScheduling" -}}
{{- $v := toString .Values.scheduler.gangScheduling -}}
{{- $kube := .Capabilities.KubeVersion -}}
{{- $minor := regexFind "^[0-9]+" $kube.Minor | atoi -}}
{{- if eq $v "auto" -}}
{{- and (ge $minor 37) (.Capabilities.APIVersions.Has "scheduling.k8s.io/v1beta1/PodGroup") -}}
{{- else if eq $v "true" -}}
{{- if lt $minor 37 -}}
{{- fail (printf "scheduler.gangScheduling: true needs Kubernetes 1.37 or later, where the Workload API is beta; this cluster is %s: set auto or false" $kube.Version) -}}
{{- end -}}
true
{{- else if eq $v "false" -}}
false
{{- else -}}
{{- fail (printf "scheduler.gangScheduling: %q: must be auto, true or false" $v) -}}
{{- end -}}
{{- end }}
