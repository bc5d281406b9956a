{{/*
Names. Kubernetes names are DNS-1123 labels (at most 63 characters); KubeRay adds 6 characters to a
RayJob's name to name its RayCluster and requires a DNS-1035 label of at most 47 characters.
*/}}
{{- define "rl-orchestrator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rl-orchestrator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The RayJob's name: the full name cut to 47 characters; it must start with a letter (DNS-1035). */}}
{{- define "rl-orchestrator.rayJobName" -}}
{{- $n := include "rl-orchestrator.fullname" . | trunc 47 | trimSuffix "-" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $n) -}}
{{- fail (printf "the RayJob name %q (from the release name or fullnameOverride) must start with a lowercase letter and hold only lowercase letters, digits and '-' (KubeRay: DNS-1035 label)" $n) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* "<fullname>-<suffix>", the full name cut so that the whole stays within 63 characters. */}}
{{- define "rl-orchestrator.suffixed" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "rl-orchestrator.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "rl-orchestrator.configMapName" -}}
{{- include "rl-orchestrator.suffixed" (list . "config") -}}
{{- end -}}

{{- define "rl-orchestrator.scrapeConfigMapName" -}}
{{- include "rl-orchestrator.suffixed" (list . "prometheus-scrape") -}}
{{- end -}}

{{- define "rl-orchestrator.sharedClaimName" -}}
{{- if .Values.shared.existingClaim -}}
{{- .Values.shared.existingClaim -}}
{{- else -}}
{{- include "rl-orchestrator.suffixed" (list . "shared") -}}
{{- end -}}
{{- end -}}

{{- define "rl-orchestrator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rl-orchestrator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "rl-orchestrator.labels" -}}
{{ include "rl-orchestrator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "rl-orchestrator.image" -}}
{{- $repo := required "image.repository is required: an image with Ray, vLLM and rl-orchestrator installed" .Values.image.repository -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Absolute paths on the shared volume: run.output_dir, checkpoint.dir, weight_sync.disk.path, and the
model cache. Returns a YAML dict {outputDir, checkpointDir, weightSyncDir, modelCacheDir}.
*/}}
{{- define "rl-orchestrator.paths" -}}
{{- $runName := include "rl-orchestrator.runName" . -}}
{{- $shared := .Values.shared.mountPath | trimSuffix "/" -}}
{{- $out := default (printf "%s/runs/%s" $shared $runName) .Values.paths.outputDir | trimSuffix "/" -}}
{{- $paths := dict "outputDir" $out
    "checkpointDir" (default (printf "%s/checkpoints" $out) .Values.paths.checkpointDir)
    "weightSyncDir" (default (printf "%s/weight_sync" $out) .Values.paths.weightSyncDir)
    "modelCacheDir" (default (printf "%s/cache" $shared) .Values.paths.modelCacheDir) -}}
{{- range $key, $p := $paths -}}
{{- if not (hasPrefix "/" $p) -}}
{{- fail (printf "paths.%s=%q must be an absolute path (on the shared volume, mounted at shared.mountPath)" $key $p) -}}
{{- end -}}
{{- end -}}
{{- toYaml $paths -}}
{{- end -}}

{{/* orchestrator.config merged over the preset (YAML text). */}}
{{- define "rl-orchestrator.mergedConfig" -}}
{{- $base := dict -}}
{{- with .Values.orchestrator.preset -}}
{{- $text := $.Files.Get (printf "presets/%s.yaml" .) -}}
{{- if not $text -}}
{{- fail (printf "orchestrator.preset=%q: no file presets/%s.yaml in the chart; use \"demo\" or \"\" (none)" . .) -}}
{{- end -}}
{{- $base = $text | fromYaml -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $base (deepCopy (.Values.orchestrator.config | default dict))) -}}
{{- end -}}

{{- define "rl-orchestrator.runName" -}}
{{- $run := dig "run" dict (include "rl-orchestrator.mergedConfig" . | fromYaml) -}}
{{- default (include "rl-orchestrator.fullname" .) (get $run "name") -}}
{{- end -}}

{{/*
The run config written to the ConfigMap: orchestrator.config with the chart's paths and metrics
settings filled in (YAML text).
*/}}
{{- define "rl-orchestrator.runConfig" -}}
{{- $cfg := include "rl-orchestrator.mergedConfig" . | fromYaml -}}
{{- range $section, $body := $cfg -}}
{{- if kindIs "map" $body -}}
{{- range $key, $_ := $body -}}
{{- if has $key (list "true" "false") -}}
{{- fail (printf "orchestrator.config.%s has a key %q: Helm reads YAML 1.1, where a bare n / y / no / yes / on / off key is a boolean; quote it, e.g. \"n\": 8" $section $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $paths := include "rl-orchestrator.paths" . | fromYaml -}}
{{- $run := dig "run" dict $cfg -}}
{{- $_ := set $run "name" (include "rl-orchestrator.runName" .) -}}
{{- $_ := set $run "output_dir" $paths.outputDir -}}
{{- $_ := set $cfg "run" $run -}}
{{- $ckpt := dig "checkpoint" dict $cfg -}}
{{- $_ := set $ckpt "dir" $paths.checkpointDir -}}
{{- $_ := set $cfg "checkpoint" $ckpt -}}
{{- $ws := dig "weight_sync" dict $cfg -}}
{{- $disk := dig "disk" dict $ws -}}
{{- $_ := set $disk "path" $paths.weightSyncDir -}}
{{- $_ := set $ws "disk" $disk -}}
{{- $_ := set $cfg "weight_sync" $ws -}}
{{- $model := dig "model" dict $cfg -}}
{{- if not (get $model "cache_dir") -}}
{{- $_ := set $model "cache_dir" $paths.modelCacheDir -}}
{{- end -}}
{{- $_ := set $cfg "model" $model -}}
{{- $metrics := dig "metrics" dict $cfg -}}
{{- if .Values.metrics.enabled -}}
{{- $_ := set $metrics "prometheus_port" (int .Values.metrics.controllerPort) -}}
{{- $_ := set $metrics "prometheus_host" "0.0.0.0" -}}
{{- end -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- if .Values.rolloutWorker.enabled -}}
{{- $placement := dig "placement" dict $cfg -}}
{{- $_ := set $placement "trainer_node_resource" (include "rl-orchestrator.trainerNodeResource" .) -}}
{{- $_ := set $cfg "placement" $placement -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The GRPO entrypoint: python -m orchestrator <config file> <overrides>, each override single-quoted
(a ' inside becomes '\'') so that the shell passes it as one argument. */}}
{{- define "rl-orchestrator.entrypoint" -}}
{{- $parts := list .Values.orchestrator.python "-m" "orchestrator" (printf "%s/run.yaml" (.Values.orchestrator.configMountPath | trimSuffix "/")) -}}
{{- range .Values.orchestrator.overrides -}}
{{- $parts = append $parts (printf "'%s'" (replace "'" "'\\''" .)) -}}
{{- end -}}
{{- join " " $parts -}}
{{- end -}}

{{/* Annotations every Ray pod carries for Prometheus (the conventional ones point at Ray's port). */}}
{{- define "rl-orchestrator.metricsAnnotations" -}}
{{- if .Values.metrics.enabled -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.ray.metricsPort | quote }}
prometheus.io/path: /metrics
{{- with .Values.metrics.podAnnotations }}
{{ toYaml . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A scalar value as text; whole numbers without an exponent (Helm reads every number as float64). */}}
{{- define "rl-orchestrator.scalar" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Environment of the Ray container: the `env` map (sorted by name), then extraEnv. */}}
{{- define "rl-orchestrator.env" -}}
{{- range $name, $value := .Values.env }}
- name: {{ $name | quote }}
  value: {{ include "rl-orchestrator.scalar" $value | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes shared by head and workers. */}}
{{- define "rl-orchestrator.volumes" -}}
- name: shared
  persistentVolumeClaim:
    claimName: {{ include "rl-orchestrator.sharedClaimName" . }}
- name: run-config
  configMap:
    name: {{ include "rl-orchestrator.configMapName" . }}
{{- with .Values.model.volume }}
- name: models
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .Values.data.volume }}
- name: data
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rl-orchestrator.volumeMounts" -}}
- name: shared
  mountPath: {{ .Values.shared.mountPath }}
- name: run-config
  mountPath: {{ .Values.orchestrator.configMountPath }}
  readOnly: true
- name: dshm
  mountPath: /dev/shm
{{- if .Values.model.volume }}
- name: models
  mountPath: {{ .Values.model.mountPath }}
  readOnly: {{ .Values.model.readOnly }}
{{- end }}
{{- if .Values.data.volume }}
- name: data
  mountPath: {{ .Values.data.mountPath }}
  readOnly: {{ .Values.data.readOnly }}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod-level settings common to head and workers. */}}
{{- define "rl-orchestrator.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.schedulerName }}
schedulerName: {{ . }}
{{- end }}
{{- end -}}
