{{/* Names, labels and the rendered job config of the elastic-supervisor chart. */}}

{{- define "es.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object name. 52 characters at most: the longest suffix the chart adds
("-leader") keeps names under 63, and ReplicaSet/Pod names add their own hashes.
*/}}
{{- define "es.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "es.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable for the release's life (a Deployment's selector is immutable). */}}
{{- define "es.selectorLabels" -}}
app.kubernetes.io/name: {{ include "es.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Labels of every object. part-of is always "elastic-supervisor": the ServiceMonitor takes the
Prometheus job name from it (jobLabel), and the alert rules match up{job="elastic-supervisor"}.
*/}}
{{- define "es.labels" -}}
helm.sh/chart: {{ include "es.chart" . }}
{{ include "es.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: elastic-supervisor
elastic-supervisor/job: {{ include "es.job" . | quote }}
{{- end -}}

{{- define "es.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "es.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "es.tokenSecretName" -}}
{{- default (printf "%s-token" (include "es.fullname" .)) .Values.token.existingSecret -}}
{{- end -}}

{{- define "es.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "es.workerImage" -}}
{{- $repo := default .Values.image.repository .Values.workers.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.workers.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* Where the controller reads the job token (the Secret's volume). */}}
{{- define "es.tokenDir" -}}/var/run/secrets/elastic-supervisor{{- end -}}

{{/*
Checks the schema cannot express (they cross fields); supervisor/config.py makes the same
checks at startup, this only says it at install time.
*/}}
{{- define "es.validate" -}}
{{- $c := .Values.config -}}
{{- if lt (int $c.nodes.max) (int $c.nodes.min) -}}
{{- fail (printf "config.nodes.max: %v is below config.nodes.min %v" $c.nodes.max $c.nodes.min) -}}
{{- end -}}
{{- $hb := default dict $c.heartbeat -}}
{{- $interval := default 1.0 $hb.interval_s | float64 -}}
{{- $timeout := default 5.0 $hb.timeout_s | float64 -}}
{{- if lt $timeout (mulf 2 $interval) -}}
{{- fail (printf "config.heartbeat.timeout_s: %v must be >= 2 x interval_s (%v)" $timeout (mulf 2 $interval)) -}}
{{- end -}}
{{- if eq (include "es.name" .) "elastic-supervisor-worker" -}}
{{- fail "nameOverride: elastic-supervisor-worker is the worker pods' app.kubernetes.io/name; the controller's Service would select them" -}}
{{- end -}}
{{- $p := .Values.persistence -}}
{{- $owned := dict -}}
{{- range $key := list "checkpoints" "logs" -}}
{{- $v := index $p $key -}}
{{- if $v.existingClaim -}}{{- $_ := set $owned $v.mountPath (printf "persistence.%s.mountPath" $key) -}}{{- end -}}
{{- end -}}
{{- if .Values.workers.shmSize -}}{{- $_ := set $owned "/dev/shm" "workers.shmSize" -}}{{- end -}}
{{- $tspec := (default dict (default dict .Values.workers.podTemplate).spec) -}}
{{- range $i, $c := (default list $tspec.containers) -}}
{{- if eq $c.name "agent" -}}
{{- range $j, $m := (default list $c.volumeMounts) -}}
{{- if hasKey $owned $m.mountPath -}}
{{- fail (printf "workers.podTemplate.spec.containers[%d].volumeMounts[%d].mountPath: %s is owned by the controller (%s)" $i $j $m.mountPath (get $owned $m.mountPath)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $key := list "containers" "initContainers" "volumes" -}}
{{- $seen := dict -}}
{{- range $i, $item := (default list (get $tspec $key)) -}}
{{- if hasKey $seen $item.name -}}
{{- fail (printf "workers.podTemplate.spec.%s[%d].name: %q appears twice (the items are merged by name)" $key $i $item.name) -}}
{{- end -}}
{{- $_ := set $seen $item.name true -}}
{{- end -}}
{{- end -}}
{{- if eq (int .Values.service.httpPort) (int .Values.service.heartbeatPort) -}}
{{- fail (printf "service.heartbeatPort: %v is the HTTP port too; give them different numbers" .Values.service.heartbeatPort) -}}
{{- end -}}
{{- $g := .Values.workers.gang -}}
{{- if and (eq $g.mode "kueue") (not $g.queue) -}}
{{- fail "workers.gang.queue: required with mode kueue (the LocalQueue the pods are queued in)" -}}
{{- end -}}
{{- if and $g.queue (not (has $g.mode (list "kueue" "volcano"))) -}}
{{- fail (printf "workers.gang.queue: only with mode kueue or volcano (mode is %s)" $g.mode) -}}
{{- end -}}
{{- if and $g.priorityClassName (ne $g.mode "volcano") -}}
{{- fail (printf "workers.gang.priorityClassName: only with mode volcano (mode is %s)" $g.mode) -}}
{{- end -}}
{{- if and $g.schedulerName (not (has $g.mode (list "volcano" "coscheduling"))) -}}
{{- fail (printf "workers.gang.schedulerName: only with mode volcano or coscheduling (mode is %s)" $g.mode) -}}
{{- end -}}
{{- if and (ne $g.mode "none") (eq .Values.workers.rendezvous "ip") (not (and .Values.rbac.nodeReads (dig "spec" "hostNetwork" false .Values.workers.podTemplate))) -}}
{{- fail (printf "workers.gang.mode: %s admits the gang only once every pod exists, and with workers.rendezvous ip the pods after the first are made once it has an IP: use rendezvous dns (or host-network pods with rbac.nodeReads)" $g.mode) -}}
{{- end -}}
{{- $le := .Values.leaderElection -}}
{{- if not (lt (float64 $le.renewDeadlineSeconds) (float64 $le.leaseDurationSeconds)) -}}
{{- fail (printf "leaderElection.renewDeadlineSeconds: %v must be under leaseDurationSeconds (%v)" $le.renewDeadlineSeconds $le.leaseDurationSeconds) -}}
{{- end -}}
{{- end -}}

{{/*
The job config (supervisor/config.py's JobConfig) the controller runs: the user's `config`
with the cluster-dependent keys set by the chart. `platform.kubernetes` is read by the
Kubernetes platform (supervisor/platforms/kube/; docs/kubernetes.md). owner_config_map is the
owner of the objects the platform creates (the worker pods, the headless Service): `helm
uninstall` deletes it and Kubernetes' garbage collector the rest. token_secret is the chart's
token Secret: the pods read it by secretKeyRef, so the platform writes no Secret of its own.
*/}}
{{/*
The job's name: config.job, or the release's name when it is empty (the default), so that two
releases in one namespace are two jobs. A release name past 40 characters keeps its head and
ends in a hash of the whole name (never a truncation that two releases could share).
*/}}
{{- define "es.job" -}}
{{- $job := default .Release.Name .Values.config.job -}}
{{- if gt (len $job) 40 -}}
{{- printf "%s-%s" ($job | trunc 31 | trimSuffix "-") ($job | sha256sum | trunc 8) -}}
{{- else -}}
{{- $job -}}
{{- end -}}
{{- end -}}

{{- define "es.jobConfig" -}}
{{- $fullname := include "es.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $p := .Values.persistence -}}
{{- $w := .Values.workers -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $_ := set $cfg "job" (include "es.job" .) -}}
{{- $worker := dict
      "image" (include "es.workerImage" .)
      "image_pull_policy" $w.image.pullPolicy
      "image_pull_secrets" (default list $w.imagePullSecrets)
      "service_account" $w.serviceAccountName
      "resources" (default dict $w.resources)
      "node_selector" (default dict $w.nodeSelector)
      "tolerations" (default list $w.tolerations)
      "priority_class_name" $w.priorityClassName
      "shm_size" $w.shmSize
      "labels" (default dict $w.podLabels)
      "annotations" (default dict $w.podAnnotations)
      "pod_template" (default dict $w.podTemplate) -}}
{{- $volumes := dict
      "checkpoints" (dict "claim_name" $p.checkpoints.existingClaim "sub_path" $p.checkpoints.subPath "mount_path" $p.checkpoints.mountPath)
      "logs" (dict "claim_name" $p.logs.existingClaim "sub_path" $p.logs.subPath "mount_path" $p.logs.mountPath) -}}
{{- $k8s := dict
      "namespace" $ns
      "service" $fullname
      "owner_config_map" (printf "%s-config" $fullname)
      "lease" (printf "%s-leader" $fullname)
      "token_secret" (dict "name" (include "es.tokenSecretName" .) "key" .Values.token.secretKey)
      "token_file" (printf "%s/%s" (include "es.tokenDir" .) .Values.token.secretKey)
      "node_reads" .Values.rbac.nodeReads
      "instance" .Release.Name
      "termination_grace_s" (int $w.terminationGracePeriodSeconds)
      "disruption_budget" $w.disruptionBudget
      "gang" (dict "mode" $w.gang.mode "queue" $w.gang.queue "priority_class" $w.gang.priorityClassName
               "scheduler_name" $w.gang.schedulerName)
      "lease_duration_s" (int .Values.leaderElection.leaseDurationSeconds)
      "renew_deadline_s" .Values.leaderElection.renewDeadlineSeconds
      "rendezvous" $w.rendezvous
      "volumes" $volumes
      "worker" $worker -}}
{{- $_ := set $cfg "platform" (dict "kind" "kubernetes" "host" (printf "%s.%s.svc" $fullname $ns) "kubernetes" $k8s
      "rendezvous_backend" $w.rendezvousBackend "static_rendezvous_nodes" $w.staticRendezvousNodes) -}}
{{- $_ := set $cfg "checkpoint_dir" $p.checkpoints.mountPath -}}
{{- $_ := set $cfg "log_dir" $p.logs.mountPath -}}
{{- $_ := set $cfg "http" (dict "host" .Values.listenHost "port" .Values.service.httpPort) -}}
{{- $_ := set $cfg "intake" (dict "host" .Values.listenHost "port" .Values.service.heartbeatPort) -}}
{{- toYaml $cfg -}}
{{- end -}}
