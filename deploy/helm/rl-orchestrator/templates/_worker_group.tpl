{{/*
One worker group of the RayCluster (rayjob.yaml): (dict "root" $ "w" <the group's values: worker or rolloutWorker>
"component" <the pods' app.kubernetes.io/component> "params" <rayStartParams the chart adds>).
*/}}
{{- define "rl-orchestrator.workerGroup" -}}
{{- $root := .root -}}
{{- $w := .w -}}
{{- $component := .component -}}
{{- $params := .params -}}
- groupName: {{ $w.groupName }}
  replicas: {{ int $w.replicas }}
  {{- if $root.Values.autoscaler.enabled }}
  minReplicas: {{ int ($w.minReplicas | default $w.replicas) }}
  maxReplicas: {{ int ($w.maxReplicas | default $w.replicas) }}
  {{- else }}
  minReplicas: {{ int $w.replicas }}
  maxReplicas: {{ int $w.replicas }}
  {{- end }}
  rayStartParams:
    {{- $workerParams := merge (deepCopy $params) (dict "num-gpus" (toString (int $w.gpus)) "metrics-export-port" (toString $root.Values.ray.metricsPort)) $w.rayStartParams }}
    {{- range $k, $v := $workerParams }}
    {{ $k }}: {{ $v | toString | quote }}
    {{- end }}
  template:
    metadata:
      labels:
        {{- include "rl-orchestrator.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $component }}
        {{- with $w.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $workerAnnotations := include "rl-orchestrator.metricsAnnotations" $root | fromYaml | merge (deepCopy $w.annotations) }}
      {{- with $workerAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      {{- with include "rl-orchestrator.podCommon" $root | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      containers:
        - name: ray-worker
          image: {{ include "rl-orchestrator.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          {{- if $root.Values.metrics.enabled }}
          ports:
            - {name: metrics, containerPort: {{ int $root.Values.ray.metricsPort }}}
          {{- end }}
          {{- $env := include "rl-orchestrator.env" $root | trim }}
          {{- if $env }}
          env:
            {{- $env | nindent 12 }}
          {{- end }}
          {{- $resources := deepCopy ($w.resources | default dict) }}
          {{- if gt (int $w.gpus) 0 }}
          {{- $gpu := dict $w.gpuResourceName (int $w.gpus) }}
          {{- $_ := set $resources "limits" (merge $gpu (get $resources "limits" | default dict)) }}
          {{- $_ := set $resources "requests" (merge (deepCopy $gpu) (get $resources "requests" | default dict)) }}
          {{- end }}
          {{- with $resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            {{- include "rl-orchestrator.volumeMounts" $root | nindent 12 }}
          {{- with $w.drainOnStop }}
          {{- if .enabled }}
          lifecycle:  # docs/elastic.md "A node drained": the run's engines here leave between steps first
            preStop:
              exec:
                command:
                  - sh
                  - -c
                  - {{ printf "%s -m orchestrator drain --address \"$FQ_RAY_IP:%d\" --host \"$(hostname)\" --deadline-s %d --wait --reason-message \"pod $(hostname) is stopping\"" $root.Values.orchestrator.python (int $root.Values.ray.gcsPort) (int .deadlineSeconds) | quote }}
          {{- end }}
          {{- end }}
      {{- if $w.drainOnStop.enabled }}
      terminationGracePeriodSeconds: {{ add (int $w.drainOnStop.deadlineSeconds) 30 }}
      {{- end }}
      volumes:
        {{- include "rl-orchestrator.volumes" $root | nindent 8 }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $w.shmSizeLimit }}
      {{- with $w.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $w.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $w.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* The custom resource the trainer's worker group advertises when the rolloutWorker group is on (the run's
placement.trainer_node_resource, set by the chart unless the config sets it). */}}
{{- define "rl-orchestrator.trainerNodeResource" -}}
{{- $placement := dig "placement" dict (include "rl-orchestrator.mergedConfig" . | fromYaml) -}}
{{- $name := get $placement "trainer_node_resource" | default "rl_orch_trainer_node" -}}
{{- range .Values.orchestrator.overrides | default list -}}
{{- if hasPrefix "placement.trainer_node_resource=" . -}}
{{- $name = trimPrefix "placement.trainer_node_resource=" . -}}
{{- end -}}
{{- end -}}
{{- $name -}}
{{- end -}}
